// Copies new K/V rows into cache cells: dst[idx[r]] = src[r], rows of row_len values.
// The cache element type KV_T is f16 where the adapter has shader-f16, else f32.

// `Params` is `SetRowsUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<{{KV_T}}>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let r = gid.y;
    if (j >= p.row_len || r >= p.n_rows) {
        return;
    }
    dst[idx[r] * p.row_len + j] = {{KV_T}}(src[r * p.row_len + j]);
}
