// Body shared by the 4-bit formats whose codes index a table of levels (IQ4_NL, IQ4_XS,
// MXFP4), after a header that sets QK, HW (1), BW (4), `NL_LEVELS` (the 16 levels as
// signed bytes, four to a word: level i in byte i % 4 of word i / 4) and `iq4_d(h)`, the
// block's scale from its head. The body's 4 words are its nibbles (byte j: weight j in the
// low nibble, weight j + 16 in the high one); x = d level.

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn iq4_level(i: u32) -> f32 {
    return f32(bitcast<i32>(NL_LEVELS[i >> 2u] << (24u - 8u * (i & 3u))) >> 24u);
}

fn iq4(v: u32, shift: u32) -> vec4<f32> {
    let n = vec4<u32>(v >> shift, v >> (shift + 8u), v >> (shift + 16u), v >> (shift + 24u)) & vec4<u32>(15u);
    return vec4<f32>(iq4_level(n.x), iq4_level(n.y), iq4_level(n.z), iq4_level(n.w));
}

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    for (var i = 0u; i < 4u; i++) {
        let q = bw(k.b, i);
        wb[o8 + i] = iq4(q, 0u);
        wb[o8 + i + 4u] = iq4(q, 4u);
    }
    let d = iq4_d(k.h);
    return vec4<f32>(d, 0.0, d, 0.0);
}

fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    let k = blk(row, nb, j / 32u);
    let e = j % 32u;
    let byte = (bw(k.b, (e % 16u) / 4u) >> (8u * (e % 4u))) & 0xFFu;
    return iq4_level(select(byte & 15u, byte >> 4u, e >= 16u)) * iq4_d(k.h);
}

// A quarter block (nibble word q): its 8 weights, which land in wb slots q (low nibbles)
// and q + 4 (high nibbles).
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let d = iq4_d(k.h);
    let v = bw(k.b, q);
    return Quarter(iq4(v, 0u) * d, iq4(v, 4u) * d, q, q + 4u);
}
