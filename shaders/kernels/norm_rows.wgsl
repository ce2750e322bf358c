// The RMS norm as CPU-like adapters run it fastest (after rms_norm.wgsl or
// add_rms_norm.wgsl, which declare the bindings and `row_input`, `row_keep`,
// `row_value`): one invocation per row, looping over it twice, with no workgroup memory
// and no barrier. A barrier makes SwiftShader run each SIMD group of the workgroup as a
// coroutine and switch between them at every barrier, and llvmpipe splits its loops there;
// the workgroup tree of norm_wg.wgsl paid that nine times for a decoded token's one row.

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * 65535u + wid.x) * 64u + lid;
    if (row >= p.n_rows) {
        return;
    }
    let base = row * p.n;
    var s = 0.0;
    for (var i = 0u; i < p.n; i++) {
        let v = row_input(base + i);
        row_keep(base + i, v);
        s += v * v;
    }
    let scale = inverseSqrt(s / f32(p.n) + p.eps);
    // Row r takes weight row r % w_rows (one weight row when w_rows is 0 or 1).
    let wo = (row % max(p.w_rows, 1u)) * p.n;
    for (var i = 0u; i < p.n; i++) {
        dst[base + i] = row_value(base + i) * scale * w[wo + i];
    }
}
