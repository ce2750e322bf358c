// dst[t][row] = dot(W[row], x[t]) for a weight matrix W in a GPU block layout (the
// quant_*.wgsl snippet in front of this file defines QK, WPB and load_block).
// One invocation owns one weight row and TB tokens: each block is dequantized once and
// used TB times. This "row per invocation" shape is what CPU-like adapters run fastest.
struct Params {
    k: u32,              // row length (multiple of QK)
    n_rows: u32,         // rows in this chunk
    n_tok: u32,
    row_words: u32,
    out_row_offset: u32, // first row of this chunk in dst
    out_stride: u32,     // dst row length (all rows of the matrix)
    wg_x: u32,           // workgroups along x (rows are split over x and y)
    _pad: u32,
}

const TB: u32 = {{TB}}u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * p.wg_x + wid.x) * 64u + lid;
    let t0 = wid.z * TB;
    if (row >= p.n_rows) {
        return;
    }
    let ntb = min(TB, p.n_tok - t0);
    let k4 = p.k / 4u;
    var acc: array<f32, TB>;
    let rbase = row * p.row_words;
    let nb = p.k / QK;
    for (var b = 0u; b < nb; b++) {
        load_block(rbase + b * WPB);
        for (var t = 0u; t < TB; t++) {
            if (t < ntb) {
                let xo = (t0 + t) * k4 + b * (QK / 4u);
                var s = 0.0;
                for (var i = 0u; i < QK / 4u; i++) {
                    s += dot(wb[i], x[xo + i]);
                }
                acc[t] += s;
            }
        }
    }
    for (var t = 0u; t < ntb; t++) {
        dst[(t0 + t) * p.out_stride + p.out_row_offset + row] = acc[t];
    }
}
