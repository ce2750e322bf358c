// Expert routing of a mixture-of-experts layer (llama.cpp's build_moe_ffn gating), one
// invocation per token: the router's logits [n_tok][n_expert] to probabilities (GATING 0:
// softmax, as ggml's soft_max: exp(l - max) times 1 / sum; 1: sigmoid; 2: the logits
// themselves, softmax taken over the chosen ones after), the n_used most probable
// experts in order (the lower index first among equal ones), their probabilities as the
// weights, renormalised to sum 1 where p.norm (the sum clamped at 2^-14, as llama.cpp
// does) and scaled by p.scale where it is neither 0 nor 1. Writes ids[t][j] and
// weights[t][j].

const MAX_USED: u32 = 16u;

// `Params` is `MoeRouteUniform` in src/ops/moe.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = (wid.y * p.wg_x + wid.x) * 64u + lid;
    if (t >= p.n_tok) {
        return;
    }
    let row = t * p.n_expert;
    var mx = logits[row];
    for (var e = 1u; e < p.n_expert; e++) {
        mx = max(mx, logits[row + e]);
    }
    var inv_sum = 1.0;
    if (p.gating == 0u) {
        var sum = 0.0;
        for (var e = 0u; e < p.n_expert; e++) {
            sum += exp(logits[row + e] - mx);
        }
        inv_sum = 1.0 / sum;
    }
    var chosen: array<u32, MAX_USED>;
    var w: array<f32, MAX_USED>;
    for (var j = 0u; j < p.n_used; j++) {
        var best = 0u;
        var best_p = 0.0;
        var found = false;
        for (var e = 0u; e < p.n_expert; e++) {
            var taken = false;
            for (var i = 0u; i < j; i++) {
                taken = taken || chosen[i] == e;
            }
            if (taken) {
                continue;
            }
            let l = logits[row + e];
            var pr = l;
            if (p.gating == 0u) {
                pr = exp(l - mx) * inv_sum;
            } else if (p.gating == 1u) {
                pr = 1.0 / (1.0 + exp(-l));
            }
            if (!found || pr > best_p) {
                best = e;
                best_p = pr;
                found = true;
            }
        }
        chosen[j] = best;
        w[j] = best_p;
    }
    if (p.gating == 2u) {
        // Softmax over the chosen logits (the first is their maximum).
        let top = w[0];
        var sum = 0.0;
        for (var j = 0u; j < p.n_used; j++) {
            w[j] = exp(w[j] - top);
            sum += w[j];
        }
        for (var j = 0u; j < p.n_used; j++) {
            w[j] *= 1.0 / sum;
        }
    }
    if (p.norm != 0u) {
        var sum = 0.0;
        for (var j = 0u; j < p.n_used; j++) {
            sum += w[j];
        }
        sum = max(sum, 6.103515625e-5);
        for (var j = 0u; j < p.n_used; j++) {
            w[j] /= sum;
        }
    }
    let scaled = p.scale != 0.0 && p.scale != 1.0;
    for (var j = 0u; j < p.n_used; j++) {
        ids[t * p.n_used + j] = chosen[j];
        weights[t * p.n_used + j] = select(w[j], w[j] * p.scale, scaled);
    }
}
