// q5_1 cache: groups of 12 words, [codes 0: 4][codes 1: 4][high bits 0][high bits 1]
// [d0 | m0][d1 | m1]; x = q d + m.
fn {{P}}_load4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    let g = (e >> 6u) * 12u;
    let s = (e >> 5u) & 1u;
    let j = e & 31u;
    let q = kv_nib4({{B}}[kv_nib_word(g, s, j)], kv_nib_shift(j)) | kv_hi4({{B}}[g + 8u + s], j);
    let dm = unpack2x16float({{B}}[g + 10u + s]);
    return vec4<f32>(q) * dm.x + dm.y;
}
// @store
fn {{P}}_store_block(b: u32, x: array<f32, 32>) {
    var xs = x;
    let mm = kv_min_max(x);
    let vmin = mm.x;
    let vmax = mm.y;
    let d = (vmax - vmin) / 31.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    let g = (b >> 1u) * 12u;
    let s = b & 1u;
    var qh = 0u;
    for (var w = 0u; w < 4u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let j = 4u * w + k;
            let lo = u32(clamp(i32((xs[j] - vmin) * id + 0.5), 0, 31));
            let hi = u32(clamp(i32((xs[j + 16u] - vmin) * id + 0.5), 0, 31));
            word |= ((lo & 15u) | ((hi & 15u) << 4u)) << (8u * k);
            qh |= ((lo >> 4u) << j) | ((hi >> 4u) << (j + 16u));
        }
        atomicStore(&{{B}}[g + 4u * s + w], word);
    }
    atomicStore(&{{B}}[g + 8u + s], qh);
    atomicStore(&{{B}}[g + 10u + s], pack2x16float(vec2<f32>(d, vmin)));
}
