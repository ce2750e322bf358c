// Joins the chunks of attn_kqv_split.wgsl into the attention output: with each chunk's
// maximum m_s and weight sum l_s, M = max m_s and
// dst[i] = sum_s exp(m_s - M) part[s][i] / sum_s exp(m_s - M) l_s,
// i over [head_dim / 4, n_head, n_tok] vec4s; rows with every cell masked give 0, as
// the softmax does.

// `Params` is `AttnSumUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> stats: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<f32>>;

// Workgroups are spread over x and y (a 7B's 4096-token ubatch has 4 M vec4s, more than
// 65535 workgroups of 64 on one axis).
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 64u + lid;
    if (i >= p.n) {
        return;
    }
    // The (token, head) row of vec4 i; stats has one entry per row and chunk.
    let row = i / p.d4;
    let rows = p.n / p.d4;
    var mx = -1e30;
    for (var k = 0u; k < p.n_split; k++) {
        mx = max(mx, stats[k * rows + row].x);
    }
    var s = vec4<f32>(0.0);
    var l = 0.0;
    for (var k = 0u; k < p.n_split; k++) {
        let st = stats[k * rows + row];
        let f = exp(st.x - mx);
        s += f * part[k * p.n + i];
        l += f * st.y;
    }
    dst[i] = select(vec4<f32>(0.0), s / l, l > 0.0);
}
