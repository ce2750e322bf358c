// The activations of the gated feed-forward, shared by glu.wgsl and the matmul kernels'
// fused GLU epilogue (silu, gelu), and each gated unit as glu.wgsl computes it.

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// The tanh approximation of GELU, written with exp so large |v| cannot overflow tanh.
fn gelu(v: f32) -> f32 {
    let u = 0.7978845608028654 * v * (1.0 + 0.044715 * v * v);
    return v / (1.0 + exp(-2.0 * u));
}

// gpt-oss's gate: clamped from above at 7, then x sigmoid(1.702 x).
fn swiglu_oai(v: f32) -> f32 {
    let x = min(v, 7.0);
    return x / (1.0 + exp(-1.702 * x));
}

fn glu_silu(g: f32, u: f32) -> f32 {
    return silu(g) * u;
}

fn glu_gelu(g: f32, u: f32) -> f32 {
    return gelu(g) * u;
}

// gpt-oss's up value is clamped to [-7, 7] and offset by 1.
fn glu_swiglu_oai(g: f32, u: f32) -> f32 {
    return swiglu_oai(g) * (clamp(u, -7.0, 7.0) + 1.0);
}
