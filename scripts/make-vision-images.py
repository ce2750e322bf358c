#!/usr/bin/env python3
"""Writes the test images of tests/vision.rs (PNG, RGB, 8-bit) into DIR: three sizes and
aspect ratios that take llama.cpp's preprocessing through its three cases (already the
encoder's square, downscaled and letterboxed, upscaled and letterboxed). Pure Python, so
the same bytes come out anywhere."""
import struct, sys, zlib, math

def png(path, w, h, pixel):
    def row(y):
        raw = [v for x in range(w) for v in pixel(x, y)]
        # PNG's Sub filter: each byte less the one a pixel to its left (smaller files).
        return b"\1" + bytes((raw[i] - (raw[i - 3] if i >= 3 else 0)) & 0xff for i in range(len(raw)))
    rows = b"".join(row(y) for y in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    data += chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    open(path, "wb").write(data)

def pattern(seed):
    def pixel(x, y):
        # Waves, a ramp, a ring and a checkerboard: structure at several scales.
        r = int(127 + 120 * math.sin((x + 3 * seed) / 11.0))
        g = (y * 3 + x) % 256
        ring = math.hypot(x - 60, y - 50)
        b = 230 if 20 < ring < 35 else 40 + 80 * (((x // (4 + seed)) + (y // 6)) % 2)
        return (r, g, b)
    return pixel

out = sys.argv[1] if len(sys.argv) > 1 else "."
for name, w, h, seed in [("square-224", 224, 224, 1), ("wide-300x180", 300, 180, 2), ("tall-100x150", 100, 150, 3)]:
    png(f"{out}/{name}.png", w, h, pattern(seed))
