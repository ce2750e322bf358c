// Attention scores: kq[h][t][c] = dot(q[t][h], k[c][h / (n_head / n_head_kv)]), after
// attn_kq_io.wgsl (the bindings).
// One invocation owns one cell and TB tokens: each key is loaded once and used TB times
// (the queries are the same for all invocations of a workgroup row). A cell the mask
// hides from all TB tokens (the causal half of a prompt) is not computed: the softmax
// masks its score whatever it is.

const TB: u32 = {{TB}}u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t0 = gid.y * TB;
    let h = gid.z;
    if (c >= p.n_kv) {
        return;
    }
    let hk = h / (p.n_head / p.n_head_kv);
    let d4 = p.head_dim / 4u;
    let ko = (c * p.n_head_kv + hk) * d4;
    var qo: array<u32, TB>;
    for (var j = 0u; j < TB; j++) {
        // Tokens past the end re-read the last one; their scores are not stored.
        qo[j] = (min(t0 + j, p.n_tok - 1u) * p.n_head + h) * d4;
    }
    var seen = false;
    for (var j = 0u; j < TB; j++) {
        seen = seen || mask[min(t0 + j, p.n_tok - 1u) * p.n_kv + c] > -1e30;
    }
    var s: array<f32, TB>;
    for (var i = 0u; i < select(0u, d4, seen); i++) {
        let kv = k_load4(ko + i);
        for (var j = 0u; j < TB; j++) {
            s[j] += dot(q[qo[j] + i], kv);
        }
    }
    for (var j = 0u; j < TB; j++) {
        if (t0 + j < p.n_tok) {
            kq[(h * p.n_tok + t0 + j) * p.n_kv + c] = s[j];
        }
    }
}
