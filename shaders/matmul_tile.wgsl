// dst[t][row] = dot(W[row], x[t]) for prompts on GPUs: one workgroup of 256 computes a
// tile of BM weight rows x BN tokens. Per weight block (a K-slice of 32), the workgroup
// dequantizes the BM rows' blocks into workgroup memory (one quarter block per invocation,
// read straight from the quantized buffer) and stages the BN tokens' activations beside
// them; each invocation then owns a TM x TN micro-tile of accumulators (rows tx + 16 i,
// tokens ty + 16 j), which the host writes out unrolled (the DECL, BODY and STORE template slots).
// Workgroup memory is 8 vec4 x (BM + BN): 16 KiB for 64x64, 24 KiB for 128x64.

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const WB_SLOTS: u32 = 1u;

// `Params` is `MatmulUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// [k4][row] and [k4][token]: invocations with consecutive tx (ty) read consecutive vec4s.
var<workgroup> ws: array<vec4<f32>, 8u * BM>;
var<workgroup> xs: array<vec4<f32>, 8u * BN>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.y * p.wg_x + wid.x) * BM;
    let t0 = wid.z * BN;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let k4 = p.k / 4u;
    let nb = p.k / QK;
{{DECL}}
    for (var b = 0u; b < nb; b++) {
        for (var e = lid; e < BM * 4u; e += 256u) {
            // Rows past the end re-read the last row; their results are not stored.
            let r = e / 4u;
            let row = min(row0 + r, p.n_rows - 1u);
            let v = load_quarter(blk(row * p.row_words, nb, b), e % 4u);
            ws[v.ia * BM + r] = v.a;
            ws[v.ib * BM + r] = v.b;
        }
        for (var e = lid; e < BN * 8u; e += 256u) {
            let t = e / 8u;
            let i = e % 8u;
            let tok = min(t0 + t, p.n_tok - 1u);
            xs[i * BN + t] = x[tok * k4 + b * 8u + i];
        }
        workgroupBarrier();
        for (var i = 0u; i < 8u; i++) {
            let wo = i * BM + tx;
            let xo = i * BN + ty;
{{BODY}}
        }
        workgroupBarrier();
    }
{{STORE}}
}
