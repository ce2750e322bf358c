// set_rows into a packed cache (bf16, the block types): dst row idx[r] = src row r, one
// invocation per block of 32 values, quantized on the way by `dst_store_block` (the
// type's store part, kv_<type>.wgsl; kv_common.wgsl is prepended).

// `Params` is `SetRowsUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<atomic<u32>>;

{{STORE}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let nb = p.row_len / 32u;
    let b = gid.x;
    let r = gid.y;
    if (b >= nb || r >= p.n_rows) {
        return;
    }
    var x: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        x[j] = src[r * p.row_len + 32u * b + j];
    }
    dst_store_block(idx[r] * nb + b, x);
}
