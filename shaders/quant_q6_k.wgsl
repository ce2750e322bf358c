// Q6_K, one 32-weight sub-block of a 256-weight file block in 7 words:
// [d (f16, low half), sc0, sc1 (i8, bytes 2 and 3)] [low 4 bits: 4 words] [high 2 bits of
// weights 0..15] [high 2 bits of weights 16..31]. Nibble byte j holds weight j (low
// nibble) and weight j + 16 (high nibble); a high-bit word holds weight i at bits 2i, 2i+1.
// x = (d sc) (q - 32), with sc0 for weights 0..15 and sc1 for 16..31 (d sc is exact).
const QK: u32 = 32u;
const WPB: u32 = 7u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

// (d sc0, d sc1) of the block at `base`.
fn q6_scales(base: u32) -> vec2<f32> {
    let h = w[base];
    let d = unpack2x16float(h).x;
    return d * vec2<f32>(vec2<i32>(bitcast<i32>(h << 8u) >> 24u, bitcast<i32>(h) >> 24u));
}

// q - 32 for the four weights of nibble word `v` at nibble `shift`, high bits at `hs`.. of `h`.
fn q6(v: u32, shift: u32, h: u32, hs: u32) -> vec4<f32> {
    let lo = vec4<u32>(v >> shift, v >> (shift + 8u), v >> (shift + 16u), v >> (shift + 24u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(h >> hs, h >> (hs + 2u), h >> (hs + 4u), h >> (hs + 6u)) & vec4<u32>(3u)) << vec4<u32>(4u);
    return vec4<f32>(lo | hi) - 32.0;
}

fn load_block(base: u32, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    let h0 = w[base + 5u];
    let h1 = w[base + 6u];
    for (var i = 0u; i < 4u; i++) {
        let v = w[base + 1u + i];
        wb[o8 + i] = q6(v, 0u, h0, 8u * i);
        wb[o8 + i + 4u] = q6(v, 4u, h1, 8u * i);
    }
    let s = q6_scales(base);
    return vec4<f32>(s.x, 0.0, s.y, 0.0);
}

fn deq_elem(row_base: u32, j: u32) -> f32 {
    let base = row_base + (j / 32u) * WPB;
    let k = j % 32u;
    let byte = (w[base + 1u + (k % 16u) / 4u] >> (8u * (k % 4u))) & 0xFFu;
    let lo = select(byte & 15u, byte >> 4u, k >= 16u);
    let hi = (w[base + 5u + k / 16u] >> (2u * (k % 16u))) & 3u;
    let s = q6_scales(base);
    return select(s.x, s.y, k >= 16u) * (f32(lo | (hi << 4u)) - 32.0);
}

// A quarter block (nibble word q): weights 4q.. (wb slot q) and 16 + 4q.. (slot q + 4).
fn load_quarter(base: u32, q: u32) -> Quarter {
    let s = q6_scales(base);
    let v = w[base + 1u + q];
    return Quarter(q6(v, 0u, w[base + 5u], 8u * q) * s.x, q6(v, 4u, w[base + 6u], 8u * q) * s.y, q, q + 4u);
}
