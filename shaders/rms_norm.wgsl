// dst = x / sqrt(mean(x^2) + eps) * w, per row of n; w has n elements (one per column).

// `Params` is `NormUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = (wid.y * 65535u + wid.x) * p.n;
    var s = 0.0;
    for (var i = lid; i < p.n; i += 64u) {
        let v = x[base + i];
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
        dst[base + i] = x[base + i] * scale * w[i];
    }
}
