// The experts' products for prompts, grouped by expert (moe_group.wgsl's offsets and
// order): a workgroup of 64 per ROWS rows, expert and run of TB of that expert's pairs,
// so that each weight quarter is loaded once for TB pairs instead of once per pair.
// Otherwise as matmul_id.wgsl: dst[pair][row] = dot(W[expert][row], x[pair or its
// token]); a workgroup past its expert's pairs returns at once.

const ROWS: u32 = 4u;
const TB: u32 = {{TB}}u;
const WB_SLOTS: u32 = 1u;

// `Params` is `MatmulIdUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<f32>;

var<workgroup> red: array<f32, 64u * ROWS * TB>;
var<workgroup> n_here: u32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = p.e_begin + wid.y;
    let first = offsets[e] + wid.z * TB;
    let end = offsets[e + 1u];
    let n = select(0u, min(TB, end - first), first < end);
    // Most workgroups of a prompt's dispatch have no pairs (it is sized for one expert
    // taking every token): they leave at once, together.
    if (lid == 0u) {
        n_here = n;
    }
    if (workgroupUniformLoad(&n_here) == 0u) {
        return;
    }
    let row0 = wid.x * ROWS;
    let k4 = p.k / 4u;
    let nb = p.k / QK;
    let nq = select(0u, nb * 4u, n > 0u);
    var xrow: array<u32, TB>;
    for (var t = 0u; t < TB; t++) {
        let pair = order[first + min(t, max(n, 1u) - 1u)];
        xrow[t] = select(pair / p.n_used, pair, p.x_per_pair != 0u);
    }
    var rbase: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        rbase[r] = (wid.y * p.n_rows + min(row0 + r, p.n_rows - 1u)) * p.row_words;
    }
    var acc: array<f32, ROWS * TB>;
    for (var q = lid; q < nq; q += 64u) {
        let b = q / 4u;
        var v: array<Quarter, ROWS>;
        for (var r = 0u; r < ROWS; r++) {
            v[r] = load_quarter(blk(rbase[r], nb, b), q % 4u);
        }
        for (var t = 0u; t < TB; t++) {
            let xo = xrow[t] * k4 + b * 8u;
            let xa = x[xo + v[0].ia];
            let xb = x[xo + v[0].ib];
            for (var r = 0u; r < ROWS; r++) {
                acc[r * TB + t] += dot(v[r].a, xa) + dot(v[r].b, xb);
            }
        }
    }
    for (var i = 0u; i < ROWS * TB; i++) {
        red[i * 64u + lid] = acc[i];
    }
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var i = 0u; i < ROWS * TB; i++) {
                red[i * 64u + lid] += red[i * 64u + lid + s];
            }
        }
        workgroupBarrier();
    }
    for (var i = lid; i < ROWS * TB; i += 64u) {
        let r = i / TB;
        let t = i % TB;
        if (t < n && row0 + r < p.n_rows) {
            dst[order[first + t] * p.n_rows + row0 + r] = red[i * 64u];
        }
    }
}
