#!/usr/bin/env bash
# Builds the browser page — the wgllm app compiled for wasm32, drawn and computed with
# WebGPU — into target/web-page, and serves it on localhost with the test model beside it.
#   scripts/web.sh               build, fetch SmolLM2, serve on http://127.0.0.1:${PORT:-8080}
#   scripts/web.sh --build-only  build only (tests/browser.rs serves the page itself)
# Needs: rustup's wasm32-unknown-unknown target and wasm-bindgen-cli at the version in
# Cargo.lock (both installed here when missing), python3 to serve.
set -euo pipefail
cd "$(dirname "$0")/.."

serve=1
case "${1:-}" in
  "") ;;
  --build-only) serve=0 ;;
  *) echo "usage: scripts/web.sh [--build-only]" >&2; exit 2 ;;
esac

if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown >&2
fi
# wasm-bindgen's CLI must be the exact version of the crate the build links.
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if [ -z "$want" ]; then
  echo "error: no wasm-bindgen in Cargo.lock; run 'cargo generate-lockfile' (or a build) first" >&2
  exit 1
fi
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [ "$have" != "$want" ]; then
  echo "installing wasm-bindgen-cli $want (found: ${have:-none})..." >&2
  # Not --locked: its lock names a webpki-roots release some registry mirrors lack.
  cargo install wasm-bindgen-cli --version "$want" >&2
fi

cargo build --profile web --target wasm32-unknown-unknown --bin wgllm >&2
out=target/web-page  # not target/web: that is cargo's folder for the `web` profile
mkdir -p "$out"
wasm-bindgen --target web --no-typescript --out-dir "$out" \
  target/wasm32-unknown-unknown/web/wgllm.wasm
cp assets/web/index.html "$out/"
echo "built the page in $out ($(du -h "$out/wgllm_bg.wasm" | cut -f1) of wasm)" >&2
[ "$serve" = 1 ] || exit 0

model=$(scripts/fetch-models.sh)
ln -sfn "$(dirname "$model")" "$out/models"
port=${PORT:-8080}
echo "open http://127.0.0.1:$port/?model=models/$(basename "$model") in a browser with WebGPU (Ctrl-C stops)" >&2
exec python3 -m http.server --bind 127.0.0.1 "$port" --directory "$out"
