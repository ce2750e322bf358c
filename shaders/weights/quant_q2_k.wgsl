// Q2_K, one 32-weight sub-block of a 256-weight file block in 4 words, all body (no head):
// [d, dmin (f16 pair)] [the file's two scale bytes: sc (low nibble), m (high nibble), for
// weights 0..15 then 16..31] [2-bit weights 0..15] [2-bit weights 16..31], weight i at
// bits 2i, 2i+1 of its word. x = (d sc) q - dmin m (both products exact in f32).
const QK: u32 = 32u;
const HW: u32 = 0u;
const BW: u32 = 4u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

// (d sc, -dmin m) of weights 0..15 in xy, of weights 16..31 in zw, of the body at b.
fn q2_dm(b: u32) -> vec4<f32> {
    let dm = unpack2x16float(bw(b, 0u));
    let s = bw(b, 1u);
    let v = vec4<f32>(vec4<u32>(s, s >> 4u, s >> 8u, s >> 12u) & vec4<u32>(15u));
    return v * vec4<f32>(dm.x, -dm.y, dm.x, -dm.y);
}

fn q2(v: u32, l: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(v >> l, v >> (l + 2u), v >> (l + 4u), v >> (l + 6u)) & vec4<u32>(3u));
}

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    let v0 = bw(k.b, 2u);
    let v1 = bw(k.b, 3u);
    for (var i = 0u; i < 4u; i++) {
        wb[o8 + i] = q2(v0, 8u * i);
        wb[o8 + i + 4u] = q2(v1, 8u * i);
    }
    return q2_dm(k.b);
}

fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    let k = blk(row, nb, j / 32u);
    let e = j % 32u;
    let q = (bw(k.b, 2u + e / 16u) >> (2u * (e % 16u))) & 3u;
    let s = q2_dm(k.b);
    return select(f32(q) * s.x + s.y, f32(q) * s.z + s.w, e >= 16u);
}

// A quarter block: weights 4q.. (wb slot q) and 16 + 4q.. (slot q + 4).
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let s = q2_dm(k.b);
    return Quarter(q2(bw(k.b, 2u), 8u * q) * s.x + s.y, q2(bw(k.b, 3u), 8u * q) * s.z + s.w, q, q + 4u);
}
