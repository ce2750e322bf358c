// Q6_K, one 32-weight sub-block of a 256-weight file block: head [d (f16, low half), sc0,
// sc1 (i8, bytes 2 and 3)] [high 2 bits of weights 0..15] [high 2 bits of weights
// 16..31], body [low 4 bits: 4 words]. Nibble byte j holds weight j (low nibble) and
// weight j + 16 (high nibble); a high-bit word holds weight i at bits 2i, 2i+1.
// x = (d sc) (q - 32), with sc0 for weights 0..15 and sc1 for 16..31 (d sc is exact).
const QK: u32 = 32u;
const HW: u32 = 3u;
const BW: u32 = 4u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

// (d sc0, d sc1) of the block whose head is at word h.
fn q6_scales(h: u32) -> vec2<f32> {
    let v = hw(h);
    let d = unpack2x16float(v).x;
    return d * vec2<f32>(vec2<i32>(bitcast<i32>(v << 8u) >> 24u, bitcast<i32>(v) >> 24u));
}

// q - 32 for the four weights of nibble word `v` at nibble `shift`, high bits at `hs`.. of `h`.
fn q6(v: u32, shift: u32, h: u32, hs: u32) -> vec4<f32> {
    let lo = vec4<u32>(v >> shift, v >> (shift + 8u), v >> (shift + 16u), v >> (shift + 24u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(h >> hs, h >> (hs + 2u), h >> (hs + 4u), h >> (hs + 6u)) & vec4<u32>(3u)) << vec4<u32>(4u);
    return vec4<f32>(lo | hi) - 32.0;
}

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    let h0 = hw(k.h + 1u);
    let h1 = hw(k.h + 2u);
    for (var i = 0u; i < 4u; i++) {
        let v = bw(k.b, i);
        wb[o8 + i] = q6(v, 0u, h0, 8u * i);
        wb[o8 + i + 4u] = q6(v, 4u, h1, 8u * i);
    }
    let s = q6_scales(k.h);
    return vec4<f32>(s.x, 0.0, s.y, 0.0);
}

fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    let k = blk(row, nb, j / 32u);
    let e = j % 32u;
    let byte = (bw(k.b, (e % 16u) / 4u) >> (8u * (e % 4u))) & 0xFFu;
    let lo = select(byte & 15u, byte >> 4u, e >= 16u);
    let hi = (hw(k.h + 1u + e / 16u) >> (2u * (e % 16u))) & 3u;
    let s = q6_scales(k.h);
    return select(s.x, s.y, e >= 16u) * (f32(lo | (hi << 4u)) - 32.0);
}

// A quarter block (nibble word q): weights 4q.. (wb slot q) and 16 + 4q.. (slot q + 4).
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let s = q6_scales(k.h);
    let v = bw(k.b, q);
    return Quarter(q6(v, 0u, hw(k.h + 1u), 8u * q) * s.x, q6(v, 4u, hw(k.h + 2u), 8u * q) * s.y, q, q + 4u);
}
