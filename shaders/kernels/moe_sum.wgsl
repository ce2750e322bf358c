// The weighted sum of a token's experts' outputs: dst[t][i] = sum over j of
// weights[t][j] * y[t * n_used + j][i], added in j's order (as llama.cpp adds the
// weighted experts' views one after another). One invocation per output value.

// `Params` is `MoeSumUniform` in src/ops/moe.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = (wid.y * p.wg_x + wid.x) * 64u + lid;
    if (g >= p.n) {
        return;
    }
    let t = g / p.n_out;
    let i = g % p.n_out;
    let pair0 = t * p.n_used;
    var acc = y[pair0 * p.n_out + i] * weights[pair0];
    for (var j = 1u; j < p.n_used; j++) {
        acc += y[(pair0 + j) * p.n_out + i] * weights[pair0 + j];
    }
    dst[g] = acc;
}
