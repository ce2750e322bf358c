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
model=${WGLLM_SOAK_MODEL:-$(scripts/fetch-models.sh)}
cargo build --release --quiet
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
target/release/wgllm serve -m "$model" --host 127.0.0.1 --port "$port" -np 3 -c 3072 \
  >"$dir/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { cat "$dir/server.log"; exit 1; }
  sleep 1
done
python3 scripts/noisy-neighbour.py "$port" "$pid" "$rounds" "$bound"
