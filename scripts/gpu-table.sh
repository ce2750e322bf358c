#!/usr/bin/env bash
# The GPU table of docs/results.md in one go, for a machine with a real GPU: writes the two synthetic
# models (SmolLM2-135M's shape in Q4_1, Llama-2-7B's shape in Q4_0, random weights, SmolLM2's
# vocabulary), runs scripts/bench-vs-llamacpp.sh on each (pp512 and tg128 at depth 0 and
# 4096), wgllm's tg128 with the next token drawn on the CPU and on the GPU (`--sampling`),
# then `wgllm bench --profile` on each.
#   scripts/gpu-table.sh [-r N] [--only 135m|7b] [--no-llamacpp] [--quick] [-- EXTRA wgllm bench flags]
# --quick (for a short lease on a GPU machine): each model's kernels checked on the device
# first (`wgllm tune --check`), then one repetition, depth 0 only, no sampling-path rows
# and one profile.
# Environment: WGLLM (the binary, default target/release/wgllm), LLAMACPP_REF (as
# bench-vs-llamacpp.sh), VOCAB (a GGUF whose tokenizer the models take; default the test
# model from scripts/fetch-models.sh, or a file written by `wgllm synth --vocab-only`),
# MODELS_DIR (where the models are written, default a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
r=3 only="" llama=1 quick=0
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    -r) r=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --no-llamacpp) llama=0; shift ;;
    --quick) quick=1; r=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown flag $1 (want -r, --only, --no-llamacpp, --quick, -- flags)" >&2; exit 2 ;;
  esac
done
wgllm=${WGLLM:-target/release/wgllm}
[ -x "$wgllm" ] || cargo build --release -q
vocab=${VOCAB:-$(scripts/fetch-models.sh)}
dir=${MODELS_DIR:-$(mktemp -d)}
mkdir -p "$dir"
"$wgllm" devices || true
for spec in 135m:q4_1 7b:q4_0; do
  shape=${spec%%:*} ty=${spec#*:}
  [ -z "$only" ] || [ "$only" = "$shape" ] || continue
  m="$dir/synth-$shape-$ty.gguf"
  [ -f "$m" ] || "$wgllm" synth --vocab-from "$vocab" --shape "$shape" --type "$ty" -o "$m"
  echo
  echo "# $shape shape, $ty"
  depths=0,4096
  if [ "$quick" = 1 ]; then
    depths=0
    echo "## kernels checked on this device"
    "$wgllm" tune --check -m "$m" | grep -E "dropped|checked"
  fi
  if [ "$llama" = 1 ]; then
    WGLLM=$wgllm scripts/bench-vs-llamacpp.sh "$m" -p 512 -n 128 -d "$depths" -r "$r"
  else
    "$wgllm" bench -m "$m" -p 512 -n 128 -d "$depths" -r "$r" "${extra[@]}"
  fi
  if [ "$quick" = 1 ]; then
    "$wgllm" bench -m "$m" -p 512 -n 16 -r 1 --profile "${extra[@]}"
    continue
  fi
  echo
  echo "## wgllm tg128 by sampling path (cpu: logits read back; gpu: drawn on the device)"
  for s in cpu gpu; do
    "$wgllm" bench -m "$m" -p 0 -n 128 -d 0,4096 -r "$r" --sampling "$s" "${extra[@]}"
  done
  echo
  echo "## wgllm bench --profile ($shape, depth 0 and 4096)"
  for d in 0 4096; do
    "$wgllm" bench -m "$m" -p 512 -n 16 -d "$d" -r 1 --profile "${extra[@]}"
  done
done
