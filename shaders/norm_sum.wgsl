// Shared by rms_norm and add_rms_norm, which declare `partial` (256 floats of workgroup
// memory), `p`, `w` and `dst`, and `row_value(j)`, the value at j of the row being
// normed: U values per invocation and loop step, STEP values per step of the workgroup.
const U: u32 = 16u;
const STEP: u32 = 256u * U;

// The sum over the workgroup of each invocation's `s`.
fn norm_sum(s: f32, lid: u32) -> f32 {
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    return partial[0];
}

// dst = value * scale * w over the row at `base`: from `v` (this invocation's values of
// the one step) where the row fits one step, else read again with `row_value`.
// Row r takes weight row r % w_rows (one weight row when w_rows is 0 or 1).
fn write_normed(base: u32, lid: u32, v: array<f32, U>, scale: f32) {
    let wo = ((base / p.n) % max(p.w_rows, 1u)) * p.n;
    if (p.n <= STEP) {
        for (var u = 0u; u < U; u++) {
            let i = u * 256u + lid;
            if (i < p.n) {
                dst[base + i] = v[u] * scale * w[wo + i];
            }
        }
        return;
    }
    for (var i = lid; i < p.n; i += 256u) {
        dst[base + i] = row_value(base + i) * scale * w[wo + i];
    }
}
