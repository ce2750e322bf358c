#!/usr/bin/env python3
"""The server binary llama.cpp's server test suite starts (LLAMA_SERVER_BIN_PATH).

Its presets name Hugging Face models (`--hf-repo/--hf-file`, `--model-url`); this
swaps them for the local model in WGLLM_SUITE_MODEL (WGLLM_SUITE_FIM_MODEL for the infill
preset, whose model has fill-in-the-middle tokens; WGLLM_SUITE_BERT_MODEL for the BERT
embedding presets and WGLLM_SUITE_RERANK_MODEL for the reranker's; for the vision
preset, tinygemma3, WGLLM_SUITE_VISION_MODEL with WGLLM_SUITE_MMPROJ, its vision
encoder, which the Hugging Face registry would have fetched beside it) and runs
WGLLM_SUITE_SERVER:
either `wgllm` (run as `wgllm serve ARGS`) or a `llama-server` binary (run as is).
"""
import os
import sys

MODEL_FLAGS = {"--hf-repo", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--model", "-m"}

server = os.environ["WGLLM_SUITE_SERVER"]
model = os.environ["WGLLM_SUITE_MODEL"]
args = sys.argv[1:]
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
