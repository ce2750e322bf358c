#!/usr/bin/env bash
# llama-bench (Vulkan backend, all layers on the GPU) and `wgllm bench` on the same model and
# the same device, one after the other, so their ratio is measured in one run.
#   scripts/bench-vs-llamacpp.sh [MODEL] [-p N] [-n N] [-r N] [-d N]
# MODEL defaults to the test model (scripts/fetch-models.sh). llama.cpp comes from
# ../shared/tools/llamacpp-ref/build.sh (LLAMACPP_REF, default ~/.cache/llamacpp-ref); several
# builds separated by ':' (build.sh's and build-coopmat.sh's, say) each run in turn; the
# last table gives wgllm's tokens per second against each and the ratio to the faster.
# Its Vulkan backend skips CPU-type devices such as lavapipe unless
# GGML_VK_VISIBLE_DEVICES=0, which is set here unless given.
set -euo pipefail
cd "$(dirname "$0")/.."
model=""
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then model=$1; shift; fi
[ -n "$model" ] || model=$(scripts/fetch-models.sh)
p=512 n=128 r=3 d=0
while [ $# -gt 0 ]; do
  case $1 in
    -p) p=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -r) r=$2; shift 2 ;;
    -d) d=$2; shift 2 ;;
    *) echo "unknown flag $1 (want -p -n -r -d)" >&2; exit 2 ;;
  esac
done
refs=${LLAMACPP_REF:-$HOME/.cache/llamacpp-ref}
IFS=: read -r -a refs <<<"$refs"
for ref in "${refs[@]}"; do
  if [ ! -x "$ref/bin/llama-bench" ]; then
    echo "no $ref/bin/llama-bench: build llama.cpp with ../shared/tools/llamacpp-ref/build.sh (about 10 minutes)" >&2
    exit 1
  fi
done
wgllm=${WGLLM:-target/release/wgllm}
[ -x "$wgllm" ] || cargo build --release -q
# Each run's rows as JSON lines too, for the ratios at the end.
rows=$(mktemp -d)
trap 'rm -rf "$rows"' EXIT
i=0
for ref in "${refs[@]}"; do
  i=$((i + 1))
  echo "## llama.cpp (llama-bench, Vulkan, -ngl 99; $ref)"
  GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} LD_LIBRARY_PATH="$ref/bin:${LD_LIBRARY_PATH:-}" \
    "$ref/bin/llama-bench" -m "$model" -p "$p" -n "$n" -r "$r" -d "$d" -ngl 99 -o md -oe jsonl \
    2>"$rows/llama-$i.err"
  grep '^{' "$rows/llama-$i.err" >"$rows/llama-$i.jsonl" || true
done
echo
echo "## wgllm (wgllm bench)"
"$wgllm" bench -m "$model" -p "$p" -n "$n" -r "$r" -d "$d" -o jsonl >"$rows/wgllm.jsonl"
python3 - "$rows" "${refs[@]}" <<'PY'
import json, os, sys
rows, refs = sys.argv[1], sys.argv[2:]
def load(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            out[(r["n_prompt"], r["n_gen"], r.get("n_depth", 0))] = r["avg_ts"]
    return out
def name(k):
    pp, tg, d = k
    t = f"pp{pp}" if tg == 0 else (f"tg{tg}" if pp == 0 else f"pp{pp}+tg{tg}")
    return t + (f" @ d{d}" if d else "")
ours = load(f"{rows}/wgllm.jsonl")
theirs = [load(f"{rows}/llama-{i + 1}.jsonl") for i in range(len(refs))]
print("| test | wgllm t/s | " + " | ".join(os.path.basename(r) for r in refs) + " | ratio to the faster |")
print("| --- | ---: | " + " | ".join("---:" for _ in refs) + " | ---: |")
for k, v in sorted(ours.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
    ts = [t.get(k) for t in theirs]
    best = max((t for t in ts if t), default=None)
    cells = " | ".join(f"{t:.2f}" if t else "-" for t in ts)
    ratio = f"{v / best:.2f}x" if best else "-"
    print(f"| {name(k)} | {v:.2f} | {cells} | {ratio} |")
PY
