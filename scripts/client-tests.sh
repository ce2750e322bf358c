#!/usr/bin/env bash
# Our own client tests (tests/clients): the real `openai` client against `wgllm serve`, and
# 64 concurrent streaming clients on 8 slots. Python from llama.cpp's server suite's
# environment (scripts/suite-env.sh).
#   scripts/client-tests.sh [PYTEST_ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
server="$root/target/release/wgllm"
[ -x "$server" ] || { echo "error: no server binary at $server (cargo build --release)" >&2; exit 1; }
source scripts/suite-env.sh
WGLLM_SUITE_SERVER="$server" WGLLM_SUITE_MODEL="$model" \
  "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfE tests/clients "$@"
