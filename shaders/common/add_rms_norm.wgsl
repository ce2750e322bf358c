// Residual add fused with the next RMS norm, per row of n:
// sum = a + b;  dst = sum / sqrt(mean(sum^2) + eps) * w  (w has n elements).
// Both sum (the new residual stream) and dst (the normed input of the next block) are
// written, saving the separate add's dispatch and a round trip through memory. The row's
// bindings and how its values are read: norm_wg.wgsl or norm_rows.wgsl follows with the
// kernel itself.

// `Params` is `NormUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> dst: array<f32>;

// Element j of the rows being normed, read the first time.
fn row_input(j: u32) -> f32 {
    return a[j] + b[j];
}

// The new residual stream keeps the input value `v` at j.
fn row_keep(j: u32, v: f32) {
    sum[j] = v;
}

// The row read again where it outgrows what an invocation holds (each invocation reads
// back only the elements it wrote itself).
fn row_value(j: u32) -> f32 {
    return sum[j];
}
