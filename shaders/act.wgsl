// The activations of the gated feed-forward, shared by glu.wgsl and the matmul kernels'
// fused GLU epilogue.

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// The tanh approximation of GELU, written with exp so large |v| cannot overflow tanh.
fn gelu(v: f32) -> f32 {
    let u = 0.7978845608028654 * v * (1.0 + 0.044715 * v * v);
    return v / (1.0 + exp(-2.0 * u));
}
