// Attention's softmax and output for a few tokens on GPUs, split over cells
// (flash-decoding): one workgroup per (chunk of cells, token, head) takes the chunk's raw
// scores from attn_kq.wgsl, scales and masks them (with the head's ALiBi slope), and
// keeps its own maximum m and sum l of exp(score - m), and the partial output
// part[s][t][h] = sum over its cells of exp(score - m) * v[c][hk]. attn_kqv_sum.wgsl
// rescales the chunks to their common maximum and divides by the total: the softmax
// needs no dispatch of its own, and a decoded token over a deep cache spreads over the
// whole device. Inside a workgroup, LANES invocations cover a value row (vec4 each, NV
// per invocation, consecutive lanes reading consecutive words) and GROUPS = 64 / LANES of
// them take interleaved cells of the chunk, U cells at a time: a step issues the U cells'
// score, mask and value loads before it uses any, since a loop that loads a score, then
// branches on it, then loads the value row pays two memory round trips per cell (a
// decoded token's workgroups are few, so its time is that latency).
// softmax_common.wgsl is prepended.

const LANES: u32 = {{LANES}}u;
const NV: u32 = {{NV}}u;
const GROUPS: u32 = 64u / LANES;
const U: u32 = max(8u / NV, 1u);

// `Params` is `AttnSplitUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read> mask: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<{{V_ELEM}}>;
@group(0) @binding(4) var<storage, read_write> part: array<vec4<f32>>;
// (m, l) per (chunk, token, head).
@group(0) @binding(5) var<storage, read_write> stats: array<vec2<f32>>;

{{V_LOAD}}

var<workgroup> red: array<vec4<f32>, 64 * NV>;
var<workgroup> red1: array<f32, 64>;

// Score of cell c, scaled and masked (MASKED where the mask hides it).
fn score(sbase: u32, mbase: u32, c: u32, slope: f32) -> f32 {
    let v = capped(scores[sbase + c] * p.scale);
    if (p.has_mask == 0u) {
        return v;
    }
    let m = mask[mbase + c];
    return select(v + slope * m, MASKED, m <= MASKED);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = wid.x;
    let t = wid.y;
    let h = wid.z;
    let lane = lid % LANES;
    let grp = lid / LANES;
    let d4 = p.head_dim / 4u;
    let hk = h / (p.n_head / p.n_head_kv);
    let sbase = (h * p.n_tok + t) * p.n_kv;
    let mbase = t * p.n_kv;
    let slope = alibi_slope(h);
    let c0 = split * p.chunk;
    let c1 = min(c0 + p.chunk, p.n_kv);

    // The chunk's maximum.
    var mx = MASKED;
    for (var c = c0 + lid; c < c1; c += 64u) {
        mx = max(mx, score(sbase, mbase, c, slope));
    }
    red1[lid] = mx;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red1[lid] = max(red1[lid], red1[lid + s]);
        }
        workgroupBarrier();
    }
    mx = red1[0];
    workgroupBarrier();

    // exp(score - m)-weighted values, and their weights' sum (every lane of a group
    // adds the same weights; lane 0's count). Cells past the chunk and masked cells
    // weigh exactly 0 (their clamped loads are discarded, whatever they hold).
    var acc: array<vec4<f32>, NV>;
    var l = 0.0;
    let last = c1 - 1u;
    for (var cb = c0 + grp; cb < c1; cb += GROUPS * U) {
        var sc: array<f32, U>;
        var vv: array<vec4<f32>, U * NV>;
        for (var u = 0u; u < U; u++) {
            let c = min(cb + u * GROUPS, last);
            sc[u] = select(MASKED, score(sbase, mbase, c, slope), cb + u * GROUPS < c1);
            let vo = (c * p.n_head_kv + hk) * d4;
            for (var i = 0u; i < NV; i++) {
                vv[u * NV + i] = v_load4(vo + min(lane + i * LANES, d4 - 1u));
            }
        }
        for (var u = 0u; u < U; u++) {
            let live = sc[u] > MASKED;
            let w = select(0.0, exp(sc[u] - mx), live);
            l += w;
            for (var i = 0u; i < NV; i++) {
                acc[i] += select(vec4<f32>(0.0), w * vv[u * NV + i], live);
            }
        }
    }
    for (var i = 0u; i < NV; i++) {
        red[i * 64u + lid] = acc[i];
    }
    red1[lid] = select(0.0, l, lane == 0u);
    workgroupBarrier();
    let row = (split * p.n_tok + t) * p.n_head + h;
    if (grp == 0u) {
        for (var i = 0u; i < NV; i++) {
            let d = lane + i * LANES;
            var s = red[i * 64u + lane];
            for (var g = 1u; g < GROUPS; g++) {
                s += red[i * 64u + g * LANES + lane];
            }
            if (d < d4) {
                part[row * d4 + d] = s;
            }
        }
    }
    if (lid == 0u) {
        var total = 0.0;
        for (var g = 0u; g < 64u; g += LANES) {
            total += red1[g];
        }
        stats[row] = vec2<f32>(mx, total);
    }
}
