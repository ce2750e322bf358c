#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs into fuzz/seeds/<target>/ (small files, checked
in; rerun after changing this script). Each seed is a valid input of its kind, so the
fuzzer starts from what real inputs look like: GGUF files with a few hyperparameters,
a vocabulary and tensors; chat templates with messages; grammars and schemas with a
text; request bodies for each endpoint. The model seeds are written by `wgllm synth`:
   scripts/fuzz-seeds.py [WGLLM_BINARY]   (default target/release/wgllm)"""
import json
import subprocess
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "seeds")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# GGUF (version 3): typed metadata, then tensor infos, aligned tensor data.
U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == U32:
        return struct.pack("<I", v)
    if t == I32:
        return struct.pack("<i", v)
    if t == F32:
        return struct.pack("<f", v)
    if t == BOOL:
        return struct.pack("<B", int(v))
    if t == STR:
        return gstr(v)
    if t == U64:
        return struct.pack("<Q", v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)


def gguf(kv, tensors=()):
    """kv: [(key, type, value)]; tensors: [(name, dims, f32 values)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, t, v in kv:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    data = b""
    for name, dims, _ in tensors:
        out += gstr(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", 0, len(data))  # F32
        n = 1
        for d in dims:
            n *= d
        data += struct.pack(f"<{n}f", *[((i * 7) % 13 - 6) / 8 for i in range(n)])
        data += b"\0" * (-len(data) % 32)
    out += b"\0" * (-len(out) % 32)
    return out + data


def gpt2_vocab():
    # Byte-level BPE: printable bytes as themselves, a few merges, two control tokens.
    toks = [chr(c) for c in range(33, 127)] + ["Ġ", "Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>"]
    types = [1] * (len(toks) - 2) + [3, 3]
    merges = ["Ġ t", "h e", "Ġt he"]
    return [
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "smollm"),
        ("tokenizer.ggml.tokens", ARR, (STR, toks)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", U32, len(toks) - 2),
        ("tokenizer.ggml.eos_token_id", U32, len(toks) - 2),
        ("tokenizer.chat_template", STR, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\n{% endfor %}"),
    ]


def spm_vocab():
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "▁the", "he", "llo", "▁he"]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0]
    return [
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, toks)),
        ("tokenizer.ggml.scores", ARR, (F32, scores)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.add_space_prefix", BOOL, True),
    ]


def wpm_vocab():
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "##s", "hello", "world", "##ing", ","]
    return [
        ("tokenizer.ggml.model", STR, "bert"),
        ("tokenizer.ggml.tokens", ARR, (STR, toks)),
        ("tokenizer.ggml.token_type", ARR, (I32, [3, 2, 3, 3] + [1] * 6)),
        ("tokenizer.ggml.unknown_token_id", U32, 1),
        ("tokenizer.ggml.bos_token_id", U32, 2),
        ("tokenizer.ggml.seperator_token_id", U32, 3),
    ]


# Every architecture `wgllm synth` writes, at its micro shape (two layers of 32 wide, a
# few KiB of random q4_0 weights), with the GPT-2 or the SentencePiece vocabulary: the
# gguf target loads each and steps it on a device with no GPU (wgllm::fuzz::gguf).
SYNTH_ARCHS = ["llama", "llama3", "qwen2", "qwen2-yarn", "qwen2vl", "qwen2moe", "qwen3", "qwen3moe",
               "mixtral", "gpt-oss", "phi3", "phi3-long", "gemma2", "gemma3", "mamba",
               "mamba2", "lfm2", "bert", "bert-rank", "qwen3-rank"]
SPM_ARCHS = {"llama", "gemma2", "gemma3", "mamba"}


def synth_models(wgllm):
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        vocabs = {}
        for name, vocab in [("gpt2", gpt2_vocab()), ("spm", spm_vocab())]:
            vocabs[name] = os.path.join(tmp, name + ".gguf")
            with open(vocabs[name], "wb") as f:
                f.write(gguf(vocab))
        for arch in SYNTH_ARCHS:
            vocab = "spm" if arch in SPM_ARCHS else "gpt2"
            out = os.path.join(tmp, arch)
            experts = ["--experts", "2", "--experts-used", "1"] if arch in (
                "qwen2moe", "qwen3moe", "mixtral", "gpt-oss") else []
            subprocess.run([wgllm, "synth", "--arch", arch, "--shape", "micro", "--type", "q4_0",
                            *experts, "--vocab-from", vocabs[vocab], "-o", out],
                           check=True, stderr=subprocess.DEVNULL)
            with open(out, "rb") as f:
                put("gguf", f"synth-{arch}-{vocab}", f.read())


