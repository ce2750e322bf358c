// dst[t][row] = dot(W[row], x[t]) by integer dot products: x as 8-bit blocks
// (quantize_q8_1.wgsl), W's codes read as bytes, each block's 32 products summed by
// eight dot4I8Packed into one integer, then scaled: with the weight block's (scale,
// offset) pair dm and x's (d, d * sum(q)), a block adds dm.x * d * sum + dm.y * d * sum(q).
// The weight type's loader (`weights/dot_<type>.wgsl`, after `dot_common.wgsl`) is
// `load_w`: a block's codes as eight words of bytes (0..31 for the 4- and 5-bit formats)
// and its dm.
// A workgroup of 64 handles ROWS rows for TB tokens: its invocations stride over the
// blocks, loading each weight block once for the TB tokens, then the REDUCE slot adds the
// partial sums into red[(row * TB + token) * 64]: subgroupAdd where the adapter has
// subgroups of at most 64, else a workgroup-memory tree (`ops::matmul_q8::q8_reduce`).

const TB: u32 = {{TB}}u;
const ROWS: u32 = {{ROWS}}u;

// `Params` is `MatmulQ8Uniform` in src/ops/matmul_q8.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// A weight block as the kernel multiplies it: 32 codes as bytes, and (scale, offset).
struct WBlock {
    q: array<u32, 8>,
    dm: vec2<f32>,
}

var<workgroup> red: array<f32, 64u * ROWS * TB>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    {{SG_ARGS}}
) {
    let row0 = (wid.y * p.wg_x + wid.x) * ROWS;
    let t0 = wid.z * TB;
    let nb = p.k / 32u;
    var acc: array<f32, ROWS * TB>;
    for (var b = lid; b < nb; b += 64u) {
        for (var r = 0u; r < ROWS; r++) {
            // Rows past the end read the last row (every invocation reaches the barriers).
            let wb = load_w(min(row0 + r, p.n_rows - 1u) * p.row_words, nb, b);
            for (var t = 0u; t < TB; t++) {
                let xb = min(t0 + t, p.n_tok - 1u) * nb + b;
                var s = 0;
                for (var i = 0u; i < 8u; i++) {
                    s += dot4I8Packed(wb.q[i], xq[xb * 8u + i]);
                }
                let d = bitcast<f32>(xq[p.ds_off + 2u * xb]);
                let ds = bitcast<f32>(xq[p.ds_off + 2u * xb + 1u]);
                acc[r * TB + t] += wb.dm.x * d * f32(s) + wb.dm.y * ds;
            }
        }
    }
{{REDUCE}}
    if (lid < ROWS * TB) {
        let r = lid / TB;
        let t = lid % TB;
        if (row0 + r < p.n_rows && t0 + t < p.n_tok) {
            dst[(t0 + t) * p.out_stride + p.out_row_offset + row0 + r] = red[lid * 64u];
        }
    }
}
