#!/usr/bin/env bash
# Runs every coverage-guided fuzz target (fuzz/, cargo-fuzz with libFuzzer), or the
# TARGETs named, for SECONDS each (default 60), from its checked-in seeds (fuzz/seeds/<target>) and past findings
# (fuzz/regressions/<target>) plus what earlier runs here found (fuzz/work/, ignored by
# git), with the words in fuzz/dicts/<target>.dict where there is one. Ends with one
# line: "N targets, M executions, K crashes"; exits 1 on a crash,
# leaving the input in fuzz/artifacts/<target>/ (check it in under fuzz/regressions/
# with its fix: tests/fuzz_corpus.rs replays it in every test run).
#
# A crash is a panic, an input running longer than 10 s (-timeout), or a process
# growing past 4 GiB (-rss_limit_mb). Installs cargo-fuzz when missing; builds with the
# project's stable toolchain (RUSTC_BOOTSTRAP=1 lets it take cargo-fuzz's -Z flags: no
# nightly needed). The targets are built without a sanitizer (Rust code here is safe;
# panics, hangs and memory are what is hunted) and with debug assertions, so integer
# overflow panics. WGLLM_FUZZ_SEED fixes libFuzzer's random seed (the test command's
# short run uses one). An hour per target is seven hours in all: name a few targets per
# run to spread it over several sittings.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
[ $# -gt 0 ] && shift
if ! command -v cargo-fuzz >/dev/null; then
  echo "installing cargo-fuzz (once)..." >&2
  cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
# server_request reads bodies with SmolLM2's tokenizer and template.
scripts/fetch-models.sh >/dev/null
fuzz=(cargo fuzz)
opts=(--fuzz-dir fuzz -s none -a --release)
echo "building the fuzz targets..." >&2
mkdir -p fuzz/work
if ! "${fuzz[@]}" build "${opts[@]}" >fuzz/work/build.log 2>&1; then
  tail -30 fuzz/work/build.log >&2
  echo "error: the fuzz targets did not build (fuzz/work/build.log)" >&2
  exit 1
fi
targets=$("${fuzz[@]}" list --fuzz-dir fuzz)
if [ $# -gt 0 ]; then
  for t in "$@"; do
    grep -qx -- "$t" <<<"$targets" || { echo "no fuzz target $t (there are: $(echo $targets))" >&2; exit 2; }
  done
  targets="$*"
fi
n_targets=0 n_exec=0 n_crash=0
for t in $targets; do
  mkdir -p "fuzz/work/$t" "fuzz/artifacts/$t"
  corpora=("fuzz/work/$t" "fuzz/seeds/$t")
  [ -d "fuzz/regressions/$t" ] && corpora+=("fuzz/regressions/$t")
  log="fuzz/artifacts/$t/last-run.log"
  before=$(find "fuzz/artifacts/$t" -type f ! -name '*.log' | wc -l)
  set +e
  dict=()
  [ -f "fuzz/dicts/$t.dict" ] && dict=(-dict="fuzz/dicts/$t.dict")
  "${fuzz[@]}" run "${opts[@]}" "$t" "${corpora[@]}" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    "${dict[@]}" ${WGLLM_FUZZ_SEED:+-seed="$WGLLM_FUZZ_SEED"} \
    >"$log" 2>&1
  rc=$?
  set -e
  after=$(find "fuzz/artifacts/$t" -type f ! -name '*.log' | wc -l)
  execs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  execs=${execs:-0}
  crashes=$((after - before))
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    # Ended without a saved input: a failure of the run itself.
    echo "$t: the fuzzer failed (exit $rc); see $log" >&2
    tail -20 "$log" >&2
    crashes=1
  fi
  if [ "$crashes" -gt 0 ]; then
    echo "$t: $crashes crash(es), inputs in fuzz/artifacts/$t/; log $log" >&2
    grep -E "panicked|ERROR: libFuzzer|SUMMARY" "$log" | head -5 >&2 || true
  fi
  echo "$t: $execs executions in ${secs}s, $crashes crashes" >&2
  n_targets=$((n_targets + 1)) n_exec=$((n_exec + execs)) n_crash=$((n_crash + crashes))
done
echo "$n_targets targets, $n_exec executions, $n_crash crashes"
[ "$n_crash" -eq 0 ]
