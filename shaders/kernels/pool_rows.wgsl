// Sums of runs of rows (mean pooling's numerator, on the GPU so that only the pooled rows
// are read back): dst row g = the sum of src rows starts[g] .. starts[g + 1] - 1, rows of
// p.row_len values. A workgroup takes 64 columns of one run, each invocation adding its
// column down the run's rows in order.

// `Params` is `SetRowsUniform` in src/ops/uniforms.rs (row_len; n_rows: the runs),
// prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> starts: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let col = wid.x * 64u + lid;
    let g = wid.y;
    if (col >= p.row_len || g >= p.n_rows) {
        return;
    }
    var s = 0.0;
    for (var r = starts[g]; r < starts[g + 1u]; r++) {
        s += src[r * p.row_len + col];
    }
    dst[g * p.row_len + col] = s;
}
