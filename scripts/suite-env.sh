# Sourced by scripts/server-tests.sh and scripts/client-tests.sh: the test model, llama.cpp's
# server test suite, and a Python environment with the suite's requirements (pytest,
# openai, aiohttp, requests), made on first use.
# Sets: model (SmolLM2's path), tests (the suite's folder), venv.
model="$(scripts/fetch-models.sh)"
data="$(scripts/fetch-llamacpp-tests.sh)"
tests="$data/server/tools/server/tests"
venv="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/server-tests-venv"
if [ ! -x "$venv/bin/pytest" ]; then
  echo "installing the suite's Python requirements into $venv ..." >&2
  python3 -m venv "$venv" || { echo "error: python3 -m venv failed: install python3-venv (Debian) and rerun" >&2; exit 1; }
  "$venv/bin/pip" install -q -r "$tests/requirements.txt"
fi
