// Attention for prompts on GPUs in one pass (flash attention): one workgroup of 64 per
// (tile of BQ tokens, head) walks the cached cells in tiles of BK, holding the tokens'
// queries and each tile's keys and values in workgroup memory, and keeps per token the
// running maximum m, the sum l of exp(score - m) and the output, rescaled by
// exp(m_old - m) whenever m grows (online softmax). The scores never reach memory, and a
// tile the mask hides from every token of the workgroup (the causal half of a prompt)
// is skipped whole. Scores are scaled, then masked with the head's ALiBi slope, as
// softmax.wgsl does. Where the cells are split into chunks (p.chunk > 0: workgroups over
// z take a chunk each, flash-decoding's split), each writes its chunk's unnormalised
// output and (m, l) in attn_kqv_split.wgsl's layout, and attn_kqv_sum.wgsl joins them. Heads of up to 4 * D4 values (128). softmax_common.wgsl is
// prepended. Workgroup memory: (BQ + 2 BK) * D4 vec4 + BQ * BK + 128 floats, 25 KiB.
//
// Invocation lid owns token row qi = lid / 4 of the tile: scores (qi, 4 j + lid % 4)
// for j < BK / 4, and output vec4s (qi, lid % 4 + 4 i) for i < D4 / 4.

const BQ: u32 = 16u;
const BK: u32 = 16u;
const D4: u32 = 32u;
const SJ: u32 = BK / 4u;
const OI: u32 = D4 / 4u;
const OSTEP: u32 = 4u;

// `Params` is `AttnSplitUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k: array<{{K_ELEM}}>;
@group(0) @binding(3) var<storage, read> v: array<{{V_ELEM}}>;
// [n_kv, n_tok]: MASKED (or less) where a token may not see a cell, else ALiBi's bias.
@group(0) @binding(4) var<storage, read> mask: array<f32>;
{{OUT_DECL}}

{{K_LOAD}}

{{V_LOAD}}

var<workgroup> qs: array<vec4<f32>, BQ * D4>;
var<workgroup> ks: array<vec4<f32>, BK * D4>;
var<workgroup> vs: array<vec4<f32>, BK * D4>;
var<workgroup> ps: array<f32, BQ * BK>;
var<workgroup> red: array<f32, 128>;
var<workgroup> visible: atomic<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t0 = wid.x * BQ;
    let h = wid.y;
    let d4 = p.head_dim / 4u;
    let hk = h / (p.n_head / p.n_head_kv);
    let slope = alibi_slope(h);
    let qi = lid / 4u;
    let sub = lid % 4u;
    // Tokens past the end re-read the last one; their outputs are not stored.
    let tq = min(t0 + qi, p.n_tok - 1u);

    for (var e = lid; e < BQ * D4; e += 64u) {
        let r = e / D4;
        let d = e % D4;
        let t = min(t0 + r, p.n_tok - 1u);
        if (d < d4) {
            qs[e] = q[(t * p.n_head + h) * d4 + d];
        }
    }
    var m = MASKED;
    var l = 0.0;
    var o: array<vec4<f32>, OI>;

{{RANGE}}
    for (var c0 = c_begin; c0 < c_end; c0 += BK) {
        // This invocation's scores of the tile, scaled and masked (MASKED if hidden).
        var s: array<f32, SJ>;
        var any = false;
        for (var j = 0u; j < SJ; j++) {
            let c = c0 + 4u * j + sub;
            var bias = 0.0;
            if (c >= c_end) {
                bias = MASKED;
            } else if (p.has_mask != 0u) {
                bias = mask[tq * p.n_kv + c];
            }
            s[j] = bias;
            any = any || bias > MASKED;
        }
        // The flag is reset only once every invocation has read the last tile's.
        workgroupBarrier();
        if (lid == 0u) {
            atomicStore(&visible, 0u);
        }
        workgroupBarrier();
        if (any && t0 + qi < p.n_tok) {
            atomicOr(&visible, 1u);
        }
        if (workgroupUniformLoad(&visible) == 0u) {
            continue;
        }
        for (var e = lid; e < BK * D4; e += 64u) {
            let r = e / D4;
            let d = e % D4;
            let c = min(c0 + r, c_end - 1u);
            if (d < d4) {
                let o_kv = (c * p.n_head_kv + hk) * d4 + d;
                ks[e] = k_load4(o_kv);
                vs[e] = v_load4(o_kv);
            }
        }
        workgroupBarrier();
        var mx = MASKED;
        for (var j = 0u; j < SJ; j++) {
            if (s[j] > MASKED) {
                let kr = (4u * j + sub) * D4;
                var dotv = 0.0;
                for (var d = 0u; d < d4; d++) {
                    dotv += dot(qs[qi * D4 + d], ks[kr + d]);
                }
                s[j] = capped(dotv * p.scale) + slope * s[j];
                mx = max(mx, s[j]);
            }
        }
        // The row's maximum over its four invocations, then the new running maximum.
        red[lid] = mx;
        workgroupBarrier();
        let r4 = qi * 4u;
        let m_new = max(m, max(max(red[r4], red[r4 + 1u]), max(red[r4 + 2u], red[r4 + 3u])));
        var sum = 0.0;
        for (var j = 0u; j < SJ; j++) {
            let w = select(0.0, exp(s[j] - m_new), s[j] > MASKED);
            ps[qi * BK + 4u * j + sub] = w;
            sum += w;
        }
        red[64u + lid] = sum;
        workgroupBarrier();
        let alpha = exp(m - m_new);
        l = alpha * l + (red[64u + r4] + red[64u + r4 + 1u]) + (red[64u + r4 + 2u] + red[64u + r4 + 3u]);
        m = m_new;
        for (var i = 0u; i < OI; i++) {
            let d = sub + 4u * i;
            var acc = o[i] * alpha;
            if (d < d4) {
                for (var j = 0u; j < BK; j++) {
                    acc += ps[qi * BK + j] * vs[j * D4 + d];
                }
            }
            o[i] = acc;
        }
        // ks, vs and ps are rewritten by the next tile.
        workgroupBarrier();
    }
    if (t0 + qi < p.n_tok) {
{{STORE}}
    }
}
