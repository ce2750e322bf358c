// dst[t][row] = dot(W[row], x[t]) for decode and small batches on GPUs: a workgroup of 256
// handles ROWS weight rows as SEGS segments of TPR = 256 / SEGS invocations, each
// segment RPT rows. A segment's invocations stride over the quarter blocks (consecutive
// invocations read consecutive quarters, so loads coalesce); each invocation loads a
// quarter of x once and uses it for its RPT rows (x is read from cache once per RPT
// rows instead of once per row, and RPT weight loads are in flight together), keeping
// RPT x TB partial sums. Then each row's partials are reduced: the REDUCE template slot
// is subgroupAdd plus a short sum over subgroups where the adapter has subgroups no wider
// than TPR, else a workgroup-memory tree. CPU-like adapters use matmul.wgsl instead.
// With the fused GLU epilogue (the weight's rows are interleaved (gate, up) pairs, ROWS
// even) the row sums meet in workgroup memory and each pair's act(gate) * up is written.

const TB: u32 = {{TB}}u;
const ROWS: u32 = {{ROWS}}u;
const RPT: u32 = {{RPT}}u;
const SEGS: u32 = ROWS / RPT;
const TPR: u32 = 256u / SEGS;
const WB_SLOTS: u32 = 1u;

// `Params` is `MatmulUniform` in src/ops/matmul.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

var<workgroup> red: array<f32, 256u * TB>;
var<workgroup> res: array<f32, ROWS * TB>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    {{SG_ARGS}}
) {
    let seg = lid / TPR;
    let sl = lid % TPR;
    let row_wg = (wid.y * p.wg_x + wid.x) * ROWS;
    let row0 = row_wg + seg * RPT;
    let t0 = wid.z * TB;
    let ntb = min(TB, p.n_tok - t0);
    let k4 = p.k / 4u;
    // Rows past the end read the last row (every invocation must reach the barriers).
    var rbase: array<u32, RPT>;
    for (var r = 0u; r < RPT; r++) {
        rbase[r] = min(row0 + r, p.n_rows - 1u) * p.row_words;
    }
    var acc: array<f32, RPT * TB>;
    let nb = p.k / QK;
    let nq = nb * 4u;
    for (var e = sl; e < nq; e += TPR) {
        let b = e / 4u;
        var v: array<Quarter, RPT>;
        for (var r = 0u; r < RPT; r++) {
            v[r] = load_quarter(blk(rbase[r], nb, b), e % 4u);
        }
        for (var t = 0u; t < TB; t++) {
            let xo = min(t0 + t, p.n_tok - 1u) * k4 + b * 8u;
            let xa = x[xo + v[0].ia];
            let xb = x[xo + v[0].ib];
            for (var r = 0u; r < RPT; r++) {
                acc[r * TB + t] += dot(v[r].a, xa) + dot(v[r].b, xb);
            }
        }
    }
    // Each segment's row sums go to res[t * ROWS + local row].
{{REDUCE}}
    workgroupBarrier();
{{STORE}}
}
