// What softmax.wgsl and the attention kernels that take the softmax share: the masked
// value, the ALiBi slope of a head (1 without ALiBi), as ggml_soft_max_ext computes them,
// and Gemma 2's logit soft-capping. Their Params have max_bias, n_head_log2, m0, m1 and
// softcap.

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

// A scaled score soft-capped: softcap tanh(v / softcap), or v where softcap is 0. tanh is
// written with exp, whose overflow to infinity still gives +-1 (tanh itself returns NaN for
// large arguments on some drivers).
fn capped(v: f32) -> f32 {
    if (p.softcap <= 0.0) {
        return v;
    }
    let t = 1.0 - 2.0 / (exp(2.0 * v / p.softcap) + 1.0);
    return p.softcap * t;
}
