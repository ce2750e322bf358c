#!/usr/bin/env bash
# Past one machine with existing tools: two `wgllm serve` replicas on loopback behind
# HAProxy (Debian's package; balance leastconn, health checks on /health, L7 retries),
# a bounded load through it, and one replica killed (SIGKILL) while requests are in
# flight. Every request must be answered with 200; exits non-zero otherwise.
#   scripts/serve-haproxy.sh [-m MODEL] [-n REQUESTS] [-j CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
model="" n=48 j=8
while getopts "m:n:j:" o; do
  case $o in m) model=$OPTARG ;; n) n=$OPTARG ;; j) j=$OPTARG ;; *) exit 2 ;; esac
done
[ -n "$model" ] || model=$(scripts/fetch-models.sh)
if ! command -v haproxy >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y -qq haproxy >/dev/null
fi
[ -x target/release/wgllm ] || cargo build --release --quiet
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p1=$(free_port) p2=$(free_port) front=$(free_port)
for p in $p1 $p2; do
  target/release/wgllm serve -m "$model" --host 127.0.0.1 --port "$p" -np 4 -c 2048 \
    >"$work/replica-$p.log" 2>&1 &
  pids+=($!)
done
victim=${pids[0]}
cat >"$work/haproxy.cfg" <<CFG
global
  maxconn 256
defaults
  mode http
  timeout connect 2s
  timeout client 300s
  timeout server 300s
  retries 3
  option redispatch
  retry-on all-retryable-errors
frontend llm
  bind 127.0.0.1:$front
  option http-buffer-request
  default_backend replicas
backend replicas
  balance leastconn
  option httpchk GET /health
  http-check expect status 200
  server r1 127.0.0.1:$p1 check inter 500ms fall 2 rise 2
  server r2 127.0.0.1:$p2 check inter 500ms fall 2 rise 2
CFG
for p in $p1 $p2; do
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$p/health" >/dev/null && break
    sleep 0.2
  done
done
haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
pids+=($!)
sleep 1.5
python3 - "$front" "$n" "$j" "$victim" <<'PY'
import json, os, signal, sys, threading, time, urllib.request
port, n, j, victim = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
results, lock, done = [], threading.Lock(), [0]
def one(i):
    body = json.dumps({"prompt": f"Request {i}: the capital of France is", "n_predict": 12, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status = r.status; json.load(r)
    except urllib.error.HTTPError as e:
        status = e.code
    except Exception as e:
        status = repr(e)
    with lock:
        results.append(status); done[0] += 1
        if done[0] == n // 4:
            os.kill(victim, signal.SIGKILL)
            print(f"killed replica pid {victim} after {done[0]} answers", flush=True)
sem = threading.Semaphore(j)
def run(i):
    with sem: one(i)
t0 = time.time()
ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
bad = [r for r in results if r != 200]
print(f"{len(results)} requests in {time.time()-t0:.1f} s through HAProxy, {len(results)-len(bad)} answered 200, failures: {bad}")
sys.exit(1 if bad or len(results) != n else 0)
PY
