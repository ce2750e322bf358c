#!/usr/bin/env python3
"""Same seed, same text: how long wgllm's sampled text stays equal to llama-completion's.

For each prompt and seed, runs llama-completion on llama.cpp's Vulkan backend (the same
device as wgllm: GGML_VK_VISIBLE_DEVICES=0 on lavapipe) and on its CPU backend, and
`wgllm run`, all at --temp 0.8 with that seed, and counts the characters each shares
with llama.cpp Vulkan's text from the start. llama.cpp's two backends differ in their
logits too, so they part at some draw: wgllm should keep the text about as long as
llama.cpp's CPU backend does. Prints a table and the medians.
  scripts/sampled-agreement.py [--model M] [--llamacpp DIR] [-n TOKENS]
"""
import argparse, os, statistics, subprocess, sys

PROMPTS = [
    "Once upon a time",
    "The history of the Roman Empire",
    "My favourite recipe for dinner is",
    "Here is a short poem about the sea:",
]
SEEDS = [42, 1234, 7]

ap = argparse.ArgumentParser()
ap.add_argument("--model")
ap.add_argument("--llamacpp", default=os.path.expanduser("~/.cache/llamacpp-ref/bin"))
ap.add_argument("-n", type=int, default=48)
ap.add_argument("--pairs", type=int, default=0, help="only the first N prompt/seed pairs (0: all)")
a = ap.parse_args()
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
model = a.model or subprocess.check_output([os.path.join(root, "scripts/fetch-models.sh")], text=True).strip()
wgllm = os.path.join(root, "target/release/wgllm")

def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {r.stderr.decode(errors='replace')[-2000:]}")
    return r.stdout.decode(errors="replace")

def llama(prompt, seed, gpu):
    cmd = [os.path.join(a.llamacpp, "llama-completion"), "-m", model, "-p", prompt, "-n", str(a.n),
           "--temp", "0.8", "-s", str(seed), "-no-cnv", "--no-display-prompt", "--no-warmup",
           "--simple-io", "-ngl", "99" if gpu else "0"]
    return run(cmd, {"GGML_VK_VISIBLE_DEVICES": "0"} if gpu else {"GGML_VK_VISIBLE_DEVICES": ""})

def ours(prompt, seed):
    return run([wgllm, "run", "-m", model, "-p", prompt, "-n", str(a.n), "--temp", "0.8", "-s", str(seed),
                "--no-display-prompt"])

def shared(x, y):
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n

pairs = [(p, s) for p in PROMPTS for s in SEEDS]
if a.pairs:
    pairs = pairs[:a.pairs]
rows = []
print("| prompt | seed | llama.cpp CPU vs Vulkan | wgllm vs llama.cpp Vulkan | wgllm vs llama.cpp CPU |")
print("|---|---:|---:|---:|---:|")
for p, s in pairs:
    vk, cpu, us = llama(p, s, True), llama(p, s, False), ours(p, s)
    r = (shared(cpu, vk), shared(us, vk), shared(us, cpu))
    rows.append(r)
    print(f"| {p[:32]} | {s} | {r[0]} | {r[1]} | {r[2]} |", flush=True)
med = [statistics.median(c) for c in zip(*rows)]
print(f"\nmedian shared characters over {len(rows)} prompt/seed pairs: llama.cpp CPU vs Vulkan {med[0]}, "
      f"wgllm vs llama.cpp Vulkan {med[1]}, wgllm vs llama.cpp CPU {med[2]}")
