// dst[t][row] = dot(W[row], x[t]) for prompts on GPUs: one workgroup of 256 computes a
// tile of BM weight rows x BN tokens. Per weight block (a K-slice of 32), the workgroup
// dequantizes the BM rows' blocks into workgroup memory (NQ quarter blocks per invocation,
// read straight from the quantized buffer, one block ahead) and stages the BN tokens' activations beside
// them; each invocation then owns a TM x TN micro-tile of accumulators (rows tx + 16 i,
// tokens ty + 16 j), which the host writes out unrolled (the DECL, BODY and STORE template slots).
// Workgroup memory is 8 vec4 x (BM + BN): 16 KiB for 64x64, 24 KiB for 128x64.
// TOKENS, as in matmul.wgsl: consecutive tokens through the whole matrix, or a run of one
// expert's (token, expert) pairs through its rows; it defines row0, n_here (tokens in
// this tile, at least 1), wrow (the matrix's first row in w) and the x row X_ROW of the
// tile's token s.

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const WB_SLOTS: u32 = 1u;
// Quarter blocks and activation vec4s each invocation fetches per block (BM a multiple of
// 64, BN of 32).
const NQ: u32 = BM * 4u / 256u;
const NX: u32 = BN * 8u / 256u;

// `Params` is `MatmulUniform` in src/ops/matmul.rs (`MatmulIdUniform`, src/ops/moe.rs, for grouped
// pairs), prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
{{TOKEN_BINDINGS}}

// [k4][row] and [k4][token]: invocations with consecutive tx (ty) read consecutive vec4s.
var<workgroup> ws: array<vec4<f32>, 8u * BM>;
var<workgroup> xs: array<vec4<f32>, 8u * BN>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
{{TOKENS}}
    let tx = lid % 16u;
    let ty = lid / 16u;
    let k4 = p.k / 4u;
    let nb = p.k / QK;
{{DECL}}
    // Block b + 1's quarters and activations are fetched into registers while block b is
    // multiplied out of workgroup memory, so the loads' latency hides behind the math.
    var qv: array<Quarter, NQ>;
    var xv: array<vec4<f32>, NX>;
    // Where each fetched quarter's row and activation vec4's token start, in words and
    // vec4s: rows past the end re-read the last row, tokens past the tile's last re-read
    // it; their results are not stored.
    var qbase: array<u32, NQ>;
    var xbase: array<u32, NX>;
    for (var j = 0u; j < NQ; j++) {
        let e = lid + j * 256u;
        qbase[j] = (wrow + min(row0 + e / 4u, p.n_rows - 1u)) * p.row_words;
        qv[j] = load_quarter(blk(qbase[j], nb, 0u), e % 4u);
    }
    for (var j = 0u; j < NX; j++) {
        let e = lid + j * 256u;
        let s = min(e / 8u, n_here - 1u);
        xbase[j] = ({{X_ROW}}) * k4 + e % 8u;
        xv[j] = x[xbase[j]];
    }
    for (var b = 0u; b < nb; b++) {
        for (var j = 0u; j < NQ; j++) {
            let r = (lid + j * 256u) / 4u;
            ws[qv[j].ia * BM + r] = qv[j].a;
            ws[qv[j].ib * BM + r] = qv[j].b;
        }
        for (var j = 0u; j < NX; j++) {
            let e = lid + j * 256u;
            xs[(e % 8u) * BN + e / 8u] = xv[j];
        }
        workgroupBarrier();
        if (b + 1u < nb) {
            for (var j = 0u; j < NQ; j++) {
                let e = lid + j * 256u;
                qv[j] = load_quarter(blk(qbase[j], nb, b + 1u), e % 4u);
            }
            for (var j = 0u; j < NX; j++) {
                xv[j] = x[xbase[j] + (b + 1u) * 8u];
            }
        }
        for (var i = 0u; i < 8u; i++) {
            let wo = i * BM + tx;
            let xo = i * BN + ty;
{{BODY}}
        }
        workgroupBarrier();
    }
{{STORE}}
}
