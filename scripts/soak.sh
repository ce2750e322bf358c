#!/usr/bin/env bash
# A long run of `wgllm serve` under a realistic mixed load, watching for leaks:
# -np 4 and a small context (-c 2048: 512 cells a slot) with context shift and a host
# prompt cache of 128 MiB, streamed
# chats that grow turn by turn (prompt-cache reuse) and run into the context's end
# (shifts), slot save and restore, and cancelled requests (clients that hang up), until
# TOKENS tokens were generated (default 100000). RSS and the GPU memory wgllm's buffers
# hold are sampled every INTERVAL seconds (default 60) and printed as a curve; fails if
# either grows after warm-up or any request other than the cancelled ones fails.
# Usage: scripts/soak.sh [TOKENS] [INTERVAL]   (model: SmolLM2, or WGLLM_SOAK_MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-100000}
interval=${2:-60}
. scripts/serve-for-run.sh
# The host prompt cache grows by design up to --cache-ram (llama-server's default: 8 GiB);
# a small one fills during warm-up, and soak.py judges RSS less the cache's bytes.
slots=$(mktemp -d)
serve_for_run -np 4 -c 2048 --context-shift --cache-ram 128 --slot-save-path "$slots" --metrics
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir" "$slots"' EXIT
python3 scripts/soak.py "$port" "$pid" "$tokens" "$interval"
