// The experts' matrix products of a mixture-of-experts layer (ggml's mul_mat_id):
// dst[pair][row] = dot(W[ids[pair]][row], x[xrow]) for each (token, chosen expert) pair
// (pair = t * n_used + j), x's row being the pair's own (the down projection, whose input
// differs per expert) or its token's (gate and up). W stacks the experts' [k, n_rows]
// matrices; a dispatch sees the chunk of whole experts e_begin..e_end one binding holds,
// and a pair whose expert is elsewhere computes nothing there. A workgroup of 64 per
// ROWS rows and pair: invocations stride over the quarter blocks (the weight snippet's
// load_quarter), then a workgroup-memory tree adds the partial sums.

const ROWS: u32 = 4u;
const WB_SLOTS: u32 = 1u;

// `Params` is `MatmulIdUniform` in src/ops/moe.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

var<workgroup> red: array<f32, 64u * ROWS>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let pair = wid.z;
    let e = ids[pair];
    let here = e >= p.e_begin && e < p.e_end;
    let row0 = (wid.y * p.wg_x + wid.x) * ROWS;
    let xrow = select(pair / p.n_used, pair, p.x_per_pair != 0u);
    let k4 = p.k / 4u;
    let nb = p.k / QK;
    // Nothing to add up where the expert is in another chunk (every invocation still
    // reaches the barriers).
    let nq = select(0u, nb * 4u, here);
    let el = select(0u, e - p.e_begin, here);
    var rbase: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        rbase[r] = (el * p.n_rows + min(row0 + r, p.n_rows - 1u)) * p.row_words;
    }
    var acc: array<f32, ROWS>;
    for (var q = lid; q < nq; q += 64u) {
        let b = q / 4u;
        let xo = xrow * k4 + b * 8u;
        for (var r = 0u; r < ROWS; r++) {
            let v = load_quarter(blk(rbase[r], nb, b), q % 4u);
            acc[r] += dot(v.a, x[xo + v.ia]) + dot(v.b, x[xo + v.ib]);
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        red[r * 64u + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var r = 0u; r < ROWS; r++) {
                red[r * 64u + lid] += red[r * 64u + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (here && lid < ROWS && row0 + lid < p.n_rows) {
        dst[pair * p.n_rows + row0 + lid] = red[lid * 64u];
    }
}
