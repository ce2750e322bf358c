// Activations to 8-bit blocks for the integer-dot matmuls (llama.cpp's block_q8_1, with
// f32 scales): each block of 32 values becomes codes q = round(x / d) with d = max|x| / 127
// (q = 0 where the block is all zero), packed four to a word (value 4i + j in byte j of
// word i), and the pair (d, d * sum(q)) that the kernels use for the weights' offsets.
// Block b's codes are words 8b..8b+7, its pair words ds_off + 2b and ds_off + 2b + 1.
// The rows of x are whole blocks, so blocks run on over rows: one invocation per block.

// `Params` is `QuantizeQ8Uniform` in src/ops/matmul_q8.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> q: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = (wid.y * p.wg_x + wid.x) * 64u + lid;
    if (b >= p.n_blocks) {
        return;
    }
    var v: array<vec4<f32>, 8>;
    var amax = 0.0;
    for (var i = 0u; i < 8u; i++) {
        v[i] = x[b * 8u + i];
        let a = abs(v[i]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d > 0.0);
    var sum = 0;
    for (var i = 0u; i < 8u; i++) {
        let c = vec4<i32>(round(v[i] * id));
        sum += c.x + c.y + c.z + c.w;
        q[b * 8u + i] = pack4xI8(c);
    }
    q[p.ds_off + 2u * b] = bitcast<u32>(d);
    q[p.ds_off + 2u * b + 1u] = bitcast<u32>(d * f32(sum));
}
