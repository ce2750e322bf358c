#!/usr/bin/env bash
# Records llama.cpp's greedy generations under grammars and JSON schemas on SmolLM2 (the
# cases in tests/data/grammar/cases.txt) into tests/data/grammar/<name>.txt, which
# tests/grammar_cli.rs replays with `wgllm run`. llama.cpp runs on its Vulkan backend on
# the first Vulkan device (lavapipe here: the device wgllm's tests run on), so that both
# see nearly the same logits; its CPU backend parts from both at near-ties.
# Needs a llama.cpp build (../shared/tools/llamacpp-ref/build.sh; DIR defaults to
# ~/.cache/llamacpp-ref). Usage: scripts/record-grammar-ref.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
D=${1:-$HOME/.cache/llamacpp-ref}
model=$("$root/scripts/fetch-models.sh" | tail -n 1)
out="$root/tests/data/grammar"
while IFS='|' read -r name prompt constraint; do
  name=$(echo "$name" | xargs)
  case "$name" in ''|'#'*) continue ;; esac
  prompt=${prompt# }; prompt=${prompt% }
  constraint=${constraint# }
  flag=${constraint%% *}
  value=${constraint#* }
  GGML_VK_VISIBLE_DEVICES=0 LD_LIBRARY_PATH="$D/bin" "$D/bin/llama-completion" -m "$model" \
    -p "$prompt" -n 64 --temp 0 -ngl 99 -no-cnv --no-display-prompt "$flag" "$value" 2>/dev/null \
    | sed -e 's/ \[end of text\]$//' > "$out/$name.txt"
  echo "$name: $(cat "$out/$name.txt")"
done < "$out/cases.txt"
