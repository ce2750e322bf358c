#!/usr/bin/env python3
"""The server binary llama.cpp's server test suite starts (LLAMA_SERVER_BIN_PATH).

Its presets name Hugging Face models (`--hf-repo/--hf-file`, `--model-url`); this
swaps them for the local model in WGLLM_SUITE_MODEL (WGLLM_SUITE_FIM_MODEL for the infill
preset, whose model has fill-in-the-middle tokens; WGLLM_SUITE_BERT_MODEL for the BERT
embedding presets and WGLLM_SUITE_RERANK_MODEL for the reranker's; for the vision
preset, tinygemma3, WGLLM_SUITE_VISION_MODEL with WGLLM_SUITE_MMPROJ, its vision
encoder, which the Hugging Face registry would have fetched beside it) and runs
WGLLM_SUITE_SERVER. A server started with no model (the router preset) gets those files
as the Hugging Face cache entries its tests name, and no model flag:
either `wgllm` (run as `wgllm serve ARGS`) or a `llama-server` binary (run as is).
"""
import os
import sys

MODEL_FLAGS = {"--hf-repo", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--model", "-m"}

server = os.environ["WGLLM_SUITE_SERVER"]
model = os.environ["WGLLM_SUITE_MODEL"]
args = sys.argv[1:]


def seed_hub_cache():
    """The router preset starts a server with no model: it serves the Hugging Face cache,
    which the suite's session fixture would have filled with three tiny models. The same
    names stand for local files here, laid out as the cache lays them out."""
    cache = os.environ.get("LLAMA_CACHE")
    if not cache:
        return
    repos = {
        "ggml-org/tinygemma3-GGUF": [("tinygemma3-Q8_0.gguf", os.environ.get("WGLLM_SUITE_VISION_MODEL")),
                                     ("mmproj-tinygemma3-Q8_0.gguf", os.environ.get("WGLLM_SUITE_MMPROJ"))],
        "ggml-org/test-model-stories260K": [("stories260K-F32.gguf", model)],
        "ggml-org/test-model-stories260K-infill": [("stories260K-infill-F32.gguf", os.environ.get("WGLLM_SUITE_FIM_MODEL"))],
    }
    commit = "0" * 40
    for repo, files in repos.items():
        root = os.path.join(cache, "models--" + repo.replace("/", "--"))
        snap = os.path.join(root, "snapshots", commit)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(root, "refs"), exist_ok=True)
        with open(os.path.join(root, "refs", "main"), "w") as f:
            f.write(commit)
        for name, target in files:
            link = os.path.join(snap, name)
            if target and not os.path.lexists(link):
                os.symlink(os.path.abspath(target), link)


if not any(a in MODEL_FLAGS for a in args):
    seed_hub_cache()
    if os.path.basename(server).startswith("wgllm"):
        args = ["serve"] + args
    os.execv(server, [server] + args)

out = []
i = 0
while i < len(args):
    if args[i] in MODEL_FLAGS:
        name = args[i + 1] if i + 1 < len(args) else ""
        for part, var in [("infill", "WGLLM_SUITE_FIM_MODEL"), ("bert-bge", "WGLLM_SUITE_BERT_MODEL"),
                          ("reranker", "WGLLM_SUITE_RERANK_MODEL"), ("tinygemma3", "WGLLM_SUITE_VISION_MODEL")]:
            if part in name and os.environ.get(var):
                model = os.environ[var]
        if "tinygemma3" in name and os.environ.get("WGLLM_SUITE_MMPROJ"):
            out += ["--mmproj", os.environ["WGLLM_SUITE_MMPROJ"]]
        i += 2
        continue
    out.append(args[i])
    i += 1
out += ["--model", model]
if os.path.basename(server).startswith("wgllm"):
    out = ["serve"] + out
os.execv(server, [server] + out)
