// Layer norm with weight and bias (BERT's): per row of n,
// dst = (x - mean(x)) / sqrt(mean((x - mean)^2) + eps) * w + b, the mean and the variance
// each summed in its own pass as ggml's norm does. A workgroup of 256 per row: encoder
// rows are whole prompts of tokens, so there are enough rows to fill a GPU, and the row
// is read three times from cache.

// `Params` is `NormUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

var<workgroup> partial: array<f32, 256>;

// The sum over the workgroup of each invocation's `s`.
fn row_sum(s: f32, lid: u32) -> f32 {
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    // Every invocation has read the total before the next sum overwrites it.
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = (wid.y * 65535u + wid.x) * p.n;
    var s = 0.0;
    for (var i = lid; i < p.n; i += 256u) {
        s += x[base + i];
    }
    let mean = row_sum(s, lid) / f32(p.n);
    var v = 0.0;
    for (var i = lid; i < p.n; i += 256u) {
        let d = x[base + i] - mean;
        v += d * d;
    }
    let scale = inverseSqrt(row_sum(v, lid) / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += 256u) {
        dst[base + i] = (x[base + i] - mean) * scale * w[i] + b[i];
    }
}
