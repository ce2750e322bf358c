#!/usr/bin/env bash
# Every kernel variant through AMD's shader compiler, without an AMD GPU: Mesa's RADV on
# its null device (../shared/tools/radv-stats, set up here when missing) compiles the
# SPIR-V `wgllm kernels --spirv` writes, as wgpu would hand it to a Radeon driver, and
# reports per kernel what the compiler made of it. One table per chip, then a summary:
#   N kernels compiled for CHIP, S with spills, F failed; matrix kernels with matrix
#   instructions: M/K; integer-dot kernels with dot instructions: D/E
# Matrix and dot instructions are read from the disassembly (RADV_DEBUG=shaders):
# v_wmma_* / v_mfma_* and v_dot4*.
# Usage: scripts/kernel-stats.sh [--wave32] [--only TEXT] [--out DIR] CHIP...
#   CHIP: Mesa's family names (navi31, gfx1201, gfx940, navi21, ...).
#   --wave32: compute shaders in 32-wide waves where the chip has both (RADV_PERFTEST=cswave32).
#   --only TEXT: only the variants whose name contains TEXT.
#   --out DIR: also write DIR/kernel-stats-CHIP[-wave32].txt (the tables docs/ keeps).
# Exit status 1 when a kernel fails to compile or a GPU-shaped kernel spills.
set -euo pipefail
cd "$(dirname "$0")/.."
wave32=0 only= out=
chips=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wave32) wave32=1 ;;
    --only) only=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    -*) echo "error: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) chips+=("$1") ;;
  esac
  shift
done
[ ${#chips[@]} -gt 0 ] || { echo "error: name a chip, e.g. scripts/kernel-stats.sh navi31 (see --help)" >&2; exit 2; }
radv=${RADV_NULL_DIR:-$HOME/.cache/radv-null}
if [ ! -x "$radv/stats" ]; then
  setup=../shared/tools/radv-stats/setup.sh
  [ -x "$setup" ] || { echo "error: no RADV null device in $radv and no $setup to set one up" >&2; exit 1; }
  bash "$setup" "$radv" >&2
fi
[ -x target/release/wgllm ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
target/release/wgllm kernels --spirv "$work/spv" ${only:+--only "$only"} >&2
status=0
for chip in "${chips[@]}"; do
  (
    . "$radv/env.sh"
    export RADV_FORCE_FAMILY=$chip
    [ "$wave32" = 1 ] && export RADV_PERFTEST=cswave32
    probe=$("$radv/probe" 2>/dev/null || true)
    grep -q "deviceName" <<<"$probe" || { echo "error: Mesa has no chip named $chip" >&2; exit 1; }
    coop=0; grep -q "cooperativeMatrix 1" <<<"$probe" && coop=1
    # Kernels this chip cannot take (cooperative matrices where it has none) are left out
    # and counted as such, not as failures.
    : > "$work/files"; : > "$work/counts"
    while IFS=$'\t' read -r file env shape products name rest; do
      [ "$file" = - ] && continue
      [ "$products" = matrix ] && [ "$coop" = 0 ] && continue
      echo "$work/spv/$file" >> "$work/files"
      if [ "$products" != plain ]; then
        # The disassembly of this one pipeline: its matrix and dot instructions.
        dis=$(RADV_DEBUG=shaders "$radv/stats" "$work/spv/$file" 2>&1 >/dev/null || true)
        printf '%s\t%s\t%s\n' "$file" "$(grep -cE 'v_wmma_|v_mfma_|v_swmmac_' <<<"$dis" || true)" \
          "$(grep -cE 'v_dot4' <<<"$dis" || true)" >> "$work/counts"
      fi
    done < "$work/spv/index.tsv"
    xargs -a "$work/files" "$radv/stats" 2>/dev/null > "$work/stats" || true
    label=$chip; [ "$wave32" = 1 ] && label="$chip-wave32"
    python3 scripts/kernel_stats.py "$work/spv/index.tsv" "$work/stats" "$work/counts" "$label" "$coop" \
      "$(sed -n 's/^driverInfo: //p' <<<"$probe")" > "$work/table-$label"
  ) || status=1
  label=$chip; [ "$wave32" = 1 ] && label="$chip-wave32"
  [ -f "$work/table-$label" ] || continue
  cat "$work/table-$label"
  if [ -n "$out" ]; then mkdir -p "$out"; cp "$work/table-$label" "$out/kernel-stats-$label.txt"; fi
  # The summary's verdict: failures or spills in GPU-shaped kernels fail the run.
  grep -q '^verdict: ok' "$work/table-$label" || status=1
done
exit $status
