// IQ4_XS's integer-dot loader: codes to their signed 8-bit levels, head the
// sub-block's d (ls - 32) as f32.
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = iq4_block(row, b);
    o.dm = vec2<f32>(bitcast<f32>(w[row + nb * 4u + b]), 0.0);
    return o;
}
