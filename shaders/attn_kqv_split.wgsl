// Attention output for a few tokens on GPUs (flash-decoding's split over cells):
// part[s][t][h][d] = sum over the cells c of chunk s of probs[h][t][c] * v[c][hk][d].
// One workgroup per (chunk, token, head), so a decoded token over a deep cache still
// spreads over the whole device; attn_kqv_sum.wgsl then adds the chunks' partial rows.
// Inside a workgroup, LANES invocations cover a value row (vec4 each, NV per invocation,
// consecutive lanes reading consecutive words) and GROUPS = 64 / LANES of them take
// interleaved cells of the chunk.

const LANES: u32 = {{LANES}}u;
const NV: u32 = {{NV}}u;
const GROUPS: u32 = 64u / LANES;

// `Params` is `AttnUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> probs: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<vec4<{{KV_T}}>>;
@group(0) @binding(3) var<storage, read_write> part: array<vec4<f32>>;

var<workgroup> red: array<vec4<f32>, 64 * NV>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = wid.x;
    let t = wid.y;
    let h = wid.z;
    let lane = lid % LANES;
    let grp = lid / LANES;
    let d4 = p.head_dim / 4u;
    let hk = h / (p.n_head / p.n_head_kv);
    let pbase = (h * p.n_tok + t) * p.n_kv;
    let c1 = min((split + 1u) * p.chunk, p.n_kv);
    var acc: array<vec4<f32>, NV>;
    for (var c = split * p.chunk + grp; c < c1; c += GROUPS) {
        let pr = probs[pbase + c];
        // Masked cells weigh exactly 0: skip their loads.
        if (pr != 0.0) {
            let vo = (c * p.n_head_kv + hk) * d4;
            for (var i = 0u; i < NV; i++) {
                let d = lane + i * LANES;
                if (d < d4) {
                    acc[i] += pr * vec4<f32>(v[vo + d]);
                }
            }
        }
    }
    for (var i = 0u; i < NV; i++) {
        red[i * 64u + lid] = acc[i];
    }
    workgroupBarrier();
    if (grp == 0u) {
        for (var i = 0u; i < NV; i++) {
            let d = lane + i * LANES;
            var s = red[i * 64u + lane];
            for (var g = 1u; g < GROUPS; g++) {
                s += red[i * 64u + g * LANES + lane];
            }
            if (d < d4) {
                part[((split * p.n_tok + t) * p.n_head + h) * d4 + d] = s;
            }
        }
    }
}
