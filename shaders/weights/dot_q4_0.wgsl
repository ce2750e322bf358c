// Q4_0's integer-dot loader: codes 0..15, head d (f16, low half); x = d q - 8 d.
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let d = unpack2x16float(w[row + nb * 4u + b]).x;
    o.dm = vec2<f32>(d, -8.0 * d);
    return o;
}
