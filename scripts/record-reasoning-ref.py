#!/usr/bin/env python3
"""Records how llama-server splits a chat reply's thinking from its answer, for
tests/reasoning.rs: for each model and request, the `content` and `reasoning_content` of
the reply, streamed (the deltas joined) and not, and the Responses output items of the
first request of each template.

    scripts/record-reasoning-ref.py OUT.json SYNTH_MODEL SMOLLM2_MODEL TEMPLATES_DIR

SYNTH_MODEL is a tiny random-weight model with Qwen's vocabulary and Qwen 3's `<think>`
and `</think>` tokens (tests/server.rs writes it: `wgllm synth --arch qwen3 --shape tiny
--type q8_0 --vocab-from ggml-vocab-qwen2.gguf`, then `wgllm synth --add-tokens-to` it
with `--tokens '<think>,</think>' --token-type user`), served with each real template of TEMPLATES_DIR (llama.cpp's
models/templates) by `--chat-template-file`; SmolLM2 is served with its own template, which
has no thinking. The replies are held to fixed texts by a grammar, so what is compared is
the split alone, not the random model's choices.
LLAMACPP_REF: where build.sh put llama.cpp (default ~/.cache/llamacpp-ref)."""
import hashlib, json, os, sys, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_server_ref import post, start  # noqa: E402

SERVER_ARGS = ["-c", "1024", "-np", "1", "-ngl", "0", "--jinja"]
QWEN_REPLY = "<think>\nI think.\n</think>\n\nHello!"
OSS_REPLY = ("<|channel|>analysis<|message|>Thinking it over.<|end|>"
             "<|start|>assistant<|channel|>final<|message|>Hello!")


def grammar(text):
    return "root ::= " + json.dumps(text)


# For each template: (name, extra body fields, the reply the grammar forces).
CASES = {
    "qwen3": [
        ("tags", {}, QWEN_REPLY),
        ("tags-none", {"reasoning_format": "none"}, QWEN_REPLY),
        ("unclosed", {}, "<think>\nStill thinking"),
        ("no-tags", {}, "  Hello there"),
        ("off", {"chat_template_kwargs": {"enable_thinking": False}}, "Hello!"),
        ("off-none", {"chat_template_kwargs": {"enable_thinking": False},
                      "reasoning_format": "none"}, "Hello!"),
        ("effort-none", {"reasoning_effort": "none"}, "Hello!"),
    ],
    "deepseek-r1": [
        ("prefilled", {}, "I think.\n</think>\n\nHello!"),
        ("prefilled-none", {"reasoning_format": "none"}, "I think.\n</think>\n\nHello!"),
        ("unclosed", {}, "Still thinking"),
        # A budget of 0 forces the message and the closing tag at once, whatever the
        # model: `max_tokens` is set to their token count (no grammar).
        ("budget-0", {"reasoning_budget_tokens": 0,
                      "reasoning_budget_message": "Enough thinking."}, None),
    ],
    "gpt-oss": [
        ("channels", {}, OSS_REPLY),
        ("channels-none", {"reasoning_format": "none"}, OSS_REPLY),
    ],
    "smollm2": [
        ("no-thinking", {}, QWEN_REPLY),
    ],
    "ministral-reasoning": [
        ("tags", {}, "[THINK]I think.[/THINK]Hello!"),
        ("tags-none", {"reasoning_format": "none"}, "[THINK]I think.[/THINK]Hello!"),
        ("unclosed", {}, "[THINK]Still thinking"),
    ],
    "seed-oss": [
        ("tags", {}, "<seed:think>I think.</seed:think>Hello!"),
        ("tags-none", {"reasoning_format": "none"}, "<seed:think>I think.</seed:think>Hello!"),
    ],
    "gemma4": [
        ("tags", {}, "<|channel>thought\nI think.<channel|>Hello!"),
        ("tags-none", {"reasoning_format": "none"}, "<|channel>thought\nI think.<channel|>Hello!"),
        ("no-tags", {}, "Hello there"),
    ],
}
MESSAGES = [{"role": "user", "content": "Say hello."}]


def stream(port, path, body):
    """The deltas of a streamed chat reply, joined: (content, reasoning_content)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(dict(body, stream=True)).encode(),
        headers={"Content-Type": "application/json"})
    content, reasoning = "", ""
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for ch in json.loads(line[6:]).get("choices", []):
                d = ch.get("delta", {})
                content += d.get("content") or ""
                reasoning += d.get("reasoning_content") or ""
    return content, reasoning


TEMPLATES = {
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "gpt-oss": "openai-gpt-oss-120b.jinja",
    "smollm2": None,
    "ministral-reasoning": "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "seed-oss": "ByteDance-Seed-OSS.jinja",
    "gemma4": "google-gemma-4-31B-it.jinja",
}


def main():
    out, synth, smol, templates = sys.argv[1:5]
    sha = lambda path: hashlib.sha256(open(path, "rb").read()).hexdigest()
    record = {"models": {"synth": sha(synth), "smollm2": sha(smol)}, "templates": TEMPLATES,
              "cases": []}
    for name, template in TEMPLATES.items():
        args = ["-m", smol] if template is None else [
            "-m", synth, "--chat-template-file", os.path.join(templates, template)]
        p, port = start([*args, *SERVER_ARGS])
        try:
            for case, extra, text in CASES[name]:
                body = dict(extra, messages=MESSAGES, temperature=0.0, max_tokens=64)
                if text is not None:
                    body["grammar"] = grammar(text)
                else:
                    forced = [post(port, "/tokenize", {"content": t, "parse_special": True})
                              ["tokens"] for t in [extra["reasoning_budget_message"], "</think>"]]
                    body["max_tokens"] = sum(map(len, forced))
                msg = post(port, "/v1/chat/completions", body)["choices"][0]["message"]
                content, reasoning = stream(port, "/v1/chat/completions", body)
                entry = {
                    "model": name, "case": case, "body": body,
                    "content": msg.get("content"),
                    "reasoning_content": msg.get("reasoning_content"),
                    "stream_content": content, "stream_reasoning_content": reasoning,
                }
                # (llama-server's /v1/messages drops `grammar`, so its replies there are
                # the random model's own: Anthropic's blocks are not recorded.)
                if case in ("tags", "prefilled", "channels"):
                    entry["responses"] = [
                        {k: v for k, v in item.items() if k != "id"}
                        for item in post(port, "/v1/responses", dict(
                            extra, input="Say hello.", grammar=body["grammar"],
                            temperature=0.0, max_output_tokens=64))["output"]]
                record["cases"].append(entry)
        finally:
            p.terminate()
    json.dump(record, open(out, "w"), indent=1, ensure_ascii=False)
    open(out, "a").write("\n")


if __name__ == "__main__":
    main()
