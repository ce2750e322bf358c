#!/usr/bin/env bash
# Records what llama.cpp's sampler chain picks for generated logit rows, for several
# seeds, vocabulary sizes and settings, into tests/data/sampler/<set>.txt. The logits are
# not stored: both scripts/sampler-ref.cpp and src/sample/reference_tests.rs generate them
# from (lseed, step). The Rust test replays every file and must pick the same tokens.
#
# Needs a llama.cpp build (../shared/tools/llamacpp-ref/build.sh; DIR defaults to
# ~/.cache/llamacpp-ref). Usage: scripts/record-sampler-ref.sh [DIR]
#
# Fixture format: a "params" line (key=value, the harness's keys), then per case a
# "case" line (vocab, steps, lseed, seed, rows, prompt) and an "expect" line of
# token:candidates per step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
D=${1:-$HOME/.cache/llamacpp-ref}
out="$root/tests/data/sampler"
bin=$(mktemp -d)/sampler-ref
trap 'rm -rf "$(dirname "$bin")"' EXIT
g++ -O2 -std=c++17 "$root/scripts/sampler-ref.cpp" -I"$D/src/include" -I"$D/src/ggml/include" \
  -L"$D/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$D/bin" -o "$bin"
mkdir -p "$out"
rm -f "$out"/*.txt

# name | params | rows | prompt
sets=(
  "defaults|temp=0.8|mixed|-"
  "hot-all|temp=1.5 top_k=0 top_p=1 min_p=0|mixed|-"
  "penalties|repeat_penalty=1.3 frequency_penalty=0.5 presence_penalty=0.4 repeat_last_n=32|sticky|5,17,17,300,5,900"
  "penalties-all|temp=1.2 top_k=0 top_p=1 min_p=0 repeat_penalty=1.5 frequency_penalty=0.2 presence_penalty=1.0 repeat_last_n=16|sticky|7,7,7,42"
  "penalties-greedy|temp=0 repeat_penalty=1.05 frequency_penalty=0.3 presence_penalty=0.2 repeat_last_n=64|sticky|9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,42,43,44,45"
  "typical|typical_p=0.9|mixed|-"
  "typical-all|typical_p=0.7 top_k=0 top_p=1 min_p=0|mixed|-"
  "top-p-all|temp=1.0 top_k=0 top_p=0.9 min_p=0|mixed|-"
  "top-p-wide|temp=1.0 top_k=0 top_p=0.999 min_p=0|mixed|-"
  "min-p-all|temp=1.0 top_k=0 top_p=1 min_p=0.1|mixed|-"
  "xtc|xtc_probability=0.5 xtc_threshold=0.1|mixed|-"
  "xtc-all|temp=1.0 top_k=0 top_p=1 min_p=0 xtc_probability=0.7 xtc_threshold=0.01|mixed|-"
  "greedy|temp=0|mixed|-"
  "greedy-ties|temp=0|ties|-"
  "greedy-all|temp=0 top_k=0 top_p=1 min_p=0|mixed|-"
  "ties|temp=1.0|ties|-"
  "ties-all|temp=0.7 top_k=0 top_p=0.95 min_p=0|ties|-"
  "top-k-large|temp=1.0 top_k=300 top_p=1 min_p=0|mixed|-"
  "dynatemp|temp=0.8 dynatemp_range=0.5 dynatemp_exponent=1.5|mixed|-"
  "top-n-sigma|temp=1.0 top_k=0 top_p=1 min_p=0 top_n_sigma=1.5|mixed|-"
  "min-keep|temp=1.0 top_p=0.3 min_p=0.5 min_keep=5 typical_p=0.5|mixed|-"
  "bias|temp=1.0 logit_bias=3:5.0,10:-inf,11:2.5,999:-3.0 banned=0,1,2|mixed|-"
)
n=0
for entry in "${sets[@]}"; do
  IFS='|' read -r name params rows prompt <<<"$entry"
  f="$out/$name.txt"
  echo "params $params" >"$f"
  for vocab in 1000 49152; do
    steps=$([ "$vocab" -le 1000 ] && echo 160 || echo 48)
    for seed in 42 1 12345; do
      lseed=$((seed * 1000003 + vocab))
      # shellcheck disable=SC2086
      expect=$("$bin" "$vocab" "$steps" "$lseed" "$seed" "$rows" "$prompt" $params)
      echo "case vocab=$vocab steps=$steps lseed=$lseed seed=$seed rows=$rows prompt=$prompt" >>"$f"
      echo "expect $expect" >>"$f"
      n=$((n + steps))
    done
  done
done
echo "recorded $n steps into $out ($(du -sh "$out" | cut -f1))"
