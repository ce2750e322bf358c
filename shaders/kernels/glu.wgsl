// Gated linear unit: dst[i] = glu_ACT(gate[i], up[i]), act(gate) * up (SwiGLU with SiLU,
// GeGLU with GELU, gpt-oss's clamped SwiGLU: see act.wgsl).
// With `p.pairs`, gate and up are one tensor of interleaved (gate, up) pairs, as a fused
// gate/up projection writes it (both bindings are that tensor): gate[2i], up[2i + 1].
// act.wgsl (silu, gelu) is prepended.

// `Params` is `GluUniform` in src/ops/glu.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    if (p.pairs != 0u) {
        dst[i] = glu_{{ACT}}(gate[2u * i], up[2u * i + 1u]);
    } else {
        dst[i] = glu_{{ACT}}(gate[i], up[i]);
    }
}
