// F32 weights: a "block" is 32 consecutive floats (32 words).
const QK: u32 = 32u;
const WPB: u32 = 32u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn load_block(base: u32, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    for (var i = 0u; i < 8u; i++) {
        let o = base + 4u * i;
        wb[o8 + i] = vec4<f32>(bitcast<f32>(w[o]), bitcast<f32>(w[o + 1u]), bitcast<f32>(w[o + 2u]), bitcast<f32>(w[o + 3u]));
    }
    return vec4<f32>(1.0, 0.0, 1.0, 0.0);
}

// Element j of the row whose first word is `row_base` (any j, not only whole blocks).
fn deq_elem(row_base: u32, j: u32) -> f32 {
    return bitcast<f32>(w[row_base + j]);
}

// A quarter block: values 8q..8q+7, wb slots 2q and 2q + 1.
fn load_quarter(base: u32, q: u32) -> Quarter {
    let o = base + 8u * q;
    return Quarter(
        bitcast<vec4<f32>>(vec4<u32>(w[o], w[o + 1u], w[o + 2u], w[o + 3u])),
        bitcast<vec4<f32>>(vec4<u32>(w[o + 4u], w[o + 5u], w[o + 6u], w[o + 7u])),
        2u * q,
        2u * q + 1u,
    );
}
