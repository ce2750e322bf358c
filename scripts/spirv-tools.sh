#!/usr/bin/env bash
# Khronos' SPIR-V validator new enough for every kernel: Debian 13's spirv-tools (2025),
# unpacked privately with its own C and C++ libraries (nothing of the system changes).
# Debian 12's spirv-tools (2023.1) predates SPV_KHR_cooperative_matrix and rejects the
# matrix kernels' capability. Prints the path of a `spirv-val` that runs it.
# Usage: scripts/spirv-tools.sh [DIR]   (default ~/.cache/wgllm-spirv-tools)
set -euo pipefail
dir=${1:-$HOME/.cache/wgllm-spirv-tools}
if [ ! -x "$dir/spirv-val" ]; then
  mkdir -p "$dir/lists/partial" "$dir/debs"
  cd "$dir"
  # The Debian mirror this machine already uses, with Debian 13's suite.
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || { echo "error: no Debian mirror in the apt sources; install spirv-tools 2024 or newer and set WGLLM_SPIRV_VAL" >&2; exit 1; }
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > sources.list
  A="-o Dir::Etc::sourcelist=$PWD/sources.list -o Dir::Etc::sourceparts=- -o Dir::State::Lists=$PWD/lists -o APT::Get::List-Cleanup=0"
  apt-get $A update -qq >/dev/null 2>&1
  (cd debs && apt-get $A download spirv-tools libc6 libstdc++6 libgcc-s1 >/dev/null 2>&1)
  for d in debs/*.deb; do dpkg-deb -x "$d" root; done
  r=$PWD/root
  cat > spirv-val <<SH
#!/bin/sh
exec $r/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path $r/usr/lib/x86_64-linux-gnu $r/usr/bin/spirv-val "\$@"
SH
  chmod +x spirv-val
  rm -rf debs lists
fi
"$dir/spirv-val" --version >/dev/null || { echo "error: $dir/spirv-val does not run" >&2; exit 1; }
echo "$dir/spirv-val"
