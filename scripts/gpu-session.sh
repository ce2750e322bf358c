#!/usr/bin/env bash
# One call on a lent GPU machine, from what scripts/gpu-pack.sh put in .pack/: the device
# and what it offers, the kernel tests on its Vulkan driver, the tuner's checks of every
# candidate kernel on it, the 7B with the integer-dot matmuls and without, two real GPU faults (a context
# larger than the card, and a lost device injected into a running server), then
# scripts/gpu-table.sh beside every packed llama.cpp build, `wgllm bench --profile` with
# it. All output goes to $OUT/session.log too. Each step runs under a cap and under what is
# left of the whole budget, so that one slow or hung step cannot take the rest.
#   OUT=DIR scripts/gpu-session.sh [SECONDS] [-- gpu-table.sh flags]   (default 540 s, -r 2)
set -uo pipefail
cd "$(dirname "$0")/.."
budget=540
[ $# -gt 0 ] && [ "$1" != -- ] && { budget=$1; shift; }
[ "${1:-}" = -- ] && shift
table_flags=("$@")
[ ${#table_flags[@]} -gt 0 ] || table_flags=(-r 2)
out=${OUT:-/tmp/gpu-session}
mkdir -p "$out"
exec > >(tee "$out/session.log") 2>&1
t0=$SECONDS

# step NAME CAP CMD...: CMD under CAP seconds or what is left of the budget.
step() {
  local name=$1 cap=$2 left rc
  shift 2
  left=$((budget - (SECONDS - t0)))
  [ "$cap" -le "$left" ] || cap=$left
  echo
  if [ "$cap" -le 5 ]; then
    echo "### $name: skipped (budget spent)"
    return
  fi
  echo "### $name (at most ${cap}s, starting at $((SECONDS - t0))s)"
  timeout -k 5 "$cap" "$@"
  rc=$?
  echo "### $name: exit $rc at $((SECONDS - t0))s"
}

# The pack, the loader and the driver.
p=/tmp/gpu-pack
mkdir -p "$p"
for x in .pack/*.tar.xz; do
  n=$(basename "$x" .tar.xz)
  mkdir -p "$p/$n" && xz -dc -T0 "$x" | tar -C "$p/$n" -xf -
done
bin=$p/wgllm/bin
export WGLLM=$bin/wgllm WGLLM_CACHE_DIR=/tmp/wgllm-cache
md=$(cat "$p/wgllm/manifest-dir")
[ -e "$md" ] || { mkdir -p "$(dirname "$md")" && ln -s "$PWD" "$md"; }
# Debian's loader and libglvnd, unpacked over the image (it may lack them) before
# anything looks for a device; NVIDIA's Vulkan driver named by its manifest where no
# manifest is installed in the usual folders.
for f in .pack/gl/*.deb; do dpkg -x "$f" /; done
ldconfig
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -e "$nv" ] && ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
  export VK_DRIVER_FILES=$nv
fi
refs=$(ls -d "$p"/llamacpp-* 2>/dev/null | paste -sd:)
echo "unpacked in $((SECONDS - t0))s; llama.cpp builds: ${refs:-none}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null
# No adapter: say why (the loader's own errors) and stop, rather than spend the lease on
# steps that cannot run (llama-bench would quietly fall back to its CPU backend).
if ! "$WGLLM" devices; then
  echo "no GPU adapter: the Vulkan loader says"
  VK_LOADER_DEBUG=error,warn,driver "$WGLLM" devices 2>&1 | head -n 40
  ldconfig -p | grep -E 'libvulkan|libGLdispatch|libGLX_nvidia|libnvidia-glcore' | head
  glx=$(ldconfig -p | awk '/libGLX_nvidia.so.0 /{print $NF; exit}')
  [ -z "$glx" ] || { echo "libraries $glx misses:"; ldd "$glx" | grep 'not found'; }
  ls -l /usr/share/vulkan/icd.d /etc/vulkan/icd.d "$(dirname "$nv")" 2>&1 | head
  exit 1
fi

# The kernels on this device: every op test on Vulkan (GPU-shaped, portable and default).
export WGLLM_TEST_BACKENDS=vulkan
step "kernel tests: ops" 150 "$bin/ops" -q --test-threads 8
# (quant's tests on real blocks read Gemma-3's file, which is not carried; its fixtures are.)
step "kernel tests: quant" 60 "$bin/quant" -q --test-threads 8 --skip real_blocks
step "kernel tests: sample_gpu" 60 "$bin/sample_gpu" -q --test-threads 8

# The models, written once (gpu-table.sh takes them from MODELS_DIR).
export MODELS_DIR=/tmp/models VOCAB=.pack/vocab.gguf
mkdir -p "$MODELS_DIR"
m135=$MODELS_DIR/synth-135m-q4_1.gguf m7b=$MODELS_DIR/synth-7b-q4_0.gguf
synth() { "$WGLLM" synth --vocab-from "$VOCAB" --shape "$1" --type "$2" -o "$3.part" && mv "$3.part" "$3"; }
export -f synth
step "synth 135m" 30 bash -c 'synth 135m q4_1 "$0"' "$m135"
step "synth 7b" 90 bash -c 'synth 7b q4_0 "$0"' "$m7b"

# Every tuner candidate checked against the portable kernels on this device (the
# integer-dot ones included, for Q4_0 and the K-quants): what is dropped here is never used.
m1bk=$MODELS_DIR/synth-1b-q4_k.gguf
step "synth 1b q4_k" 45 bash -c 'synth 1b q4_k "$0"' "$m1bk"
step "kernel checks on the device" 60 bash -c \
  'for m in "$@"; do echo "$m"; "$WGLLM" tune --check -m "$m" | grep -E "dropped|checked"; done' \
  _ "$m7b" "$m1bk"

# The integer-dot matmuls (their op tests and checks ran above): the 7B with them forced
# off, forced on, and as the tuner chooses (it times them at first use on GPUs).
intdot() {
  local v
  for v in 0 1 ""; do
    echo "WGLLM_INT_DOT=${v:-(unset: tuned)}"
    WGLLM_INT_DOT=$v "$WGLLM" bench -m "$m7b" -p 512 -n 64 -r 1 | grep -E '^\| (model|.*(pp|tg)[0-9])'
  done
  "$WGLLM" devices | grep -A3 "tuned choices"
}
export -f intdot
export m7b
step "integer dot products, 7b" 120 bash -c intdot

# Cooperative matrices (their op tests and checks ran above, where the driver offers
# them): the 7B's prompt, and its flash attention at depth 4096, off and forced on.
coop() {
  local v
  for v in 0 1; do
    echo "WGLLM_COOP_MATRIX=$v"
    WGLLM_COOP_MATRIX=$v "$WGLLM" bench -m "$m7b" -p 512 -n 0 -fa 1 -d 0,4096 -r 1 |
      grep -E '^\| (model|.*pp[0-9])'
  done
}
export -f coop
step "cooperative matrices, 7b" 90 bash -c coop

# A real out-of-memory: one server takes the card's memory for a 7B's K/V but about 3 GiB,
# then a second process asks for 20 GiB more. Expected: the second exits non-zero with a
# sentence naming -c, no panic; the first goes on answering. (A context over the binding
# limit is refused before any allocation; that is a test here too, the first run below.)
oom() {
  command -v curl >/dev/null || { echo "no curl here: skipped"; return; }
  "$WGLLM" run -m "$m7b" -c 400000 -p Hello -n 4 --temp 0 2>&1 | grep -v INFO
  local free cells
  free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  cells=$(( (free - 4200 - 3072) * 2 / 1024 * 1024 ))  # 512 KiB of f16 K/V per 7B cell
  echo "card free ${free} MiB: a server with -c $cells"
  "$WGLLM" serve -m "$m7b" --host 127.0.0.1 --port 18182 -c "$cells" -ub 512 >/tmp/fill.log 2>&1 &
  local pid=$! i
  for i in $(seq 120); do
    curl -sf -m 2 http://127.0.0.1:18182/health >/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  grep -E "error|loaded" /tmp/fill.log
  nvidia-smi --query-gpu=memory.used,memory.free --format=csv
  "$WGLLM" run -m "$m7b" -c 32768 -p Hello -n 4 --temp 0 2>&1 | grep -v INFO
  echo "second process exited ${PIPESTATUS[0]}"
  echo "the server after it: $(curl -s -m 30 http://127.0.0.1:18182/completion -d '{"prompt":"Hi","n_predict":4}' | head -c 200)"
  kill $pid
  wait $pid
}
export -f oom
export m7b m135
step "fault: a context larger than the card" 60 bash -c oom

# A lost device injected into a running server: the request in flight fails, /health says
# 503 while the model loads again, then requests are answered; card memory before and after.
lost() {
  command -v curl >/dev/null || { echo "no curl here: skipped"; return; }
  WGLLM_FAULT=device-lost@40 "$WGLLM" serve -m "$m135" --host 127.0.0.1 --port 18181 -c 4096 \
    >/tmp/serve.log 2>&1 &
  local pid=$! i
  for i in $(seq 120); do
    curl -sf -m 2 http://127.0.0.1:18181/health >/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "the server did not start:"; tail -n 5 /tmp/serve.log; return 1; }
    sleep 0.5
  done
  python3 - <<'PY'
import json, subprocess, time, urllib.request, urllib.error
base = "http://127.0.0.1:18181"
def get(path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except Exception as e:
        return None, repr(e)
def used():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown (no nvidia-smi)"
t = time.time()
while get("/health")[0] != 200 and time.time() - t < 60:
    time.sleep(0.2)
print("loaded in %.1fs, card memory %s" % (time.time() - t, used()))
ask = {"prompt": "Once upon a time", "n_predict": 64, "temperature": 0}
s, b = get("/completion", ask)
print("request in flight at the fault:", s, b[:200])
t = time.time(); seen = set()
while time.time() - t < 60:
    s, _ = get("/health"); seen.add(s)
    if s == 200: break
    time.sleep(0.1)
print("health answers seen while recovering:", sorted(map(str, seen)), "back after %.1fs" % (time.time() - t))
for i in range(3):
    s, b = get("/completion", ask)
    print("after recovery, request", i, s, (json.loads(b).get("content", "")[:60] if s == 200 else b[:200]))
print("card memory after recovery", used())
PY
  kill $pid
  wait $pid
  echo "server exited $?; its log:"
  grep -v '^\s*$' /tmp/serve.log | tail -n 15
}
export -f lost
step "fault: a lost device under a server" 90 bash -c lost

# The table beside llama.cpp, 7B first (the largest gaps), then the 135M shape.
[ -n "$refs" ] || table_flags+=(--no-llamacpp)
for shape in 7b 135m; do
  LLAMACPP_REF=$refs step "GPU table, $shape" 400 scripts/gpu-table.sh --only "$shape" "${table_flags[@]}"
done
echo "session done in $((SECONDS - t0))s"
