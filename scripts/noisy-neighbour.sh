#!/usr/bin/env bash
# One client's hostile requests against ordinary streamed chats on `wgllm serve`: the
# ordinary clients' token latency quiet and under attack, their failures (none allowed),
# the hostile requests' answers (each a clean 4xx or a bounded 200), and the server's
# peak RSS against a bound (scripts/noisy-neighbour.py says what is sent).
# Usage: scripts/noisy-neighbour.sh [ROUNDS] [RSS_BOUND_MIB]   (model: SmolLM2, or
# WGLLM_SOAK_MODEL; default 1 round, 2048 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1}
bound=${2:-2048}
. scripts/serve-for-run.sh
serve_for_run -np 3 -c 3072
python3 scripts/noisy-neighbour.py "$port" "$pid" "$rounds" "$bound"
