#!/usr/bin/env bash
# llama-bench (Vulkan backend, all layers on the GPU) and `wgllm bench` on the same model and
# the same device, one after the other, so their ratio is measured in one run.
#   scripts/bench-vs-llamacpp.sh [MODEL] [-p N] [-n N] [-r N] [-d N]
# MODEL defaults to the test model (scripts/fetch-models.sh). llama.cpp comes from
# ../shared/tools/llamacpp-ref/build.sh (LLAMACPP_REF, default ~/.cache/llamacpp-ref); several
# builds separated by ':' (build.sh's and build-coopmat.sh's, say) each run in turn.
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
for ref in "${refs[@]}"; do
  echo "## llama.cpp (llama-bench, Vulkan, -ngl 99; $ref)"
  GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} LD_LIBRARY_PATH="$ref/bin:${LD_LIBRARY_PATH:-}" \
    "$ref/bin/llama-bench" -m "$model" -p "$p" -n "$n" -r "$r" -d "$d" -ngl 99 -o md
done
echo
echo "## wgllm (wgllm bench)"
"$wgllm" bench -m "$model" -p "$p" -n "$n" -r "$r" -d "$d"
