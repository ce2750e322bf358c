#!/usr/bin/env python3
"""Records llama-server's `/rerank` answers (its `--reranking` mode, the CPU build of
../shared/tools/llamacpp-ref) for tests/server.rs: Jina-shaped and TEI-shaped requests
over a few documents, with and without top_n and return_text, and each prompt's tokens.

    scripts/record-rerank-ref.py MODEL OUT.json

LLAMACPP_REF: where build.sh put llama.cpp (default ~/.cache/llamacpp-ref)."""
import hashlib, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_server_ref import post, start  # noqa: E402

DOCUMENTS = [
    "A machine is a physical system that uses power to apply forces and control movement.",
    "Learning is the process of acquiring new understanding, knowledge and skills.",
    "Machine learning is a field of study in artificial intelligence.",
    "Paris, capitale de la France, est une grande ville européenne.",
    "x",
]
SERVER_ARGS = ["--reranking", "-c", "512", "-b", "512", "-ub", "512", "-np", "1"]
REQUESTS = [
    {"query": "Machine learning is", "documents": DOCUMENTS},
    {"query": "Which city?", "documents": DOCUMENTS[2:], "top_n": 2},
    {"query": "What is learning?", "texts": DOCUMENTS, "return_text": True},
    {"query": "", "texts": DOCUMENTS[:2], "top_n": 1},
]


def main():
    model, out = sys.argv[1], sys.argv[2]
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    p, port = start(["-m", model, *SERVER_ARGS, "-ngl", "0"])
    try:
        cases = [{"request": r, "response": post(port, "/rerank", r)} for r in REQUESTS]
    finally:
        p.terminate()
        p.wait()
    json.dump({"model_sha256": sha, "server_args": SERVER_ARGS, "cases": cases}, open(out, "w"),
              indent=1)
    print(f"{len(cases)} answers written to {out}")


if __name__ == "__main__":
    main()
