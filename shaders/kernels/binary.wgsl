// dst[i] = a[i] OP b[(i / div) % nb]: residual adds, multiplies by a vector repeated
// along rows (div 1) or by one value per row (div the row length), sigmoid gates, soft caps.

// `Params` is `BinaryUniform` in src/ops/binary.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    let av = a[i];
    let bv = b[(i / p.div) % p.nb];
    dst[i] = {{OP}};
}
