#!/usr/bin/env bash
# Runs one of llama.cpp's reference tools (refshift, refdump; ../shared/tools/llamacpp-ref)
# with a quantized K/V cache: builds the LD_PRELOAD shim scripts/ref-cache-types.c against
# the built llama.cpp and sets the context's cache types and flash attention from
# REF_TYPE_K / REF_TYPE_V (ggml type ids: f16 1, q4_0 2, q8_0 8, ...) and REF_FLASH_ATTN
# (-1 auto, 0 off, 1 on).
#
#   REF_TYPE_K=8 REF_FLASH_ATTN=0 scripts/record-kv-types-ref.sh refshift MODEL PROMPT 400 128 32 8 1 0
#
# LLAMACPP_REF: where build.sh put llama.cpp (default ~/.cache/llamacpp-ref).
set -euo pipefail
ref="${LLAMACPP_REF:-$HOME/.cache/llamacpp-ref}"
tool="${1:?usage: $0 refshift|refdump ARGS...}"
shift
if [ ! -x "$ref/bin/$tool" ]; then
  echo "error: $ref/bin/$tool not found; build llama.cpp first with ../shared/tools/llamacpp-ref/build.sh" >&2
  exit 1
fi
shim="$ref/bin/ref-cache-types.so"
src="$(dirname "$0")/ref-cache-types.c"
if [ ! -f "$shim" ] || [ "$src" -nt "$shim" ]; then
  cc -shared -fPIC -O2 -I "$ref/src/include" -I "$ref/src/ggml/include" "$src" -o "$shim" -ldl
fi
LD_LIBRARY_PATH="$ref/bin" LD_PRELOAD="$shim" exec "$ref/bin/$tool" "$@"
