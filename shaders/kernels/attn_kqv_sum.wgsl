// Joins the chunks of attn_kqv_split.wgsl into the attention output: with each chunk's
// maximum m_s and weight sum l_s, M = max m_s and
// dst[i] = sum_s exp(m_s - M) part[s][i] / sum_s exp(m_s - M) l_s,
// i over [head_dim / 4, n_head, n_tok] vec4s; rows with every cell masked give 0, as
// the softmax does. With p.has_sinks, the head's sink logit joins as one more chunk of
// weight 1 and no value (gpt-oss's attention sinks).

// Chunks whose loads one step issues together.
const U: u32 = 8u;

// `Params` is `AttnSumUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> stats: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> sinks: array<f32>;

// Workgroups are spread over x and y (a 7B's 4096-token ubatch has 4 M vec4s, more than
// 65535 workgroups of 64 on one axis).
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 64u + lid;
    if (i >= p.n) {
        return;
    }
    // The (token, head) row of vec4 i; stats has one entry per row and chunk. One pass
    // with a running maximum (the sums rescaled when it grows), U chunks a step with
    // their loads issued together: a decoded token's join is a few hundred
    // invocations, so its time is the number of dependent memory round trips.
    let row = i / p.d4;
    let rows = p.n / p.d4;
    let last = p.n_split - 1u;
    var mx = -1e30;
    var s = vec4<f32>(0.0);
    var l = 0.0;
    if (p.has_sinks != 0u) {
        mx = sinks[row % p.n_head];
        l = 1.0;
    }
    for (var k0 = 0u; k0 < p.n_split; k0 += U) {
        var st: array<vec2<f32>, U>;
        var pt: array<vec4<f32>, U>;
        for (var u = 0u; u < U; u++) {
            let k = min(k0 + u, last);
            st[u] = stats[k * rows + row];
            pt[u] = part[k * p.n + i];
        }
        for (var u = 0u; u < U; u++) {
            if (k0 + u < p.n_split) {
                // Read whole: a component of a variable's element is read through a
                // pointer in Tint's output, which kept `st` in memory on SwiftShader.
                let su = st[u];
                let m = max(mx, su.x);
                let old = exp(mx - m);
                let f = exp(su.x - m);
                s = s * old + f * pt[u];
                l = l * old + f * su.y;
                mx = m;
            }
        }
    }
    dst[i] = select(vec4<f32>(0.0), s / l, l > 0.0);
}
