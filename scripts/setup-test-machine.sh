#!/usr/bin/env bash
# What README's test command needs besides Rust, on Debian or Ubuntu: lavapipe (software
# Vulkan) and llvmpipe through EGL (the op-test devices), Xvfb and the X libraries winit
# opens (the app's test), Chromium (its SwiftShader gives the browser page's test WebGPU),
# Python's venv and pip (llama.cpp's server tests; the model fetch). Installs what is
# missing where it can (root, or sudo without a password); otherwise stops at once with
# the one command to run. Elsewhere (no dpkg) it checks nothing: the tests say what fails.
set -euo pipefail
command -v dpkg-query >/dev/null || exit 0
pkgs=(mesa-vulkan-drivers libvulkan1 libegl1 libegl-mesa0 libgl1-mesa-dri
  xvfb xauth libx11-6 libx11-xcb1 libxcursor1 libxi6 libxrandr2 libxkbcommon-x11-0
  chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Python's pieces by what they do (the venv package's name carries the Python version).
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
[ ${#missing[@]} -eq 0 ] && exit 0
install="apt-get update && apt-get install -y ${missing[*]}"
if [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "error: the tests need packages this machine lacks; install them, then rerun:" >&2
  echo "  sudo sh -c '$install'" >&2
  exit 1
fi
echo "installing what the tests need: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
