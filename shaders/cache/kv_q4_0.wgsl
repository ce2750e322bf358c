// q4_0 cache: groups of 9 words, [codes of block 0: 4][codes of block 1: 4][d0 | d1];
// byte j of a block's codes holds value j (low nibble) and j + 16 (high); x = (q - 8) d.
fn {{P}}_load4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    let g = (e >> 6u) * 9u;
    let s = (e >> 5u) & 1u;
    let j = e & 31u;
    let q = kv_nib4({{B}}[kv_nib_word(g, s, j)], kv_nib_shift(j));
    return (vec4<f32>(q) - 8.0) * unpack2x16float({{B}}[g + 8u])[s];
}
// @store
fn {{P}}_store_block(b: u32, x: array<f32, 32>) {
    var xs = x;
    let d = kv_signed_absmax(x) / -8.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    let g = (b >> 1u) * 9u;
    let s = b & 1u;
    for (var w = 0u; w < 4u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let j = 4u * w + k;
            let lo = u32(clamp(i32(xs[j] * id + 8.5), 0, 15));
            let hi = u32(clamp(i32(xs[j + 16u] * id + 8.5), 0, 15));
            word |= (lo | (hi << 4u)) << (8u * k);
        }
        atomicStore(&{{B}}[g + 4u * s + w], word);
    }
    atomicAnd(&{{B}}[g + 8u], select(0xFFFF0000u, 0x0000FFFFu, s == 1u));
    atomicOr(&{{B}}[g + 8u], kv_f16(d) << (16u * s));
}
