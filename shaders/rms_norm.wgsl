// dst = x / sqrt(mean(x^2) + eps) * w, per row of n; w has n elements (one per column).
// A workgroup of 256 per row; each invocation issues its U loads of a step together (a
// decoded token is one row, so the norm's time is the latency of its loop steps, not
// bandwidth), and rows of up to 256 U values are read once.

// `Params` is `NormUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

var<workgroup> partial: array<f32, 256>;

// The row read again where it outgrows one step.
fn row_value(j: u32) -> f32 {
    return x[j];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = (wid.y * 65535u + wid.x) * p.n;
    var s = 0.0;
    var v: array<f32, U>;
    for (var i0 = 0u; i0 < p.n; i0 += STEP) {
        for (var u = 0u; u < U; u++) {
            let i = i0 + u * 256u + lid;
            // A clamped load, masked after: the loads do not wait on a branch.
            v[u] = select(0.0, x[base + min(i, p.n - 1u)], i < p.n);
        }
        for (var u = 0u; u < U; u++) {
            s += v[u] * v[u];
        }
    }
    let scale = inverseSqrt(norm_sum(s, lid) / f32(p.n) + p.eps);
    write_normed(base, lid, v, scale);
}
