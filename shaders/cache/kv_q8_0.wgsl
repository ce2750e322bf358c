// q8_0 cache: groups of 17 words, [codes of block 0: 8][codes of block 1: 8][d0 | d1].
fn {{P}}_load4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    let g = (e >> 6u) * 17u;
    let s = (e >> 5u) & 1u;
    return kv_i8x4({{B}}[g + 8u * s + ((e & 31u) >> 2u)]) * unpack2x16float({{B}}[g + 16u])[s];
}
// @store
fn {{P}}_store_block(b: u32, x: array<f32, 32>) {
    var xs = x;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(xs[j]));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    let g = (b >> 1u) * 17u;
    let s = b & 1u;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = i32(kv_round(xs[4u * w + k] * id));
            word |= (bitcast<u32>(q) & 0xFFu) << (8u * k);
        }
        atomicStore(&{{B}}[g + 8u * s + w], word);
    }
    atomicAnd(&{{B}}[g + 16u], select(0xFFFF0000u, 0x0000FFFFu, s == 1u));
    atomicOr(&{{B}}[g + 16u], kv_f16(d) << (16u * s));
}
