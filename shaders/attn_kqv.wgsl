// Attention output: dst[t][h][d] = sum_c probs[h][t][c] * v[c][h / (n_head / n_head_kv)][d].
// dst is [head_dim * n_head, n_tok], the layout the output projection reads.
struct Params {
    head_dim: u32,
    n_head: u32,
    n_head_kv: u32,
    n_tok: u32,
    n_kv: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> probs: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<{{KV_T}}>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let d = gid.x;
    let t = gid.y;
    let h = gid.z;
    if (d >= p.head_dim) {
        return;
    }
    let hk = h / (p.n_head / p.n_head_kv);
    let pbase = (h * p.n_tok + t) * p.n_kv;
    let row = p.n_head_kv * p.head_dim;
    var vo = hk * p.head_dim + d;
    var s = 0.0;
    for (var c = 0u; c < p.n_kv; c++) {
        let pr = probs[pbase + c];
        if (pr != 0.0) {
            s += pr * f32(v[vo]);
        }
        vo += row;
    }
    dst[(t * p.n_head + h) * p.head_dim + d] = s;
}
