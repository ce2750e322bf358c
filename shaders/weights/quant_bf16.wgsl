// BF16 weights, two per word (low half first): a "block" is 32 values (16 words).
const QK: u32 = 32u;
const HW: u32 = 0u;
const BW: u32 = 16u;

// The two values of a word: a bf16 is the high half of an f32.
fn bf2(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xFFFF0000u));
}

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    for (var i = 0u; i < 8u; i++) {
        let o = 2u * i;
        wb[o8 + i] = vec4<f32>(bf2(bw(k.b, o)), bf2(bw(k.b, o + 1u)));
    }
    return vec4<f32>(1.0, 0.0, 1.0, 0.0);
}

// Element j of the row whose first word is `row` (any j: BF16 rows may be ragged; no head).
fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    return bf2(bw(row, j / 2u))[j % 2u];
}

// A quarter block: values 8q..8q+7 (four words), wb slots 2q and 2q + 1.
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let o = 4u * q;
    return Quarter(
        vec4<f32>(bf2(bw(k.b, o)), bf2(bw(k.b, o + 1u))),
        vec4<f32>(bf2(bw(k.b, o + 2u)), bf2(bw(k.b, o + 3u))),
        2u * q,
        2u * q + 1u,
    );
}
