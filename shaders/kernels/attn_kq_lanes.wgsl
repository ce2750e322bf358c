// Attention scores on GPUs, as attn_kq.wgsl computes them (kq[h][t][c] = dot(q[t][h],
// k[c][h / (n_head / n_head_kv)]), TB tokens per invocation, cells every token's mask
// hides left uncomputed), with LANES consecutive invocations per cell: each reads NK
// vec4s of the key, at lane, lane + LANES, ..., so a subgroup's loads cover whole key
// rows of consecutive words (one invocation per cell reads words a cache row apart, a
// head's K a cache row of n_head_kv heads), all issued before any is used; the lanes'
// partial dot products are added through workgroup memory. After attn_kq_io.wgsl (the
// bindings).

const TB: u32 = {{TB}}u;
const NK: u32 = {{NK}}u;
const LANES: u32 = {{LANES}}u;
const CELLS: u32 = 64u / LANES;

var<workgroup> red: array<f32, 64 * TB>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let c = wid.x * CELLS + lid / LANES;
    let t0 = wid.y * TB;
    let h = wid.z;
    // Lanes past the last cell work on it too (and store nothing): every invocation
    // reaches the barrier.
    let cc = min(c, p.n_kv - 1u);
    let hk = h / (p.n_head / p.n_head_kv);
    let d4 = p.head_dim / 4u;
    let ko = (cc * p.n_head_kv + hk) * d4;
    var seen = false;
    for (var j = 0u; j < TB; j++) {
        seen = seen || mask[min(t0 + j, p.n_tok - 1u) * p.n_kv + cc] > -1e30;
    }
    var s: array<f32, TB>;
    if (seen) {
        var kv: array<vec4<f32>, NK>;
        for (var u = 0u; u < NK; u++) {
            kv[u] = k_load4(ko + min(lane + u * LANES, d4 - 1u));
        }
        for (var j = 0u; j < TB; j++) {
            // Tokens past the end re-read the last one; their scores are not stored.
            let qo = (min(t0 + j, p.n_tok - 1u) * p.n_head + h) * d4;
            for (var u = 0u; u < NK; u++) {
                let i = lane + u * LANES;
                s[j] += select(0.0, dot(q[qo + min(i, d4 - 1u)], kv[u]), i < d4);
            }
        }
    }
    for (var j = 0u; j < TB; j++) {
        red[j * 64u + lid] = s[j];
    }
    workgroupBarrier();
    if (lane != 0u || c >= p.n_kv) {
        return;
    }
    for (var j = 0u; j < TB; j++) {
        if (t0 + j < p.n_tok) {
            var t = 0.0;
            for (var l = 0u; l < LANES; l++) {
                t += red[j * 64u + lid + l];
            }
            kq[(h * p.n_tok + t0 + j) * p.n_kv + c] = t;
        }
    }
}
