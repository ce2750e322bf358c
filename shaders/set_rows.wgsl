// Copies new K/V rows into cache cells: dst[idx[r]] = src[r], rows of row_len floats.
struct Params {
    row_len: u32,
    n_rows: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let r = gid.y;
    if (j >= p.row_len || r >= p.n_rows) {
        return;
    }
    dst[idx[r] * p.row_len + j] = src[r * p.row_len + j];
}
