#!/usr/bin/env bash
# The project's test command: installs the test devices if missing
# (scripts/setup-test-machine.sh), fetches the test model if missing, checks that the library
# builds for the other targets wgpu serves, then runs every test (op tests run on Vulkan
# and GL; see WGLLM_TEST_BACKENDS in tests/common/mod.rs). Arguments go to `cargo test`
# (with arguments, the cross-target checks are skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "error: no Rust toolchain (cargo); install one with rustup (https://rustup.rs), then rerun $0" >&2
  exit 1
fi
# The devices and programs the tests run on (lavapipe, llvmpipe, Xvfb, Chromium, Python's
# venv): installed here when missing, or the command to install them is printed.
scripts/setup-test-machine.sh
# SmolLM2 for the model tests; Gemma-3 for the SPM tokenizer tests.
scripts/fetch-models.sh --gemma >/dev/null
# llama.cpp's tokenizer test vocabularies and chat templates, for the tests that compare
# with them (tests/common/mod.rs reads WGLLM_LLAMACPP_TESTS).
export WGLLM_LLAMACPP_TESTS="${WGLLM_LLAMACPP_TESTS:-$(scripts/fetch-llamacpp-tests.sh)}"
# Khronos' SPIR-V validator, new enough for cooperative matrices (tests/kernels_spirv.rs).
export WGLLM_SPIRV_VAL="${WGLLM_SPIRV_VAL:-$(scripts/spirv-tools.sh)}"
if [ $# -eq 0 ]; then
  # Metal (macOS) and DX12 (Windows): checked, not run. The browser's WebGPU (wasm32) is
  # built whole below (scripts/web.sh) and run by tests/browser.rs.
  if ! command -v rustup >/dev/null; then
    echo "error: rustup is needed to add the cross-check targets (https://rustup.rs)" >&2
    exit 1
  fi
  targets="aarch64-apple-darwin x86_64-pc-windows-msvc"
  rustup target add $targets >/dev/null
  # The library without the desktop app's GUI crates (they add minutes per target; the
  # app itself is built and tested natively below).
  for t in $targets; do
    echo "cargo check --lib --no-default-features --target $t"
    cargo check --quiet --lib --no-default-features --target "$t"
  done
fi
# The GL backend (EGL) wants a runtime dir; without one it only prints noise.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
# Kernel shapes and backend are measured at a model's first use (`wgllm tune`). Measure
# once here, into a cache of this run's own, so every test process uses the same choice
# (tests running side by side would otherwise each measure, under each other's load).
export WGLLM_CACHE_DIR="${WGLLM_CACHE_DIR:-$(mktemp -d)}"
cargo build --release --quiet
# The browser page (the app for wasm32), which tests/browser.rs serves to headless Chromium.
scripts/web.sh --build-only
models="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}"
for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
  target/release/wgllm tune -m "$models/$m"
done
cargo test --release "$@"
if [ $# -eq 0 ]; then
  # llama.cpp's own server tests against `wgllm serve`: the quick ones llama-server passes too.
  scripts/server-tests.sh --expected tests/data/server-suite-pass.txt
  # The real `openai` client against `wgllm serve` (the 64-client load test in
  # tests/clients/test_load.py takes minutes on lavapipe: run by hand, docs/testing.md says so).
  scripts/client-tests.sh --ignore=tests/clients/test_load.py
  # Every fuzz target for a short bounded time from its seeds and past findings (a long
  # run: scripts/fuzz.sh 3600; docs/hardening.md has the figures).
  WGLLM_FUZZ_SEED="${WGLLM_FUZZ_SEED:-1}" scripts/fuzz.sh "${WGLLM_FUZZ_SECONDS:-10}"
fi
