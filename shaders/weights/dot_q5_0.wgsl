// Q5_0's integer-dot loader: codes 0..31 (5th bits in the second head word), head d
// (f16, low half); x = d q - 16 d.
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = five_bit_block(row, nb, b);
    let d = unpack2x16float(w[row + nb * 4u + 2u * b]).x;
    o.dm = vec2<f32>(d, -16.0 * d);
    return o;
}
