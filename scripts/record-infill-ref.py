#!/usr/bin/env python3
"""Records llama-server's `/infill` answers on a model with FIM tokens (the CPU build of
../shared/tools/llamacpp-ref) for tests/infill.rs: for each request, the prompt it laid
out (as its reply's `prompt` text and token count) and its greedy tokens with the top
two probabilities of each, with and without `--spm-infill`.

    scripts/record-infill-ref.py MODEL OUT.json

The test's models are `wgllm synth --vocab-from ggml-vocab-starcoder.gguf --arch llama
--shape tiny --type q8_0 --trained-scale` (StarCoder's vocabulary has the prefix, suffix
and middle tokens) and the same with `--override-kv tokenizer.ggml.fim_rep_token_id=int:5
--override-kv tokenizer.ggml.fim_sep_token_id=int:6` (its `<repo_name>` and `<file_sep>`
as the repository tokens); tests/data/reference/infill.json holds this script's output
for each under "models", with its name and those overrides.
LLAMACPP_REF: where build.sh put llama.cpp (default ~/.cache/llamacpp-ref)."""
import hashlib, json, os, sys

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


def main():
    model, out = sys.argv[1], sys.argv[2]
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    cases = []
    for spm in [False, True]:
        p, port = start(["-m", model, *SERVER_ARGS] + (["--spm-infill"] if spm else []))
        try:
            for req in REQUESTS:
                body = dict(req, n_predict=8, temperature=0.0, return_tokens=True, n_probs=2,
                            cache_prompt=False)
                r = post(port, "/infill", body)
                cases.append({
                    "spm": spm,
                    "request": req,
                    "prompt": r["prompt"],
                    "tokens_evaluated": r["tokens_evaluated"],
                    "tokens": r["tokens"],
                    "top2": [[t["top_logprobs"][0]["logprob"], t["top_logprobs"][1]["logprob"]]
                             for t in r["completion_probabilities"]],
                })
        finally:
            p.terminate()
            p.wait()
    json.dump({"model_sha256": sha, "server_args": SERVER_ARGS, "cases": cases}, open(out, "w"),
              indent=1)
    print(f"{len(cases)} infill answers written to {out}")


if __name__ == "__main__":
    main()