def main():
    wgllm = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "..", "target", "release", "wgllm")
    synth_models(wgllm)
    put("gguf", "metadata-only", gguf([("general.architecture", STR, "qwen2"), ("x.arr", ARR, (ARR, [(U32, [1, 2])]))]))

    texts = ["Hello the world, <|endoftext|> héllo\n\t  123", "hello worlds, the thing", "<s>▁the hello</s> ☃"]
    for name, vocab, text in zip(["gpt2", "spm", "wpm"], [gpt2_vocab(), spm_vocab(), wpm_vocab()], texts):
        g = gguf(vocab)
        put("tokenizer", name, struct.pack("<I", len(g)) + g + text.encode())

    msgs = json.dumps([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": "x"}}}]},
                       {"role": "tool", "content": "42", "tool_call_id": "c1"}])
    templates = {
        "chatml": "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}",
        "tools": "{% if tools %}{{ tools | tojson(indent=4) }}{% endif %}{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}{% else %}[{{ m.role | upper }}] {{ m.content | trim }}{% endif %}{% endfor %}",
        "python": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content.split(' ')|join('_') }}{{ (ns.n|string).zfill(3) }}{{ m.role.startswith('u') }}{{ strftime_now('%Y-%m-%d') }}{% endfor %}{{ bos_token }}{{ raise_exception('done') if messages|length > 9 }}",
    }
    # Lists built with `+` (guarded: tokenizer/jinja_limits.rs), a macro, `sum` over lists.
    templates["lists"] = "{% macro m(x) %}{{ x + [1] }}{% endmacro %}{% set ns = namespace(l=[], s='') %}{% for msg in messages %}{% if msg.role + '' == 'user' %}{% set ns.l = ns.l + [msg] %}{% else %}{% set ns.l = ns.l + ns.l %}{% endif %}{% set ns.s = ns.s + msg.content %}{% endfor %}{% set one = [ns.l] %}{{ m(ns.l)|length }}{{ (one * 3)|sum(start=[])|length }}{{ ns.s + ('x' * 3) }}{{ one * 2 + [3] }}"
    for name, t in templates.items():
        put("chat_template", name, t + "\0" + msgs)

    grammars = {
        "json-ish": ('root ::= "{" ws pair ("," ws pair)* "}"\npair ::= [a-z]+ ":" ws value\nvalue ::= [0-9]+ | "\\"" [^"]* "\\""\nws ::= [ \\t\\n]*', '{a: 1, bc: "x"}'),
        "repeats": ('root ::= ("ab"{2,3} [0-9]? | "c"+ ) "." .\n# comment', "ababab1.x"),
        "tokens": ('root ::= <[1]> "x" !<[2]>* [^\\x00-\\x1F]', "x"),
        "nested": ('root ::= ((("a" | "b")+ ("c" ("d")?)*)? "e")+', "abcde"),
    }
    for name, (g, text) in grammars.items():
        put("grammar", name, g + "\0" + text)

    schemas = {
        "object": ({"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 5},
                                                       "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                       "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
                    "required": ["name"], "additionalProperties": False}, '{"name": "Bo", "age": 7}'),
        "refs": ({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
                 "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}}}, '{"v": 1, "next": null}'),
        "strings": ({"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "pattern": "^[a-z]{2,4}(-[0-9]+)?$"},
                               {"type": "string", "format": "uuid"}, {"const": {"k": [1, True, None]}}]}, '"ab-12"'),
        "allof": ({"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                             {"properties": {"b": {"type": ["integer", "null"]}}}]}, '{"a": true, "b": 3}'),
    }
    for name, (s, text) in schemas.items():
        put("json_schema", name, json.dumps(s) + "\0" + text)

    # State files (wgllm's format, versions 4 and 5) for the fuzz model: 2 layers of K/V
    # width 32, vocabulary 64, a sliding-window pair of stores. The first byte: cache
    # types (bits 0-1: f16, f32, q8_0, q4_0) and whether one sequence is loaded (bit 2,
    # into sequence bits 3+ mod 4). Version 5 records what decided the cells: a model
    # fingerprint and each adapter's fingerprint and scale.
    def state(tokens, stores, seq_bits, version=4, adapters=()):
        out = b"WGLLMKV\0" + struct.pack("<I", version) + struct.pack("<3I", 2, 32, 64)
        if version >= 5:
            out += struct.pack("<QI", 0x0123456789ABCDEF, len(adapters))
            out += b"".join(struct.pack("<Qf", fp, scale) for fp, scale in adapters)
        out += struct.pack("<I", len(tokens)) + b"".join(struct.pack("<I", t) for t in tokens)
        out += struct.pack("<II", 1, 1)  # K and V as f16 (ggml id 1)
        out += struct.pack("<I", len(stores))
        for cells in stores:
            out += struct.pack("<I", len(cells))
            for pos, seqs in cells:
                out += struct.pack("<IQ", pos, seqs)
            for _ in range(2):  # one layer: K rows, then V rows, 32 f16 each
                out += b"".join(struct.pack("<32e", *[(p + i) / 64 for i in range(32)]) for p, _ in cells)
        return bytes([seq_bits]) + out
    toks = [5, 9, 17, 33, 2]
    put("state_file", "whole", state(toks, [[(i, 1) for i in range(5)], [(i, 1) for i in range(3, 5)]], 0))
    put("state_file", "shared-seqs", state(toks[:3], [[(0, 3), (1, 3), (2, 1)], [(1, 3), (2, 1)]], 0))
    put("state_file", "one-seq", state(toks, [[(i, 1) for i in range(5)], [(i, 1) for i in range(2, 5)]], 4 | (2 << 3)))
    put("state_file", "v5-adapters", state(toks, [[(i, 1) for i in range(5)], [(i, 1) for i in range(3, 5)]], 0,
                                           version=5, adapters=[(7, 1.0), (9, 0.5)]))

    # Request bodies: the first byte picks the endpoint (wgllm::server::bodies::Endpoint::ALL).
    bodies = [
        (0, "completion", {"prompt": ["Hello", [1, 2, 3]], "n_predict": 8, "temperature": 0.5, "stop": ["\n"],
                           "grammar": 'root ::= [a-z]+', "logit_bias": [[1, -1.0], ["Hi", False]], "n_probs": 2, "id_slot": 0}),
        (1, "oai-completion", {"prompt": "Once", "max_tokens": 4, "logprobs": 3, "response_format": {"type": "json_object"}}),
        (2, "chat", {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                     "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}],
                     "tool_choice": "required", "n": 1, "top_logprobs": 2, "logprobs": True}),
        (2, "chat-schema", {"messages": [{"role": "user", "content": "JSON"}, {"role": "assistant", "content": "{"}],
                            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}),
        (3, "anthropic", {"max_tokens": 16, "system": [{"type": "text", "text": "S"}], "stop_sequences": ["X"],
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                       {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}],
                          "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
        (4, "responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}], "instructions": "Be kind", "max_output_tokens": 5}),
        (5, "rerank", {"query": "What is it?", "documents": ["A cat.", "A dog <s> here."], "top_n": 1, "model": "m"}),
        (6, "tokenize", {"content": "Hello <|im_start|> world", "with_pieces": True, "add_special": True}),
        (7, "detokenize", {"tokens": [1, 2, 300, 49000]}),
        (8, "embeddings", {"input": ["a cat", [1, 2, 3]], "encoding_format": "base64", "embd_normalize": 1}),
        (9, "infill", {"input_prefix": "def f(", "input_suffix": "):\n    pass", "prompt": "x",
                       "input_extra": [{"filename": "a.py", "text": "import os"}], "n_predict": 8}),
    ]
    for which, name, body in bodies:
        put("server_request", name, bytes([which]) + json.dumps(body).encode())

    # Images: the vision tests' PNGs, and the same kind of picture as BMP and PNM.
    vision = os.path.join(ROOT, "..", "..", "tests", "data", "vision")
    for name in sorted(os.listdir(vision)):
        with open(os.path.join(vision, name), "rb") as f:
            put("image", name, f.read())
    w, h = 6, 4
    pixels = bytes((x * 40 + y * 7 + c * 90) % 256 for y in range(h) for x in range(w) for c in range(3))
    put("image", "gradient-6x4.ppm", b"P6\n%d %d\n255\n" % (w, h) + pixels)
    row = (w * 3 + 3) // 4 * 4
    bmp_rows = b"".join(
        bytes(v for x in range(w) for v in reversed(pixels[(y * w + x) * 3:(y * w + x) * 3 + 3])) + bytes(row - w * 3)
        for y in reversed(range(h)))
    put("image", "gradient-6x4.bmp", b"BM" + struct.pack("<IHHI", 54 + len(bmp_rows), 0, 0, 54)
        + struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(bmp_rows), 2835, 2835, 0, 0) + bmp_rows)

    # State files read through real memories (K/V, sliding-window pair, recurrent, hybrid)
    # of the micro models above, on the host-only device: written by the library itself.
    subprocess.run(["cargo", "run", "--release", "--quiet", "--example", "memory_state_seeds", "--",
                    os.path.join(ROOT, "memory_state")], check=True, cwd=os.path.join(ROOT, "..", ".."))


if __name__ == "__main__":
    sys.exit(main())
