// Residual add fused with the next RMS norm, per row of n:
// sum = a + b;  dst = sum / sqrt(mean(sum^2) + eps) * w  (w has n elements).
// Both sum (the new residual stream) and dst (the normed input of the next block) are
// written, saving the separate add's dispatch and a round trip through memory.

// `Params` is `NormUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> dst: array<f32>;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = (wid.y * 65535u + wid.x) * p.n;
    var s = 0.0;
    for (var i = lid; i < p.n; i += 64u) {
        let v = a[base + i] + b[base + i];
        sum[base + i] = v;
        s += v * v;
    }
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    let scale = inverseSqrt(partial[0] / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += 64u) {
        // Each invocation reads back only the elements it wrote itself.
        dst[base + i] = sum[base + i] * scale * w[i];
    }
}
