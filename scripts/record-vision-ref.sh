#!/usr/bin/env bash
# Records llama.cpp's reading of an image in a prompt (tests/vision.rs): builds
# scripts/mtmd-ref.cpp against the reference build (../shared/tools/llamacpp-ref/build.sh)
# and runs it on Gemma-3-270M with the synthetic gemma3 mmproj for it and each test image,
# into tests/data/reference/vision/gemma3-270m-IMAGE.json. The language model runs on
# llama.cpp's Vulkan backend (lavapipe): its CPU backend quantizes activations to 8 bits,
# which moves these logits by up to 1.2 (the image's rows are far from any token's).
# Usage: scripts/record-vision-ref.sh [LLAMACPP_REF_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:-$HOME/.cache/llamacpp-ref}
models="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g++ -O2 -std=c++17 scripts/mtmd-ref.cpp -I"$ref/src/include" -I"$ref/src/ggml/include" \
  -I"$ref/src/tools/mtmd" -L"$ref/bin" -lmtmd -lllama -lggml -lggml-base \
  -Wl,-rpath,"$ref/bin" -o "$tmp/mtmd-ref"
cargo build --release --quiet
model="$models/gemma-3-270m-q4_k_m.gguf"
target/release/wgllm synth --mmproj-for "$model" -o "$tmp/mmproj.gguf"
sha256sum "$tmp/mmproj.gguf"
printf '<start_of_turn>user\n<__media__>Count from one to twenty, in words.<end_of_turn>\n<start_of_turn>model\n' > "$tmp/prompt.txt"
for img in square-224 wide-300x180 tall-100x150; do
  GGML_VK_VISIBLE_DEVICES=0 MTMD_REF_NGL=99 "$tmp/mtmd-ref" "$model" "$tmp/mmproj.gguf" "tests/data/vision/$img.png" "$tmp/prompt.txt" 32 \
    > "tests/data/reference/vision/gemma3-270m-$img.json"
done

# SmolVLM's layout (idefics3: tiles and a global view): SmolLM2 with SmolVLM's image
# tokens added, the synthetic idefics3 mmproj for it; the prompt as wgllm run renders
# SmolLM2's template. Also every tile's embeddings (MTMD_REF_EMBD), the language model on
# Vulkan as above, the encoder on the CPU.
lm="$tmp/smolvlm-lm.gguf"
target/release/wgllm synth --add-tokens-to "$models/SmolLM2-135M-Instruct.Q4_1.gguf" -o "$lm"
target/release/wgllm synth --mmproj-for "$lm" --projector idefics3 -o "$tmp/mmproj-idefics3.gguf"
sha256sum "$lm" "$tmp/mmproj-idefics3.gguf"
printf '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n<__media__>What is in this picture?<|im_end|>\n<|im_start|>assistant\n' > "$tmp/prompt-smolvlm.txt"
for img in square-224 wide-300x180 tall-100x150; do
  GGML_VK_VISIBLE_DEVICES=0 MTMD_REF_NGL=99 MTMD_REF_EMBD="tests/data/reference/vision/idefics3-$img.bin" \
    "$tmp/mtmd-ref" "$lm" "$tmp/mmproj-idefics3.gguf" "tests/data/vision/$img.png" "$tmp/prompt-smolvlm.txt" 32 \
    > "tests/data/reference/vision/smolvlm-$img.json"
done

# Qwen2.5-VL (qwen2.5vl_merger: images at their own size, window attention, the 2 x 2
# merger) with a tiny qwen2vl language model given <|vision_start|> and <|vision_end|>:
# the embeddings (MTMD_REF_EMBD, the encoder on the CPU), then the prompt's chunks, the
# logits and greedy tokens with the image's tokens placed by M-RoPE (the language model
# on Vulkan).
qbase="$tmp/qwen2vl-base.gguf"
qlm="$tmp/qwen2vl-lm.gguf"
target/release/wgllm synth --arch qwen2vl --shape tiny --trained-scale --type q8_0 \
  --vocab-from "$ref/src/models/ggml-vocab-qwen2.gguf" -o "$qbase"
target/release/wgllm synth --add-tokens-to "$qbase" --tokens '<|vision_start|>,<|vision_end|>' -o "$qlm"
target/release/wgllm synth --mmproj-for "$qlm" --projector qwen25vl -o "$tmp/mmproj-qwen25vl.gguf"
sha256sum "$qlm" "$tmp/mmproj-qwen25vl.gguf"
printf '<|im_start|>user\n<__media__>What is in this picture?<|im_end|>\n<|im_start|>assistant\n' > "$tmp/prompt-qwen.txt"
for img in square-224 wide-300x180 tall-100x150; do
  GGML_VK_VISIBLE_DEVICES=0 MTMD_REF_NGL=99 MTMD_REF_EMBD="tests/data/reference/vision/qwen25vl-$img.bin" \
    "$tmp/mtmd-ref" "$qlm" "$tmp/mmproj-qwen25vl.gguf" "tests/data/vision/$img.png" "$tmp/prompt-qwen.txt" 16 \
    > "tests/data/reference/vision/qwen25vl-$img.json"
done
# The page's prompt (tests/browser.rs): the chat template's rendering, the tall image.
printf '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n<__media__>What is in this picture?<|im_end|>\n<|im_start|>assistant\n' > "$tmp/prompt-qwen-chat.txt"
GGML_VK_VISIBLE_DEVICES=0 MTMD_REF_NGL=99 "$tmp/mtmd-ref" "$qlm" "$tmp/mmproj-qwen25vl.gguf" \
  tests/data/vision/tall-100x150.png "$tmp/prompt-qwen-chat.txt" 16 \
  > tests/data/reference/vision/qwen25vl-chat-tall-100x150.json
