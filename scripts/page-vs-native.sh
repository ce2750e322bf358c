#!/usr/bin/env bash
# The browser page's decode speed beside native `wgllm run` on the same device:
# SwiftShader, once through headless Chromium's WebGPU (tests/browser.rs drives the page)
# and once through its own Vulkan driver (the libvk_swiftshader.so Chromium ships), on
# SmolLM2 with llama.cpp's smol-chat prompt at temperature 0, one run each.
#   scripts/page-vs-native.sh [N] [SAMPLING...]   N tokens (default 64); SAMPLING is
#                                                  auto, cpu or gpu (default: auto gpu cpu)
# WGLLM_CHROMIUM_FLAGS adds Chromium flags, e.g. --enable-dawn-features=disable_robustness.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-64}
shift || true
paths=("${@:-auto}")
[ $# -gt 0 ] || paths=(auto gpu cpu)
icd=${WGLLM_SWIFTSHADER_ICD:-/usr/lib/chromium/vk_swiftshader_icd.json}
[ -f "$icd" ] || { echo "error: no SwiftShader Vulkan driver at $icd (apt-get install chromium, or set WGLLM_SWIFTSHADER_ICD)" >&2; exit 1; }
model=$(scripts/fetch-models.sh)
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
export WGLLM_LLAMACPP_TESTS="${WGLLM_LLAMACPP_TESTS:-$(scripts/fetch-llamacpp-tests.sh)}"
scripts/web.sh --build-only
cargo build --release --quiet
prompt=../shared/reference/smol-chat.txt
printf '| sampling | page t/s | native t/s | page / native |\n|---|---:|---:|---:|\n'
for s in "${paths[@]}"; do
  page=$(WGLLM_PAGE_N=$n WGLLM_PAGE_QUERY="&sampling=$s" \
    cargo test --quiet --release --features app --test browser -- --nocapture 2>&1 \
    | sed -n 's/^page: .* reply [0-9]* tokens at \([0-9.]*\) t\/s.*/\1/p')
  native=$(VK_ICD_FILENAMES=$icd target/release/wgllm run -m "$model" -f "$prompt" -n "$n" \
    --temp 0 -c 256 --sampling "$s" 2>&1 >/dev/null \
    | sed -n 's/.* eval time .* runs .*, *\([0-9.]*\) tokens per second)/\1/p')
  ratio=$(python3 -c "print(f'{float(\"${page:-0}\") / float(\"${native:-0}\"):.2f}' if '${page}' and '${native}' else 'n/a')")
  printf '| %s | %s | %s | %s |\n' "$s" "${page:-failed}" "${native:-failed}" "$ratio"
done
