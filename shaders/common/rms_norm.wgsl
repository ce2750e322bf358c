// dst = x / sqrt(mean(x^2) + eps) * w, per row of n; w has n elements (one per column).
// The row's bindings and how its values are read: norm_wg.wgsl or norm_rows.wgsl follows
// with the kernel itself.

// `Params` is `NormUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// Element j of the rows being normed, read the first time.
fn row_input(j: u32) -> f32 {
    return x[j];
}

// What is kept of the input value `v` at j (nothing: x is the caller's).
fn row_keep(j: u32, v: f32) {}

// The row read again where it outgrows what an invocation holds.
fn row_value(j: u32) -> f32 {
    return x[j];
}
