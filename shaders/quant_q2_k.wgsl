// Q2_K, one 32-weight sub-block of a 256-weight file block in 4 words:
// [d, dmin (f16 pair)] [the file's two scale bytes: sc (low nibble), m (high nibble), for
// weights 0..15 then 16..31] [2-bit weights 0..15] [2-bit weights 16..31], weight i at
// bits 2i, 2i+1 of its word. x = (d sc) q - dmin m (both products exact in f32).
const QK: u32 = 32u;
const WPB: u32 = 4u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

// (d sc, -dmin m) of weights 0..15 in xy, of weights 16..31 in zw.
fn q2_dm(base: u32) -> vec4<f32> {
    let dm = unpack2x16float(w[base]);
    let s = w[base + 1u];
    let v = vec4<f32>(vec4<u32>(s, s >> 4u, s >> 8u, s >> 12u) & vec4<u32>(15u));
    return v * vec4<f32>(dm.x, -dm.y, dm.x, -dm.y);
}

fn q2(v: u32, l: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(v >> l, v >> (l + 2u), v >> (l + 4u), v >> (l + 6u)) & vec4<u32>(3u));
}

fn load_block(base: u32, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    let v0 = w[base + 2u];
    let v1 = w[base + 3u];
    for (var i = 0u; i < 4u; i++) {
        wb[o8 + i] = q2(v0, 8u * i);
        wb[o8 + i + 4u] = q2(v1, 8u * i);
    }
    return q2_dm(base);
}

fn deq_elem(row_base: u32, j: u32) -> f32 {
    let base = row_base + (j / 32u) * WPB;
    let k = j % 32u;
    let q = (w[base + 2u + k / 16u] >> (2u * (k % 16u))) & 3u;
    let s = q2_dm(base);
    return select(f32(q) * s.x + s.y, f32(q) * s.z + s.w, k >= 16u);
}

// A quarter block: weights 4q.. (wb slot q) and 16 + 4q.. (slot q + 4).
fn load_quarter(base: u32, q: u32) -> Quarter {
    let s = q2_dm(base);
    return Quarter(q2(w[base + 2u], 8u * q) * s.x + s.y, q2(w[base + 3u], 8u * q) * s.z + s.w, q, q + 4u);
}
