// Shared by the packed K/V cache types (kv_<type>.wgsl; the layout is described in
// src/kv/kv_type.rs). Each type's file has a load part, `{{P}}_load4(i)`: logical vec4 i
// of the cache binding `{{B}}` (values 4i..4i+3 of [head_dim, n_head_kv, cells]) as f32,
// and after the `// @store` line a store part, `{{P}}_store_block(b, x)`: the 32 values
// `x` quantized into block b of `{{B}}`, bound as atomic<u32> so that two blocks sharing
// a scale word can be written by different workgroups (each clears and sets its own half).

// Four signed bytes of a word, low byte first.
fn kv_i8x4(q: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(q << 24u, q << 16u, q << 8u, q)) >> vec4<u32>(24u));
}

// The nibbles of a word's four bytes at shift `sh` (0: low nibbles, 4: high ones).
fn kv_nib4(q: u32, sh: u32) -> vec4<u32> {
    return (vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u) >> vec4<u32>(sh)) & vec4<u32>(15u);
}

// Bits e..e+3 of a block's high-bit word, as the fifth bit (16) of four codes.
fn kv_hi4(qh: u32, e: u32) -> vec4<u32> {
    return ((vec4<u32>(qh) >> (vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

// The word of a 4-bit block's codes holding values j..j+3 of block s of the group at g
// (codes first, 4 words a block; byte j & 15 holds value j in its low nibble, j + 16 in
// its high one), and the shift to those nibbles.
fn kv_nib_word(g: u32, s: u32, j: u32) -> u32 {
    return g + 4u * s + ((j & 15u) >> 2u);
}

fn kv_nib_shift(j: u32) -> u32 {
    return select(0u, 4u, j >= 16u);
}

// (min, max) of a block, for the types with an offset (q4_1, q5_1).
fn kv_min_max(x: array<f32, 32>) -> vec2<f32> {
    var xs = x;
    var r = vec2<f32>(xs[0], xs[0]);
    for (var j = 1u; j < 32u; j++) {
        r = vec2<f32>(min(r.x, xs[j]), max(r.y, xs[j]));
    }
    return r;
}

// C's roundf: halves away from zero.
fn kv_round(x: f32) -> f32 {
    return sign(x) * floor(abs(x) + 0.5);
}

// The f16 bits of x in the low half of a word.
fn kv_f16(x: f32) -> u32 {
    return pack2x16float(vec2<f32>(x, 0.0)) & 0xFFFFu;
}

// The value of largest magnitude (sign kept; the first of equal magnitudes).
fn kv_signed_absmax(x: array<f32, 32>) -> f32 {
    var xs = x;
    var amax = 0.0;
    var vmax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        if (amax < abs(xs[j])) {
            amax = abs(xs[j]);
            vmax = xs[j];
        }
    }
    return vmax;
}

// IQ4_NL's 16 levels, four signed bytes per word.
const KV_IQ4_LEVELS = vec4<u32>(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);

fn kv_iq4_level(i: u32) -> f32 {
    return f32(bitcast<i32>(KV_IQ4_LEVELS[i >> 2u] << (24u - 8u * (i & 3u))) >> 24u);
}

// The level nearest x (ties to the lower), by bisection as llama.cpp's Vulkan write does.
fn kv_iq4_nearest(x: f32) -> u32 {
    if (x <= kv_iq4_level(0u)) {
        return 0u;
    }
    if (x >= kv_iq4_level(15u)) {
        return 15u;
    }
    var lo = 0u;
    var hi = 15u;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (x < kv_iq4_level(mid)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return select(hi, hi - 1u, x - kv_iq4_level(hi - 1u) < kv_iq4_level(hi) - x);
}

// ggml's f32 -> bf16 (nearest even; NaN stays NaN).
fn kv_bf16(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    if (x != x) {
        return (u >> 16u) | 64u;
    }
    return (u + (0x7FFFu + ((u >> 16u) & 1u))) >> 16u;
}
