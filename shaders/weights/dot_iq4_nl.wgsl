// IQ4_NL's integer-dot loader: codes to their signed 8-bit levels, head d (f16, low
// half).
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = iq4_block(row, b);
    o.dm = vec2<f32>(unpack2x16float(w[row + nb * 4u + b]).x, 0.0);
    return o;
}
