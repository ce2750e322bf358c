// The RMS norm as GPUs run it fastest (after rms_norm.wgsl or add_rms_norm.wgsl, which
// declare the bindings and `row_input`, `row_keep`, `row_value`): a workgroup of 256 per
// row; each invocation issues its U loads of a step together (a decoded token is one row,
// so the norm's time is the latency of its loop steps, not bandwidth), and rows of up to
// 256 U values are read once. Every load of a step is issued before the step's first
// store: `dst` may alias `w` for all the compiler knows, so a weight load after a store
// waits for it, and a loop of load-multiply-store pays one memory round trip per value.

const U: u32 = 16u;
const STEP: u32 = 256u * U;

var<workgroup> partial: array<f32, 256>;

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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = (wid.y * 65535u + wid.x) * p.n;
    // Row r takes weight row r % w_rows (one weight row when w_rows is 0 or 1).
    let wo = ((base / p.n) % max(p.w_rows, 1u)) * p.n;
    let last = p.n - 1u;
    // A row of one step takes its weights now, beside its values: their loads wait on
    // nothing, and the reduction hides their latency.
    var wv: array<f32, U>;
    if (p.n <= STEP) {
        for (var u = 0u; u < U; u++) {
            wv[u] = w[wo + min(u * 256u + lid, last)];
        }
    }
    var s = 0.0;
    var v: array<f32, U>;
    for (var i0 = 0u; i0 < p.n; i0 += STEP) {
        for (var u = 0u; u < U; u++) {
            let i = i0 + u * 256u + lid;
            // A clamped load, masked after: the loads do not wait on a branch.
            v[u] = select(0.0, row_input(base + min(i, last)), i < p.n);
        }
        for (var u = 0u; u < U; u++) {
            let i = i0 + u * 256u + lid;
            if (i < p.n) {
                row_keep(base + i, v[u]);
            }
            s += v[u] * v[u];
        }
    }
    let scale = inverseSqrt(norm_sum(s, lid) / f32(p.n) + p.eps);
    if (p.n <= STEP) {
        // The row fits one step: this invocation's values are still in `v`.
        for (var u = 0u; u < U; u++) {
            let i = u * 256u + lid;
            if (i < p.n) {
                dst[base + i] = v[u] * scale * wv[u];
            }
        }
        return;
    }
    for (var i0 = 0u; i0 < p.n; i0 += STEP) {
        for (var u = 0u; u < U; u++) {
            let i = min(i0 + u * 256u + lid, last);
            v[u] = row_value(base + i);
            wv[u] = w[wo + i];
        }
        for (var u = 0u; u < U; u++) {
            let i = i0 + u * 256u + lid;
            if (i < p.n) {
                dst[base + i] = v[u] * scale * wv[u];
            }
        }
    }
}
