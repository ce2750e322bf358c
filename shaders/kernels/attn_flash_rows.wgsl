// Flash attention for CPU-shaped adapters (lavapipe, llvmpipe): one invocation owns TB
// tokens of one head and walks one chunk of cells, keeping per token the
// running maximum m, the sum l of exp(score - m) and the unnormalised output, rescaled by
// exp(m_old - m) when m grows (online softmax). The scores never reach memory. Each key
// and value vec4 is loaded once for the TB tokens; the queries and outputs stay in the
// invocation's own arrays (D4 vec4s per token: heads up to 4 * D4 values). A cell the
// mask hides from all TB tokens (the causal half of a prompt) costs only the mask reads.
// Invocations over x take (chunk, token group) pairs of one head, token groups fastest:
// the lanes a CPU runs together read the same key and value rows in a prompt, and a
// decoded token's chunks fill the lanes. Loops over the head run to the constant D4
// (guarded), so the compiler can unroll them: with the head size as the bound, lavapipe
// ran a prompt 25 % slower. No barriers: lavapipe runs a workgroup's lanes as coroutines
// that a barrier switches, and a tiled variant (lanes over cells for the scores, over
// the head for the output, four barriers per 64 cells) ran a decoded token 7x slower. Scores are scaled, then given the mask's
// bias times the head's ALiBi slope, as softmax.wgsl computes them. Every chunk writes
// its output and (m, l) in attn_kqv_split.wgsl's layout; attn_kqv_sum.wgsl joins the
// chunks (one chunk: it only divides by l). softmax_common.wgsl is prepended.

const TB: u32 = {{TB}}u;
const D4: u32 = {{D4}}u;

// `Params` is `AttnSplitUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k: array<{{K_ELEM}}>;
@group(0) @binding(3) var<storage, read> v: array<{{V_ELEM}}>;
// [n_kv, n_tok]: MASKED (or less) where a token may not see a cell, else ALiBi's bias.
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read_write> part: array<vec4<f32>>;
// (m, l) per (chunk, token, head).
@group(0) @binding(6) var<storage, read_write> stats: array<vec2<f32>>;

{{K_LOAD}}

{{V_LOAD}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n_groups = (p.n_tok + TB - 1u) / TB;
    let chunk = gid.x / n_groups;
    let t0 = (gid.x % n_groups) * TB;
    let h = gid.y;
    let c_begin = chunk * p.chunk;
    if (c_begin >= p.n_kv) {
        return;
    }
    let d4 = p.head_dim / 4u;
    let hk = h / (p.n_head / p.n_head_kv);
    let slope = alibi_slope(h);
    let row = p.n_head_kv * d4;
    var tq: array<u32, TB>;
    var qs: array<vec4<f32>, TB * D4>;
    for (var j = 0u; j < TB; j++) {
        // Tokens past the end re-read the last one; their outputs are not stored.
        tq[j] = min(t0 + j, p.n_tok - 1u);
        let qo = (tq[j] * p.n_head + h) * d4;
        for (var d = 0u; d < D4; d++) {
            if (d < d4) {
                qs[j * D4 + d] = q[qo + d] * p.scale;
            }
        }
    }
    var m: array<f32, TB>;
    var l: array<f32, TB>;
    var o: array<vec4<f32>, TB * D4>;
    for (var j = 0u; j < TB; j++) {
        m[j] = MASKED;
    }
    // Not a pure function of the uniform: lavapipe specializes loops bounded by uniform
    // values and keeps host memory per dispatch (see attn_kqv.wgsl).
    let c_end = min(min(c_begin + p.chunk, p.n_kv), arrayLength(&mask) / p.n_tok);
    var ko = (c_begin * p.n_head_kv + hk) * d4;
    for (var c = c_begin; c < c_end; c++) {
        var bias: array<f32, TB>;
        var any = false;
        for (var j = 0u; j < TB; j++) {
            bias[j] = select(0.0, mask[tq[j] * p.n_kv + c], p.has_mask != 0u);
            any = any || bias[j] > MASKED;
        }
        if (any) {
            // Zeroed by an initializer, not by the declaration: Chromium's WebGPU on
            // SwiftShader kept a loop body's uninitialised `var` from the last iteration
            // (the page decoded garbage through this kernel until these said `()`).
            var s = array<f32, TB>();
            for (var d = 0u; d < D4; d++) {
                if (d < d4) {
                    let kv = k_load4(ko + d);
                    for (var j = 0u; j < TB; j++) {
                        s[j] += dot(qs[j * D4 + d], kv);
                    }
                }
            }
            var w = array<f32, TB>();
            for (var j = 0u; j < TB; j++) {
                if (bias[j] > MASKED) {
                    let x = capped(s[j]) + slope * bias[j];
                    if (x > m[j]) {
                        let alpha = exp(m[j] - x);
                        m[j] = x;
                        l[j] *= alpha;
                        for (var d = 0u; d < D4; d++) {
                            o[j * D4 + d] *= alpha;
                        }
                    }
                    w[j] = exp(x - m[j]);
                    l[j] += w[j];
                }
            }
            for (var d = 0u; d < D4; d++) {
                if (d < d4) {
                    let vv = v_load4(ko + d);
                    for (var j = 0u; j < TB; j++) {
                        o[j * D4 + d] += w[j] * vv;
                    }
                }
            }
        }
        ko += row;
    }
    for (var j = 0u; j < TB; j++) {
        if (t0 + j < p.n_tok) {
            let r = (chunk * p.n_tok + t0 + j) * p.n_head + h;
            for (var d = 0u; d < D4; d++) {
                if (d < d4) {
                    part[r * d4 + d] = o[j * D4 + d];
                }
            }
            stats[r] = vec2<f32>(m[j], l[j]);
        }
    }
}
