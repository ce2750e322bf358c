#!/usr/bin/env bash
# Aggregate serving speed, wgllm beside llama-server in one run: the same model, device
# (llama.cpp's Vulkan backend; on lavapipe it needs GGML_VK_VISIBLE_DEVICES=0, set here)
# and -np; C concurrent streaming clients (bounded) each send R requests of N tokens.
#   scripts/bench-serve.sh [-m MODEL] [-s LLAMA_SERVER] [-p NP] [-c CLIENTS] [-r REQS] [-n TOKENS]
# LLAMA_SERVER default: ~/.cache/llamacpp-ref/bin/llama-server (../shared/tools/llamacpp-ref/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
model="" ls="$HOME/.cache/llamacpp-ref/bin/llama-server" np=8 clients=64 reqs=1 ntok=32
while getopts "m:s:p:c:r:n:" o; do
  case $o in m) model=$OPTARG ;; s) ls=$OPTARG ;; p) np=$OPTARG ;; c) clients=$OPTARG ;;
    r) reqs=$OPTARG ;; n) ntok=$OPTARG ;; *) exit 2 ;; esac
done
[ -n "$model" ] || model=$(scripts/fetch-models.sh)
[ -x target/release/wgllm ] || cargo build --release --quiet
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ctx=$((np * 512))
run() { # name, command...
  local name=$1; shift
  "$@" >"/tmp/bench-serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1200); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.25; done
  python3 - "$port" "$clients" "$reqs" "$ntok" "$name" <<'PY'
import json, sys, threading, time, urllib.request
port, clients, reqs, ntok, name = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
toks, lock, firsts = [0], threading.Lock(), []
def client(c):
    for r in range(reqs):
        body = json.dumps({"prompt": f"Story {c}.{r}: once upon a time", "n_predict": ntok, "stream": True,
                           "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
        t0 = time.time(); first = None
        with urllib.request.urlopen(req, timeout=600) as resp:
            for line in resp:
                if line.startswith(b"data: "):
                    d = json.loads(line[6:])
                    if not d.get("stop"):
                        first = first or time.time() - t0
                        with lock: toks[0] += 1
        with lock: firsts.append(first or 0)
t0 = time.time()
ts = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for t in ts: t.start()
for t in ts: t.join()
dt = time.time() - t0
firsts.sort()
print(f"| {name} | {clients} | {toks[0]} | {dt:.1f} | {toks[0]/dt:.2f} | {firsts[len(firsts)//2]:.2f} |")
PY
  kill $pid; wait $pid 2>/dev/null || true
}
echo "model $(basename "$model"), -np $np, -c $ctx, $clients clients x $reqs requests x $ntok tokens"
echo "| server | clients | tokens | seconds | tokens/s | median first token (s) |"
echo "|---|---:|---:|---:|---:|---:|"
run wgllm target/release/wgllm serve -m "$model" --port "$port" -np "$np" -c "$ctx"
if [ -x "$ls" ]; then
  GGML_VK_VISIBLE_DEVICES=0 run llama-server-vulkan "$ls" -m "$model" --port "$port" -np "$np" -c "$ctx" -ngl 99
else
  echo "(no llama-server at $ls: build it with ../shared/tools/llamacpp-ref/build.sh)"
fi
