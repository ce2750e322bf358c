// Q8_0: head [d (f16, low half)], body [qs: 8 words of i8]; x = q d.
const QK: u32 = 32u;
const HW: u32 = 1u;
const BW: u32 = 8u;

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn bytes_i8(q: u32) -> vec4<f32> {
    let v = bitcast<vec4<i32>>(vec4<u32>(q << 24u, q << 16u, q << 8u, q)) >> vec4<u32>(24u);
    return vec4<f32>(v);
}

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    for (var i = 0u; i < 8u; i++) {
        wb[o8 + i] = bytes_i8(bw(k.b, i));
    }
    let d = unpack2x16float(hw(k.h)).x;
    return vec4<f32>(d, 0.0, d, 0.0);
}

fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    let k = blk(row, nb, j / 32u);
    let e = j % 32u;
    let q = bitcast<i32>(bw(k.b, e / 4u) << (24u - 8u * (e % 4u))) >> 24u;
    return f32(q) * unpack2x16float(hw(k.h)).x;
}

// A quarter block: weights 8q..8q+7 (two qs words), wb slots 2q and 2q + 1.
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let d = unpack2x16float(hw(k.h)).x;
    return Quarter(bytes_i8(bw(k.b, 2u * q)) * d, bytes_i8(bw(k.b, 2u * q + 1u)) * d, 2u * q, 2u * q + 1u);
}
