// Adds the chunks' partial attention outputs of attn_kqv_split.wgsl:
// dst[i] = sum over s of part[s][i], i over [head_dim / 4 * n_head * n_tok] vec4s.
struct Params {
    n: u32,
    n_split: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= p.n) {
        return;
    }
    var s = part[i];
    for (var k = 1u; k < p.n_split; k++) {
        s += part[k * p.n + i];
    }
    dst[i] = s;
}
