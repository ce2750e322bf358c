// F32 weights: a "block" is 32 consecutive floats (32 words).
const QK: u32 = 32u;
const HW: u32 = 0u;
const BW: u32 = 32u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    for (var i = 0u; i < 8u; i++) {
        let o = 4u * i;
        wb[o8 + i] = bitcast<vec4<f32>>(vec4<u32>(bw(k.b, o), bw(k.b, o + 1u), bw(k.b, o + 2u), bw(k.b, o + 3u)));
    }
    return vec4<f32>(1.0, 0.0, 1.0, 0.0);
}

// Element j of the row whose first word is `row` (any j, not only whole blocks; no head).
fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    return bitcast<f32>(bw(row, j));
}

// A quarter block: values 8q..8q+7, wb slots 2q and 2q + 1.
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let o = 8u * q;
    return Quarter(
        bitcast<vec4<f32>>(vec4<u32>(bw(k.b, o), bw(k.b, o + 1u), bw(k.b, o + 2u), bw(k.b, o + 3u))),
        bitcast<vec4<f32>>(vec4<u32>(bw(k.b, o + 4u), bw(k.b, o + 5u), bw(k.b, o + 6u), bw(k.b, o + 7u))),
        2u * q,
        2u * q + 1u,
    );
}
