#!/usr/bin/env python3
"""Writes the real-block fixtures of tests/quant.rs: for each weight type, 2048 weights of
real llama-quantize output and their values as the PyPI `gguf` package (gguf-py, numpy)
dequantizes them, a decoder independent of wgllm's.

    pip install gguf
    scripts/make-quant-fixtures.py --gemma gemma-3-270m-q4_k_m.gguf --requantized DIR

DIR holds gemma-3-270m requantized by llama.cpp's llama-quantize, one file per type:

    for t in Q2_K Q3_K_S Q5_K_S IQ4_NL IQ4_XS BF16; do
      llama-quantize --allow-requantize --pure gemma-3-270m-q4_k_m.gguf DIR/gemma-$t.gguf $t
    done

(--pure keeps the type on every tensor whose rows are whole blocks of it.) Q4_K and Q6_K
blocks come from the Q4_K_M file itself. MXFP4 is for experts only (llama-quantize's
MXFP4_MOE), so its blocks come from a mixture-of-experts file given by --moe:

    wgllm synth --arch qwen3moe --shape tiny --type f32 --trained-scale -o moe-f32.gguf
    llama-quantize moe-f32.gguf moe-MXFP4.gguf MXFP4_MOE
    scripts/make-quant-fixtures.py --moe moe-MXFP4.gguf --types MXFP4

--types limits the run to those types, keeping the other lines of MANIFEST.

For each type the script takes one tensor and 8 chunks of 256 weights (whole blocks:
one k-quant block, eight 32-weight blocks, 256 BF16 values) at evenly spaced places in
it, and writes into tests/data/quant/:

    <TYPE>.bin   the chunks' file bytes, in order
    <TYPE>.f32   their 2048 values from gguf.quants.dequantize, little-endian f32
    MANIFEST     one line per type: type, source file, tensor, chunk offsets (weights)
"""

import argparse
import os
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize
from gguf.constants import GGML_QUANT_SIZES

CHUNK = 256
CHUNKS = 8

# type -> (file key, preferred tensor): ffn_down rows are 2048 wide, whole k-quant blocks.
SOURCES = {
    T.Q2_K: ("Q2_K", "blk.5.ffn_down.weight"),
    T.Q3_K: ("Q3_K_S", "blk.5.ffn_down.weight"),
    T.Q4_K: (None, "blk.5.attn_output.weight"),
    T.Q5_K: ("Q5_K_S", "blk.5.ffn_down.weight"),
    T.Q6_K: (None, "blk.4.ffn_down.weight"),
    T.BF16: ("BF16", "blk.5.ffn_up.weight"),
    T.IQ4_NL: ("IQ4_NL", "blk.5.ffn_up.weight"),
    T.IQ4_XS: ("IQ4_XS", "blk.5.ffn_down.weight"),
    T.MXFP4: ("moe", "blk.1.ffn_down_exps.weight"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemma", help="gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--requantized", help="directory of gemma-<TYPE>.gguf")
    ap.add_argument("--moe", help="a mixture-of-experts file whose experts are MXFP4")
    ap.add_argument("--types", help="only these types (comma-separated), keeping MANIFEST's other lines")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = args.types.split(",") if args.types else [t.name for t in SOURCES]
    kept = {}
    mpath = os.path.join(args.out, "MANIFEST")
    if args.types and os.path.exists(mpath):
        for line in open(mpath):
            if not line.startswith("#") and line.split()[0] not in only:
                kept[line.split()[0]] = line.rstrip("\n")
    manifest = []
    for ty, (key, name) in SOURCES.items():
        if ty.name not in only:
            if ty.name in kept:
                manifest.append(kept[ty.name])
            continue
        if key == "moe":
            path = args.moe
        elif key is None:
            path = args.gemma
        else:
            path = os.path.join(args.requantized, f"gemma-{key}.gguf")
        if path is None:
            sys.exit(f"{ty.name}: give --moe, or --gemma and --requantized")
        reader = GGUFReader(path)
        t = next((t for t in reader.tensors if t.name == name), None)
        if t is None or t.tensor_type != ty:
            sys.exit(f"{path}: {name} is not {ty.name}")
        block_w, block_b = GGML_QUANT_SIZES[ty]
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        n_weights = raw.size // block_b * block_w
        per_chunk = CHUNK // block_w * block_b
        starts = [i * (n_weights // CHUNK - 1) // (CHUNKS - 1) * CHUNK for i in range(CHUNKS)]
        blocks = np.concatenate([raw[s // block_w * block_b:][:per_chunk] for s in starts])
        values = dequantize(blocks, ty).astype("<f4").reshape(-1)
        assert values.size == CHUNK * CHUNKS, values.size
        blocks.tofile(os.path.join(args.out, f"{ty.name}.bin"))
        values.tofile(os.path.join(args.out, f"{ty.name}.f32"))
        manifest.append(f"{ty.name} {os.path.basename(path)} {name} {' '.join(map(str, starts))}")
        print(manifest[-1], f"({blocks.size} bytes)")
    with open(os.path.join(args.out, "MANIFEST"), "w") as f:
        f.write("# type, source file, tensor, offsets (in weights) of the 8 chunks of 256 weights\n")
        f.write("# written by scripts/make-quant-fixtures.py; values from gguf-py's dequantize\n")
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
