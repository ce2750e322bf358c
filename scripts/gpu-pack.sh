#!/usr/bin/env bash
# Packs what scripts/gpu-session.sh needs on a lent GPU machine into .pack/ (ignore it in
# .git/info/exclude; it stays under the 64 MiB a call may carry): the stripped wgllm
# binary and the kernel-test binaries (tests/ops.rs, quant.rs, sample_gpu.rs), llama-bench
# with its libraries from each llama.cpp build, every part xz-compressed (llama.cpp's
# SPIR-V shrinks about tenfold), and Debian's Vulkan loader with the GL dispatch libraries
# (.deb) for a machine that has the NVIDIA driver but neither: NVIDIA's Vulkan driver is
# libGLX_nvidia.so.0, which needs libglvnd's libGLdispatch, so the loader alone finds no
# device (seen on an H200: `no GPU adapters found`, llama.cpp falling back to its CPU).
#   scripts/gpu-pack.sh [LLAMACPP_DIR ...]
# Default builds: ~/.cache/llamacpp-ref (../shared/tools/llamacpp-ref/build.sh) and
# ~/.cache/llamacpp-ref-coopmat (build-coopmat.sh); each becomes .pack/llamacpp-NAME.tar.xz
# with NAME the folder's last word after "llamacpp-ref" (vulkan where there is none).
set -euo pipefail
cd "$(dirname "$0")/.."
refs=("$@")
[ ${#refs[@]} -gt 0 ] || refs=("$HOME/.cache/llamacpp-ref" "$HOME/.cache/llamacpp-ref-coopmat")
rm -rf .pack && mkdir -p .pack/stage/bin .pack/gl
cargo build --release -q
tests=$(cargo test --release --no-run --test ops --test quant --test sample_gpu 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))/\1/p')
[ -n "$tests" ] || { echo "no test binaries built" >&2; exit 1; }
strip -o .pack/stage/bin/wgllm target/release/wgllm
for t in $tests; do strip -o ".pack/stage/bin/$(basename "$t" | sed 's/-[0-9a-f]*$//')" "$t"; done
# The tests find their data through the path compiled into them.
pwd >.pack/stage/manifest-dir
tar -C .pack/stage -cf - . | xz -T0 -3 >.pack/wgllm.tar.xz
rm -rf .pack/stage
for ref in "${refs[@]}"; do
  [ -x "$ref/bin/llama-bench" ] || { echo "no $ref/bin/llama-bench: build it first" >&2; exit 1; }
  name=$(basename "$ref" | sed 's/^llamacpp-ref-\{0,1\}//')
  name=${name:-vulkan}
  (cd "$ref" && tar -cf - bin/llama-bench bin/*.so*) | xz -T0 -3 >".pack/llamacpp-$name.tar.xz"
done
# The synthetic models' vocabulary (SmolLM2's), as gpu-table.sh's VOCAB.
target/release/wgllm synth --vocab-only --vocab-from "$(scripts/fetch-models.sh)" -o .pack/vocab.gguf
# Debian's Vulkan loader and libglvnd, for a machine whose driver comes without them.
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/gpu-pack-apt'
mkdir -p /tmp/gpu-pack-apt/partial
apt-get $o update -qq >/dev/null 2>&1 || true
debs="libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2"
(cd .pack/gl && apt-get $o download $debs >/dev/null 2>&1) || {
  echo "could not download $debs: the GPU machine must have a Vulkan loader and libglvnd" >&2
  exit 1
}
du -ch .pack/* | sort -h
