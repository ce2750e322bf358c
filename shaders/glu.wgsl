// Gated linear unit: dst[i] = act(gate[i]) * up[i] (SwiGLU with SiLU, GeGLU with GELU).

// `Params` is `GluUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// The tanh approximation of GELU, written with exp so large |v| cannot overflow tanh.
fn gelu(v: f32) -> f32 {
    let u = 0.7978845608028654 * v * (1.0 + 0.044715 * v * v);
    return v / (1.0 + exp(-2.0 * u));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    dst[i] = {{ACT}}(gate[i]) * up[i];
}
