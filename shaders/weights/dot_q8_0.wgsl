// Q8_0's integer-dot loader: the file's signed bytes as they are, head d (f16, low half).
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o: WBlock;
    for (var i = 0u; i < 8u; i++) {
        o.q[i] = w[row + b * 8u + i];
    }
    o.dm = vec2<f32>(unpack2x16float(w[row + nb * 8u + b]).x, 0.0);
    return o;
}
