// F16 weights, two per word (low half first): a "block" is 32 values (16 words).
const QK: u32 = 32u;
const WPB: u32 = 16u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn load_block(base: u32, slot: u32) {
    let o8 = slot * 8u;
    for (var i = 0u; i < 8u; i++) {
        let o = base + 2u * i;
        wb[o8 + i] = vec4<f32>(unpack2x16float(w[o]), unpack2x16float(w[o + 1u]));
    }
}

fn deq_elem(row_base: u32, j: u32) -> f32 {
    return unpack2x16float(w[row_base + j / 2u])[j % 2u];
}
