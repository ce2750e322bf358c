#!/usr/bin/env python3
"""Records llama-server's `/infill` answers (the CPU build of ../shared/tools/llamacpp-ref)
for tests/server.rs: for each request, the prompt it laid out (as its reply's `prompt`
text and token count) and its greedy tokens with the top two of each (ids and
log-probabilities), with and without `--spm-infill`, on two models it writes with wgllm:

    scripts/record-infill-ref.py VOCAB OUT.json

VOCAB is llama.cpp's ggml-vocab-starcoder.gguf (StarCoder's vocabulary has the prefix,
suffix and middle tokens). The models are `wgllm synth --vocab-from VOCAB --arch llama
--shape tiny --type f32 --trained-scale` (f32 weights: no quantized products on either
side, so the logits agree closely enough that a random model's close choices compare)
and the same with `--override-kv tokenizer.ggml.fim_rep_token_id=int:5 --override-kv
tokenizer.ggml.fim_sep_token_id=int:6` (its `<repo_name>` and `<file_sep>` as the
repository tokens). tests/data/reference/infill.json is this script's output.
WGLLM: the wgllm binary (default target/release/wgllm). LLAMACPP_REF: where build.sh put
llama.cpp (default ~/.cache/llamacpp-ref)."""
import hashlib, json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_server_ref import post, start  # noqa: E402

# The server's sizes: small enough that the prefix, the suffix and the extra files are cut
# (the extra files by what the context leaves after a batch and twice the server's `-n`).
SERVER_ARGS = ["-c", "512", "-b", "64", "-ub", "64", "-np", "1", "-n", "16", "-ngl", "0"]
LONG = "".join(f"    x{i} = compute(x{i - 1}, {i});\n" for i in range(1, 40))
REQUESTS = [
    {"input_prefix": "#include <cstdio>\n#include \"llama.h\"\n\nint main() {\n",
     "prompt": "    int n_threads = llama_", "input_suffix": "}\n"},
    {"input_extra": [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}],
     "input_prefix": "#include <cstdio>\n#include \"llama.h\"\n\nint main() {\n",
     "prompt": "    int n_threads = llama_", "input_suffix": "}\n"},
    {"input_extra": [{"text": "def helper(a, b):\n    return a * b + 1\n"},
                     {"filename": "util/more.py", "text": LONG}],
     "input_prefix": "def main():\n" + LONG, "input_suffix": LONG + "    return x39\n"},
    {"input_prefix": ["def f(x):\n", 30, 31, "  <fim_middle> stays text\n"],
     "input_suffix": [10, "    return y\n"]},
]


SYNTH = ["--arch", "llama", "--shape", "tiny", "--type", "f32", "--trained-scale"]
MODELS = [("starcoder", []),
          ("starcoder-repo", ["tokenizer.ggml.fim_rep_token_id=int:5",
                              "tokenizer.ggml.fim_sep_token_id=int:6"])]


def record(model):
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    cases = []
    for spm in [False, True]:
        p, port = start(["-m", model, *SERVER_ARGS] + (["--spm-infill"] if spm else []))
        try:
            for req in REQUESTS:
                body = dict(req, n_predict=8, temperature=0.0, return_tokens=True, n_probs=2,
                            cache_prompt=False)
                r = post(port, "/infill", body)
                probs = r["completion_probabilities"]
                cases.append({
                    "spm": spm,
                    "request": req,
                    "prompt": r["prompt"],
                    "tokens_evaluated": r["tokens_evaluated"],
                    "tokens": r["tokens"],
                    "top2": [[t["top_logprobs"][0]["logprob"], t["top_logprobs"][1]["logprob"]]
                             for t in probs],
                    "top2_ids": [[t["top_logprobs"][0]["id"], t["top_logprobs"][1]["id"]]
                                 for t in probs],
                })
        finally:
            p.terminate()
            p.wait()
    return {"model_sha256": sha, "server_args": SERVER_ARGS, "cases": cases}


def main():
    vocab, out = sys.argv[1], sys.argv[2]
    wgllm = os.environ.get("WGLLM", "target/release/wgllm")
    models = []
    with tempfile.TemporaryDirectory() as d:
        for name, kvs in MODELS:
            path = os.path.join(d, name + ".gguf")
            args = [wgllm, "synth", "--vocab-from", vocab, *SYNTH, "-o", path]
            for kv in kvs:
                args += ["--override-kv", kv]
            subprocess.run(args, check=True, stderr=subprocess.DEVNULL)
            models.append(dict(record(path), name=name, override_kv=kvs, synth_args=SYNTH))
    json.dump({"recorded_by": "scripts/record-infill-ref.py", "models": models},
              open(out, "w"), indent=1)
    print(f"{sum(len(m['cases']) for m in models)} infill answers written to {out}")


if __name__ == "__main__":
    main()
