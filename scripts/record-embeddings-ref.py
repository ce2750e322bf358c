#!/usr/bin/env python3
"""Records llama-server's embeddings of a model (its `--embeddings` mode, the CPU build of
../shared/tools/llamacpp-ref) for tests/embeddings.rs: for each pooling, each text's
embedding with no normalisation (`embd_normalize: -1`) and llama-server's token ids.

    scripts/record-embeddings-ref.py MODEL OUT.json [POOLING,...]

POOLING: mean, last, cls (default all three).

LLAMACPP_REF: where build.sh put llama.cpp (default ~/.cache/llamacpp-ref)."""
import hashlib, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_server_ref import post, start  # noqa: E402

TEXTS = [
    "I believe the meaning of life is",
    "hello world",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "Ein kleiner Test: äöü, 12345, {json: true}",
]
POOLINGS = ["mean", "last", "cls"]


def main():
    model, out = sys.argv[1], sys.argv[2]
    poolings = sys.argv[3].split(",") if len(sys.argv) > 3 else POOLINGS
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    cases = []
    for pooling in poolings:
        p, port = start(["-m", model, "--embeddings", "--pooling", pooling, "-c", "512",
                         "-ngl", "0"])
        try:
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
