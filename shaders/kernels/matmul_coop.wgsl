// dst[t][row] = dot(W[row], x[t]) for prompts on cooperative matrices (NVIDIA's tensor
// cores through VK_KHR_cooperative_matrix, Apple's simdgroup matrices): one workgroup of
// 32 invocations, one subgroup (the kernel is chosen only where the adapter's subgroups are
// exactly 32 wide, which leaves out AMD's 32-or-64 and Intel's 8-to-32), computes BM = 2S weight rows x
// BN = 2S tokens as four S x S f32 accumulators. Per weight block (a K-slice of 32) the
// invocations dequantize the BM rows' blocks to f16 in workgroup memory ([row][k]) and
// stage the BN tokens' activations beside them as f16 ([token][k]); then 32 / S steps of
// four S x S x S multiply-adds. The accumulators start from, and end in, `cs` ([token][row],
// zero-filled by the pipeline), from which the invocations write the tile out.

const S: u32 = {{S}}u;
const BM: u32 = 2u * S;
const BN: u32 = 2u * S;
const WB_SLOTS: u32 = 1u;

// `Params` is `MatmulUniform` in src/ops/matmul.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

var<workgroup> ws: array<f16, BM * 32u>;
var<workgroup> xs: array<f16, BN * 32u>;
var<workgroup> cs: array<f32, BM * BN>;

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.y * p.wg_x + wid.x) * BM;
    let t0 = wid.z * BN;
    let k4 = p.k / 4u;
    let nb = p.k / QK;
    var c00 = coopLoad<{{C}}>(&cs[0u], BM);
    var c01 = coopLoad<{{C}}>(&cs[S * BM], BM);
    var c10 = coopLoad<{{C}}>(&cs[S], BM);
    var c11 = coopLoad<{{C}}>(&cs[S * BM + S], BM);
    for (var b = 0u; b < nb; b++) {
        // BM rows x 4 quarter blocks, BM / 8 per invocation. Rows past the end re-read
        // the last row; their results are not stored.
        for (var j = 0u; j < BM / 8u; j++) {
            let e = lid + j * 32u;
            let r = e / 4u;
            let row = min(row0 + r, p.n_rows - 1u);
            let q = load_quarter(blk(row * p.row_words, nb, b), e % 4u);
            for (var i = 0u; i < 4u; i++) {
                ws[r * 32u + q.ia * 4u + i] = f16(q.a[i]);
                ws[r * 32u + q.ib * 4u + i] = f16(q.b[i]);
            }
        }
        // BN tokens x 8 vec4s, BN / 4 per invocation.
        for (var j = 0u; j < BN / 4u; j++) {
            let e = lid + j * 32u;
            let t = e / 8u;
            let tok = min(t0 + t, p.n_tok - 1u);
            let v = x[tok * k4 + b * 8u + e % 8u];
            for (var i = 0u; i < 4u; i++) {
                xs[t * 32u + (e % 8u) * 4u + i] = f16(v[i]);
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk += S) {
            // A: rows x k, row-major in ws; B: k x tokens, column-major in xs.
            let a0 = coopLoadT<{{A}}>(&ws[kk], 32u);
            let a1 = coopLoadT<{{A}}>(&ws[S * 32u + kk], 32u);
            let b0 = coopLoad<{{B}}>(&xs[kk], 32u);
            let b1 = coopLoad<{{B}}>(&xs[S * 32u + kk], 32u);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    // C: rows x tokens, column-major in cs ([token][row]).
    coopStore(c00, &cs[0u], BM);
    coopStore(c01, &cs[S * BM], BM);
    coopStore(c10, &cs[S], BM);
    coopStore(c11, &cs[S * BM + S], BM);
    workgroupBarrier();
    for (var e = lid; e < BM * BN; e += 32u) {
        let t = e / BM;
        let r = e % BM;
        if (row0 + r < p.n_rows && t0 + t < p.n_tok) {
            dst[(t0 + t) * p.out_stride + p.out_row_offset + row0 + r] = cs[e];
        }
    }
}
