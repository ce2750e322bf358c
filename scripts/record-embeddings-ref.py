#!/usr/bin/env python3
"""Records llama-server's embeddings of a model (its `--embeddings` mode, the CPU build of
../shared/tools/llamacpp-ref) for tests/embeddings.rs: for each pooling, each text's
embedding with no normalisation (`embd_normalize: -1`) and llama-server's token ids.

    scripts/record-embeddings-ref.py MODEL OUT.json

LLAMACPP_REF: where build.sh put llama.cpp (default ~/.cache/llamacpp-ref)."""
import hashlib, json, os, socket, subprocess, sys, time, urllib.request

TEXTS = [
    "I believe the meaning of life is",
    "hello world",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "Ein kleiner Test: äöü, 12345, {json: true}",
]
POOLINGS = ["mean", "last", "cls"]


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
    for pooling in POOLINGS:
        port = free_port()
        p = subprocess.Popen(
            [server, "-m", model, "--embeddings", "--pooling", pooling, "-c", "512",
             "-ngl", "0", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except Exception:
                    time.sleep(0.2)
            for text in TEXTS:
                tokens = post(port, "/tokenize", {"content": text, "add_special": True})["tokens"]
                r = post(port, "/embedding", {"content": text, "embd_normalize": -1})
                cases.append({
                    "pooling": pooling,
                    "text": text,
                    "tokens": tokens,
                    "embedding": r[0]["embedding"][0],
                })
        finally:
            p.terminate()
            p.wait()
    json.dump({"model_sha256": sha, "cases": cases}, open(out, "w"))
    print(f"{len(cases)} embeddings written to {out}")


if __name__ == "__main__":
    main()
