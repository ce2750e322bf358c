// Adds the chunks' partial attention outputs of attn_kqv_split.wgsl:
// dst[i] = sum over s of part[s][i], i over [head_dim / 4 * n_head * n_tok] vec4s.

// `Params` is `AttnSumUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

// Workgroups are spread over x and y (a 7B's 4096-token ubatch has 4 M vec4s, more than
// 65535 workgroups of 64 on one axis).
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 64u + lid;
    if (i >= p.n) {
        return;
    }
    var s = part[i];
    for (var k = 1u; k < p.n_split; k++) {
        s += part[k * p.n + i];
    }
    dst[i] = s;
}
