// What softmax.wgsl and the split attention output kernel share: the masked value and
// the ALiBi slope of a head (1 without ALiBi), as ggml_soft_max_ext computes them. Both
// kernels' Params have max_bias, n_head_log2, m0 and m1.

const MASKED: f32 = -1e30;

fn alibi_slope(h: u32) -> f32 {
    if (p.max_bias <= 0.0) {
        return 1.0;
    }
    if (h < p.n_head_log2) {
        return pow(p.m0, f32(h + 1u));
    }
    return pow(p.m1, f32(2u * (h - p.n_head_log2) + 1u));
}
