// Residual add fused with the next RMS norm, per row of n:
// sum = a + b;  dst = sum / sqrt(mean(sum^2) + eps) * w  (w has n elements).
// Both sum (the new residual stream) and dst (the normed input of the next block) are
// written, saving the separate add's dispatch and a round trip through memory. A
// workgroup of 256 per row, U loads per invocation issued together (see rms_norm.wgsl).

// `Params` is `NormUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> dst: array<f32>;

var<workgroup> partial: array<f32, 256>;

// The row read again where it outgrows one step (each invocation reads back only the
// elements it wrote itself).
fn row_value(j: u32) -> f32 {
    return sum[j];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = (wid.y * 65535u + wid.x) * p.n;
    var s = 0.0;
    var v: array<f32, U>;
    for (var i0 = 0u; i0 < p.n; i0 += STEP) {
        for (var u = 0u; u < U; u++) {
            let i = i0 + u * 256u + lid;
            let j = base + min(i, p.n - 1u);
            v[u] = select(0.0, a[j] + b[j], i < p.n);
        }
        for (var u = 0u; u < U; u++) {
            let i = i0 + u * 256u + lid;
            if (i < p.n) {
                sum[base + i] = v[u];
            }
            s += v[u] * v[u];
        }
    }
    let scale = inverseSqrt(norm_sum(s, lid) / f32(p.n) + p.eps);
    write_normed(base, lid, v, scale);
}
