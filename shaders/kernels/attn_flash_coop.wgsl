// Flash attention for prompts on cooperative matrices (attn_flash.wgsl's algorithm with
// both matrix products on 16 x 16 x 16 f16 matrices, f32 accumulated; the SCORES and PV
// slots, or loops computing the same elements, `shaders::attn_flash_coop_source`): one
// workgroup of 32 invocations (one subgroup; chosen only where the adapter's subgroups are exactly 32) per
// (tile of BQ = 16 tokens, head) walks the cells in tiles of BK = 16. Per tile:
//   scores  S = Q Kᵀ: DP / 16 multiply-adds (DP: the head rounded up to 16, zero-padded),
//           stored to `sc`; the invocations scale and mask them and update each token's
//           running maximum m and sum l (online softmax), writing P = exp(S - m) as f16;
//   output  P V: DP / 16 products, each stored to `pv`, from which each invocation adds
//           its part to the output it holds, rescaled by exp(m_old - m).
// The scalar steps between the products are why S and P V pass through workgroup memory:
// a cooperative matrix's elements are not addressable. Q, K and V are rounded to f16 (as
// llama.cpp's cooperative-matrix flash attention does), P too. Tiles the mask hides from
// every token are skipped whole; chunks (p.chunk > 0) as attn_flash.wgsl's. Heads of up to
// 4 * D4 = 128 values. softmax_common.wgsl is prepended. Workgroup memory: 3 x 4 KiB of f16
// Q, K and V, 8 KiB of P V, 1 KiB of scores and 1 KiB of zeros, 0.5 KiB of P: ~22 KiB.
//
// Invocation lid owns token row qi = lid / 2 of the tile: scores (qi, 8 sub + j) for
// j < 8, and output vec4s (qi, sub + 2 i) for i < D4 / 2, with sub = lid % 2.

const BQ: u32 = 16u;
const BK: u32 = 16u;
const D4: u32 = 32u;
const DP_MAX: u32 = 4u * D4;
const SJ: u32 = 8u;
const OI: u32 = D4 / 2u;
const OSTEP: u32 = 2u;

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

// Row-major [token][d] and [cell][d], rows DP_MAX long.
var<workgroup> qs: array<f16, BQ * DP_MAX>;
var<workgroup> ks: array<f16, BK * DP_MAX>;
var<workgroup> vs: array<f16, BK * DP_MAX>;
// Scores, column-major ([cell][token]); P row-major ([token][cell]); P V column-major
// ([d][token]).
var<workgroup> sc: array<f32, BQ * BK>;
var<workgroup> ps: array<f16, BQ * BK>;
var<workgroup> pv: array<f32, DP_MAX * BQ>;
// The accumulators' starting value.
var<workgroup> zero: array<f32, 256>;
var<workgroup> red: array<f32, 64>;
var<workgroup> visible: atomic<u32>;

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t0 = wid.x * BQ;
    let h = wid.y;
    let d4 = p.head_dim / 4u;
    // Vec4s of a head rounded up to whole 16-value matrices.
    let dp4 = (d4 + 3u) / 4u * 4u;
    let hk = h / (p.n_head / p.n_head_kv);
    let slope = alibi_slope(h);
    let qi = lid / 2u;
    let sub = lid % 2u;
    // Tokens past the end re-read the last one; their outputs are not stored.
    let tq = min(t0 + qi, p.n_tok - 1u);

    for (var e = lid; e < 256u; e += 32u) {
        zero[e] = 0.0;
    }
    for (var e = lid; e < BQ * dp4; e += 32u) {
        let r = e / dp4;
        let d = e % dp4;
        let t = min(t0 + r, p.n_tok - 1u);
        var x = vec4<f32>(0.0);
        if (d < d4) {
            x = q[(t * p.n_head + h) * d4 + d];
        }
        for (var i = 0u; i < 4u; i++) {
            qs[r * DP_MAX + 4u * d + i] = f16(x[i]);
        }
    }
    var m = MASKED;
    var l = 0.0;
    var o: array<vec4<f32>, OI>;

{{RANGE}}
    for (var c0 = c_begin; c0 < c_end; c0 += BK) {
        // This invocation's biases of the tile (MASKED where hidden).
        var s: array<f32, SJ>;
        var any = false;
        for (var j = 0u; j < SJ; j++) {
            let c = c0 + 8u * sub + j;
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
        for (var e = lid; e < BK * dp4; e += 32u) {
            let r = e / dp4;
            let d = e % dp4;
            let c = min(c0 + r, c_end - 1u);
            var kx = vec4<f32>(0.0);
            var vx = vec4<f32>(0.0);
            if (d < d4) {
                let o_kv = (c * p.n_head_kv + hk) * d4 + d;
                kx = k_load4(o_kv);
                vx = v_load4(o_kv);
            }
            for (var i = 0u; i < 4u; i++) {
                ks[r * DP_MAX + 4u * d + i] = f16(kx[i]);
                vs[r * DP_MAX + 4u * d + i] = f16(vx[i]);
            }
        }
        workgroupBarrier();
        // S (tokens x cells) = Q (tokens x d, row-major) times Kᵀ (d x cells: K's rows
        // read column-major), into sc.
{{SCORES}}
        workgroupBarrier();
        var mx = MASKED;
        for (var j = 0u; j < SJ; j++) {
            if (s[j] > MASKED) {
                s[j] = capped(sc[(8u * sub + j) * BQ + qi] * p.scale) + slope * s[j];
                mx = max(mx, s[j]);
            }
        }
        // The row's maximum over its two invocations, then the new running maximum.
        red[lid] = mx;
        workgroupBarrier();
        let m_new = max(m, max(red[2u * qi], red[2u * qi + 1u]));
        var sum = 0.0;
        for (var j = 0u; j < SJ; j++) {
            let w = select(0.0, exp(s[j] - m_new), s[j] > MASKED);
            ps[qi * BK + 8u * sub + j] = f16(w);
            sum += w;
        }
        red[32u + lid] = sum;
        workgroupBarrier();
        let alpha = exp(m - m_new);
        l = alpha * l + red[32u + 2u * qi] + red[32u + 2u * qi + 1u];
        m = m_new;
        // P V (tokens x d) = P (tokens x cells, row-major) times V (cells x d, row-major),
        // 16 values of d at a time, into pv.
{{PV}}
        workgroupBarrier();
        for (var i = 0u; i < OI; i++) {
            let d = sub + 2u * i;
            if (d < d4) {
                let e = 4u * d * BQ + qi;
                o[i] = o[i] * alpha + vec4<f32>(pv[e], pv[e + BQ], pv[e + 2u * BQ], pv[e + 3u * BQ]);
            }
        }
        // Every buffer is rewritten by the next tile.
        workgroupBarrier();
    }
    if (t0 + qi < p.n_tok) {
{{STORE}}
    }
}
