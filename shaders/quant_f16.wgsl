// F16 weights, two per word (low half first): a "block" is 32 values (16 words).
const QK: u32 = 32u;
const WPB: u32 = 16u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn load_block(base: u32, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    for (var i = 0u; i < 8u; i++) {
        let o = base + 2u * i;
        wb[o8 + i] = vec4<f32>(unpack2x16float(w[o]), unpack2x16float(w[o + 1u]));
    }
    return vec4<f32>(1.0, 0.0, 1.0, 0.0);
}

fn deq_elem(row_base: u32, j: u32) -> f32 {
    return unpack2x16float(w[row_base + j / 2u])[j % 2u];
}

// A quarter block: values 8q..8q+7 (four words), wb slots 2q and 2q + 1.
fn load_quarter(base: u32, q: u32) -> Quarter {
    let o = base + 4u * q;
    return Quarter(
        vec4<f32>(unpack2x16float(w[o]), unpack2x16float(w[o + 1u])),
        vec4<f32>(unpack2x16float(w[o + 2u]), unpack2x16float(w[o + 3u])),
        2u * q,
        2u * q + 1u,
    );
}
