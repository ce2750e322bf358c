// Rotary position embedding, in place on rows of [head_dim, n_head] per token (or per
// cache cell, for the K-shift). The cos/sin of every (token, pair) come from the host,
// computed in f64: GPU sin/cos lose accuracy at the large angles long contexts reach.
// KV_T is f32 for activations, f16 when rotating an f16 K cache in place (the K-shift).

// `Params` is `RopeUniform` in src/ops/rope.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> x: array<{{KV_T}}>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_dims = p.n_dims / 2u;
    let i = gid.x;
    let h = gid.y;
    let t = gid.z;
    if (i >= half_dims || h >= p.n_head) {
        return;
    }
    let base = (t * p.n_head + h) * p.head_dim;
    var a = base + 2u * i;
    var b = a + 1u;
    if (p.neox != 0u) {
        a = base + i;
        b = base + i + half_dims;
    }
    let r = cs[t * half_dims + i];
    let x0 = f32(x[a]);
    let x1 = f32(x[b]);
    x[a] = {{KV_T}}(x0 * r.x - x1 * r.y);
    x[b] = {{KV_T}}(x0 * r.y + x1 * r.x);
}
