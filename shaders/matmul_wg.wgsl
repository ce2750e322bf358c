// dst[t][row] = dot(W[row], x[t]) for decode and small batches on GPUs: a workgroup of 256
// handles ROWS weight rows, TPR = 256 / ROWS invocations per row. The row's invocations
// stride over its quarter blocks (consecutive invocations read consecutive quarters, so
// loads coalesce), each keeping TB partial sums, then the row's partials are reduced:
// the REDUCE template slot is subgroupAdd plus a short sum over subgroups where the adapter has
// subgroups no wider than TPR, else a workgroup-memory tree. CPU-like adapters use
// matmul.wgsl instead. With the fused GLU epilogue (the weight's rows are interleaved
// (gate, up) pairs, ROWS even) the row sums meet in workgroup memory and each pair's
// act(gate) * up is written.

const TB: u32 = {{TB}}u;
const ROWS: u32 = {{ROWS}}u;
const TPR: u32 = 256u / ROWS;
const WB_SLOTS: u32 = 1u;

// `Params` is `MatmulUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

var<workgroup> red: array<f32, 256u * TB>;
{{DECL}}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    {{SG_ARGS}}
) {
    let seg = lid / TPR;
    let sl = lid % TPR;
    let row = (wid.y * p.wg_x + wid.x) * ROWS + seg;
    let t0 = wid.z * TB;
    let ntb = min(TB, p.n_tok - t0);
    let k4 = p.k / 4u;
    // Rows past the end read the last row (every invocation must reach the barriers).
    let rbase = min(row, p.n_rows - 1u) * p.row_words;
    var acc: array<f32, TB>;
    let nb = p.k / QK;
    let nq = nb * 4u;
    for (var e = sl; e < nq; e += TPR) {
        let b = e / 4u;
        let v = load_quarter(blk(rbase, nb, b), e % 4u);
        for (var t = 0u; t < TB; t++) {
            let xo = min(t0 + t, p.n_tok - 1u) * k4 + b * 8u;
            acc[t] += dot(v.a, x[xo + v.ia]) + dot(v.b, x[xo + v.ib]);
        }
    }
    let out_ok = row < p.n_rows;
    let o = p.out_row_offset + row;
{{REDUCE}}
}
