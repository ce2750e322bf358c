#!/usr/bin/env python3
"""Records llama-server's `/infill` answers on a model with FIM tokens (the CPU build of
../shared/tools/llamacpp-ref) for tests/infill.rs: for each request, the prompt it laid
out (as its reply's `prompt` text and token count) and its greedy tokens with the top
two probabilities of each, with and without `--spm-infill`.

    scripts/record-infill-ref.py MODEL OUT.json

The test's model is `wgllm synth --vocab-from ggml-vocab-starcoder.gguf --arch llama
--shape tiny --type q8_0 --trained-scale` (StarCoder's vocabulary has every FIM token).
LLAMACPP_REF: where build.sh put llama.cpp (default ~/.cache/llamacpp-ref)."""
import hashlib, json, os, socket, subprocess, sys, time, urllib.request

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main():
    model, out = sys.argv[1], sys.argv[2]
    ref = os.environ.get("LLAMACPP_REF", os.path.expanduser("~/.cache/llamacpp-ref"))
    server = os.path.join(ref, "bin", "llama-server")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ref, "bin"))
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    cases = []
    for spm in [False, True]:
        port = free_port()
        args = [server, "-m", model, *SERVER_ARGS, "--host", "127.0.0.1", "--port", str(port)]
        if spm:
            args.append("--spm-infill")
        p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except Exception:
                    time.sleep(0.2)
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
