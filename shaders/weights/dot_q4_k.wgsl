// Q4_K's integer-dot loader: a 32-weight sub-block's f32 head [d sc] [-(dmin m)] is
// its (scale, offset); codes 0..15.
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let h = row + nb * 4u + 2u * b;
    o.dm = vec2<f32>(bitcast<f32>(w[h]), bitcast<f32>(w[h + 1u]));
    return o;
}
