// Each (token, expert) pair's output plus its expert's bias (gpt-oss's expert biases,
// llama.cpp's add_id): dst[p][r] = a[p][r] + bias[ids[p]][r], pairs p of `rows` values.
// One invocation per value.

// `Params` is `MoeAddIdUniform` in src/ops/moe.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = (wid.y * p.wg_x + wid.x) * 64u + lid;
    if (g >= p.n) {
        return;
    }
    let pair = g / p.rows;
    let r = g % p.rows;
    dst[g] = a[g] + bias[ids[pair] * p.rows + r];
}
