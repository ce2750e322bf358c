// Q3_K, one 32-weight sub-block of a 256-weight file block in 4 words, all body (no head):
// [d (f16, low half), sc0, sc1 (6-bit, bits 16.. and 24..)] [low 2 bits of weights 0..15]
// [low 2 bits of weights 16..31] [3rd bits: bit i for weight i]. A 2-bit word holds
// weight i at bits 2i, 2i+1. x = (d (sc - 32)) (q - 4), q the 3-bit value, with sc0 for
// weights 0..15 and sc1 for 16..31 (the file's 3rd bit set means q >= 4).
const QK: u32 = 32u;
const HW: u32 = 0u;
const BW: u32 = 4u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

// (d (sc0 - 32), d (sc1 - 32)) of the block whose body is at b.
fn q3_scales(b: u32) -> vec2<f32> {
    let h = bw(b, 0u);
    let sc = vec2<i32>(vec2<u32>((h >> 16u) & 63u, (h >> 24u) & 63u)) - vec2<i32>(32);
    return unpack2x16float(h).x * vec2<f32>(sc);
}

// q - 4 for the weights at bits l.. of 2-bit word `lo` and bits t.. of 3rd-bit word `hb`.
fn q3(lo: u32, l: u32, hb: u32, t: u32) -> vec4<f32> {
    let q = vec4<u32>(lo >> l, lo >> (l + 2u), lo >> (l + 4u), lo >> (l + 6u)) & vec4<u32>(3u);
    let h = (vec4<u32>(hb >> t, hb >> (t + 1u), hb >> (t + 2u), hb >> (t + 3u)) & vec4<u32>(1u)) << vec4<u32>(2u);
    return vec4<f32>(q | h) - 4.0;
}

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    let l0 = bw(k.b, 1u);
    let l1 = bw(k.b, 2u);
    let hb = bw(k.b, 3u);
    for (var i = 0u; i < 4u; i++) {
        wb[o8 + i] = q3(l0, 8u * i, hb, 4u * i);
        wb[o8 + i + 4u] = q3(l1, 8u * i, hb, 16u + 4u * i);
    }
    let s = q3_scales(k.b);
    return vec4<f32>(s.x, 0.0, s.y, 0.0);
}

fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    let k = blk(row, nb, j / 32u);
    let e = j % 32u;
    let lo = (bw(k.b, 1u + e / 16u) >> (2u * (e % 16u))) & 3u;
    let hi = (bw(k.b, 3u) >> e) & 1u;
    let s = q3_scales(k.b);
    return select(s.x, s.y, e >= 16u) * (f32(lo | (hi << 2u)) - 4.0);
}

// A quarter block: weights 4q.. (wb slot q) and 16 + 4q.. (slot q + 4).
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let s = q3_scales(k.b);
    let hb = bw(k.b, 3u);
    return Quarter(q3(bw(k.b, 1u), 8u * q, hb, 4u * q) * s.x, q3(bw(k.b, 2u), 8u * q, hb, 16u + 4u * q) * s.y, q, q + 4u);
}
