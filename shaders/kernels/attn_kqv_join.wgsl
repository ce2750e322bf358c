// Adds up the chunks of attn_kqv_tile.wgsl into the attention output:
// dst[i] = sum_s part[s][i], i over [head_dim / 4, n_head, n_tok] vec4s. The chunks
// summed probabilities that the softmax already normalised, so no rescaling is needed
// (attn_kqv_sum.wgsl's job for the split kernel's unnormalised chunks).

// `Params` is `AttnSumUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

// Workgroups are spread over x and y, as in attn_kqv_sum.wgsl.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 64u + lid;
    if (i >= p.n) {
        return;
    }
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < p.n_split; k++) {
        s += part[k * p.n + i];
    }
    dst[i] = s;
}
