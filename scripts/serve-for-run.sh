# Sourced by the scripts that run a load against `wgllm serve` (soak.sh,
# noisy-neighbour.sh): `serve_for_run ARGS...` builds wgllm, starts `wgllm serve -m
# $model ARGS...` on a free loopback port with its log in a fresh folder, waits until it
# answers /health, and sets `port`, `pid` and `dir` (the server is stopped and the folder
# removed when the script exits). The model: $WGLLM_SOAK_MODEL, or SmolLM2.
serve_for_run() {
  model=${WGLLM_SOAK_MODEL:-$(scripts/fetch-models.sh)}
  cargo build --release --quiet
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
  dir=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  target/release/wgllm serve -m "$model" --host 127.0.0.1 --port "$port" "$@" \
    >"$dir/server.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 $pid 2>/dev/null || { cat "$dir/server.log"; exit 1; }
    sleep 1
  done
  echo "error: the server did not answer /health within 600 s ($dir/server.log)" >&2
  exit 1
}
