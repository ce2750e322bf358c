// Cache values back as f32, from a cache of any type through k_load4 (the K-shift of a
// packed cache dequantizes, rotates and writes back with set_rows): dst[i] =
// k_load4(first + i) for i < count, in vec4s; the index runs over x and y
// (y * 65535 * 64 + x) for long ranges.

// `Params` is `SetRowsUniform` in src/ops/uniforms.rs (row_len: the first vec4,
// n_rows: the count), prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k: array<{{K_ELEM}}>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

{{K_LOAD}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    if (i < p.n_rows) {
        dst[i] = k_load4(p.row_len + i);
    }
}
