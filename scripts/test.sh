#!/usr/bin/env bash
# The project's test command: fetches the test model if missing, then runs every test
# (op tests run on Vulkan and GL; see WGLLM_TEST_BACKENDS in tests/common/mod.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
# SmolLM2 for the model tests; Gemma-3 for the SPM tokenizer tests.
scripts/fetch-models.sh --gemma >/dev/null
# The GL backend (EGL) wants a runtime dir; without one it only prints noise.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
cargo test --release "$@"
