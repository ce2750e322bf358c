#!/usr/bin/env python3
"""Records how Python's jinja2 renders every chat template that llama.cpp ships, set up
the way Hugging Face transformers' `apply_chat_template` sets it up, into
tests/data/chat-templates/renders.json. tests/chat_templates.rs compares wgllm's renderer
with that record byte for byte, so CI needs neither Python nor jinja2.

    scripts/record-template-renders.py [TEMPLATES_DIR]

TEMPLATES_DIR defaults to the templates/ directory that scripts/fetch-llamacpp-tests.sh
prints. The conversation, BOS/EOS texts and clock below are fixed so the record is
deterministic; tests/chat_templates.rs uses the same values (keep them in step).

What transformers does, and this script repeats (checked against transformers 5.x,
utils/chat_template_utils.py):
  - ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
    loopcontrols extension and a `{% generation %}` block tag that renders its body (it
    only records assistant spans when asked for an assistant mask);
  - the `tojson` filter is json.dumps(x, ensure_ascii=False, indent, separators,
    sort_keys) instead of jinja2's HTML-escaping one;
  - globals raise_exception(message) -> TemplateError(message) and strftime_now(fmt);
  - render(messages=..., tools=None, documents=None, add_generation_prompt=...,
    **special_tokens_map): `tools` and `documents` are passed even when not given (as
    None), the special tokens (here only bos_token and eos_token) as strings.
"""

import datetime
import hashlib
import json
import os
import subprocess
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The fixed inputs (mirrored in tests/chat_templates.rs).
NOW = datetime.datetime(2026, 1, 15, 10, 30, 0)
BOS = "<s>"
EOS = "</s>"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Keep answers short."},
    {"role": "user", "content": 'What does "déjà vu" mean?'},
    {"role": "assistant", "content": 'It is French for "already seen": the feeling of having lived a moment before.'},
    {"role": "user", "content": "Thanks! Say it in one word — in Japanese?"},
]
ADD_GENERATION_PROMPT = True


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers' assistant-span tracker.
    Outside assistant-mask mode it renders its body unchanged, which is all a plain
    render sees, so the body's nodes are returned as they are."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return NOW.strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source):
    try:
        tpl = env.from_string(source)
        text = tpl.render(
            messages=json.loads(json.dumps(MESSAGES)),
            tools=None,
            documents=None,
            add_generation_prompt=ADD_GENERATION_PROMPT,
            bos_token=BOS,
            eos_token=EOS,
        )
        return {"text": text}
    except Exception as e:  # noqa: BLE001 - every failure is part of the record
        # TemplateSyntaxError's str() adds the line; its bare message is what a
        # renderer can be expected to share.
        msg = e.message if isinstance(e, jinja2.exceptions.TemplateSyntaxError) else str(e)
        return {"error": msg, "error_type": type(e).__name__}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) > 1:
        tdir = sys.argv[1]
    else:
        base = subprocess.check_output([os.path.join(root, "scripts", "fetch-llamacpp-tests.sh")], text=True)
        tdir = os.path.join(base.strip(), "templates")
    env = environment()
    out = {}
    for name in sorted(os.listdir(tdir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(tdir, name), "rb") as f:
            raw = f.read()
        entry = {"sha256": hashlib.sha256(raw).hexdigest()}
        entry.update(render(env, raw.decode("utf-8")))
        out[name] = entry
    dest = os.path.join(root, "tests", "data", "chat-templates", "renders.json")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "w", encoding="utf-8", newline="\n") as f:
        json.dump(
            {
                "jinja2": jinja2.__version__,
                "now": NOW.isoformat(),
                "bos_token": BOS,
                "eos_token": EOS,
                "add_generation_prompt": ADD_GENERATION_PROMPT,
                "messages": MESSAGES,
                "templates": out,
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")
    errors = sum(1 for e in out.values() if "error" in e)
    print(f"{dest}: {len(out)} templates, {errors} raised", file=sys.stderr)


if __name__ == "__main__":
    main()
