// iq4_nl cache: q4_0's groups of 9 words; each code selects one of 16 levels, x = d level.
fn {{P}}_load4(i: u32) -> vec4<f32> {
    let e = 4u * i;
    let g = (e >> 6u) * 9u;
    let s = (e >> 5u) & 1u;
    let j = e & 31u;
    let q = kv_nib4({{B}}[kv_nib_word(g, s, j)], kv_nib_shift(j));
    let l = vec4<f32>(kv_iq4_level(q.x), kv_iq4_level(q.y), kv_iq4_level(q.z), kv_iq4_level(q.w));
    return l * unpack2x16float({{B}}[g + 8u])[s];
}
// @store
// As llama.cpp's Vulkan write: d = max / -127, nearest levels, then d refitted by least
// squares weighted by x².
fn {{P}}_store_block(b: u32, x: array<f32, 32>) {
    var xs = x;
    var d = kv_signed_absmax(x) / kv_iq4_level(0u);
    let id = select(0.0, 1.0 / d, d != 0.0);
    let g = (b >> 1u) * 9u;
    let s = b & 1u;
    var sumqx = 0.0;
    var sumq2 = 0.0;
    for (var w = 0u; w < 4u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let j = 4u * w + k;
            let lo = kv_iq4_nearest(xs[j] * id);
            let hi = kv_iq4_nearest(xs[j + 16u] * id);
            word |= (lo | (hi << 4u)) << (8u * k);
            let v0 = kv_iq4_level(lo);
            let v1 = kv_iq4_level(hi);
            let w0 = xs[j] * xs[j];
            let w1 = xs[j + 16u] * xs[j + 16u];
            sumqx += w0 * v0 * xs[j] + w1 * v1 * xs[j + 16u];
            sumq2 += w0 * v0 * v0 + w1 * v1 * v1;
        }
        atomicStore(&{{B}}[g + 4u * s + w], word);
    }
    d = select(d, sumqx / sumq2, sumq2 > 0.0);
    atomicAnd(&{{B}}[g + 8u], select(0xFFFF0000u, 0x0000FFFFu, s == 1u));
    atomicOr(&{{B}}[g + 8u], kv_f16(d) << (16u * s));
}
