// dst[t][row] = dot(W[row], x[t]), GPU-shaped: one workgroup of 64 per weight row, its
// threads striding over the row's blocks, then a reduction — with subgroupAdd where the
// adapter has subgroups ({{SG}} = 1), else a shared-memory tree. Discrete GPUs want this
// shape (coalesced loads, many threads per row); CPU-like adapters use matmul.wgsl.
struct Params {
    k: u32,
    n_rows: u32,
    n_tok: u32,
    row_words: u32,
    out_row_offset: u32,
    out_stride: u32,
    wg_x: u32,
    _pad: u32,
}

const TB: u32 = {{TB}}u;
const SG: bool = {{SG}}u == 1u;
const WB_SLOTS: u32 = 1u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

var<workgroup> red: array<f32, 64u * TB>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    {{SG_ARGS}}
) {
    let row = wid.y * p.wg_x + wid.x;
    let t0 = wid.z * TB;
    if (row >= p.n_rows) {
        return;
    }
    let ntb = min(TB, p.n_tok - t0);
    let k4 = p.k / 4u;
    var acc: array<f32, TB>;
    let rbase = row * p.row_words;
    let nb = p.k / QK;
    for (var b = lid; b < nb; b += 64u) {
        load_block(rbase + b * WPB, 0u);
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
    {{REDUCE}}
}
