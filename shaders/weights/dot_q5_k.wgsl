// Q5_K's integer-dot loader: Q4_K's head, then the sub-block's 5th bits (bit j: weight
// j); codes 0..31.
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let h = row + nb * 4u + 3u * b;
    let fifth = w[h + 2u];
    for (var i = 0u; i < 4u; i++) {
        o.q[i] |= fifth_bits(fifth, 4u * i);
        o.q[i + 4u] |= fifth_bits(fifth, 16u + 4u * i);
    }
    o.dm = vec2<f32>(bitcast<f32>(w[h]), bitcast<f32>(w[h + 1u]));
    return o;
}
