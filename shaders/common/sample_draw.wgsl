// Shared by both shapes of sampling's second pass: llama.cpp's chain on a row's sorted
// candidates (the including kernel holds them in o_key, o_id and o_v, at least 256
// each), the final candidates' probabilities, and the penalty history's update. Expects
// `p: Params`, `row: SampleRow` and the `result`, `probs`, `counts` and `ring` bindings.

// What the chain kept: candidates (best first in o_id, weights in o_v) and the weights'
// sum, for write_probs.
var<private> kept: u32;
var<private> kept_total: f32;

// Float pairs (hi, lo) standing in for the f64 sums of llama.cpp's draw.
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    let bb = s - a;
    return vec2<f32>(s, (a - (s - bb)) + (b - bb));
}

fn pair_add(a: vec2<f32>, b: f32) -> vec2<f32> {
    let s = two_sum(a.x, b);
    let t = s.y + a.y;
    let r = s.x + t;
    return vec2<f32>(r, t - (r - s.x));
}

fn pair_mul(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let hi = a.x * b.x;
    let lo = a.x * b.y + a.y * b.x;
    let r = hi + lo;
    return vec2<f32>(r, lo - (r - hi));
}

fn pair_ge(a: vec2<f32>, b: vec2<f32>) -> bool {
    let d = two_sum(a.x, -b.x);
    return d.x + (d.y + (a.y - b.y)) >= 0.0;
}

fn chain(n_in: u32) -> vec2<u32> {
    var m = n_in;
    let x0 = key_f32(o_key[0]);
    if (row.top_p < 1.0) {
        var sum = 0.0;
        for (var i = 0u; i < m; i++) {
            let e = exp(key_f32(o_key[i]) - x0);
            o_v[i] = e;
            sum += e;
        }
        var cum = 0.0;
        var last = m;
        for (var i = 0u; i < m; i++) {
            cum += o_v[i] / sum;
            if (cum >= row.top_p && i + 1u >= row.min_keep) {
                last = i + 1u;
                break;
            }
        }
        m = last;
    }
    if (row.min_p > 0.0) {
        let min_logit = x0 + log(row.min_p);
        var i = 1u;
        for (; i < m; i++) {
            if (key_f32(o_key[i]) < min_logit && i >= row.min_keep) {
                break;
            }
        }
        m = i;
    }
    // Temperature 0 leaves only the first of the sorted candidates a weight (the others
    // are -inf on the host): the draw takes it whatever the number.
    if (row.temp <= 0.0 || m == 1u) {
        o_v[0] = 1.0;
        kept = 1u;
        kept_total = 1.0;
        return vec2<u32>(o_id[0], bitcast<u32>(1.0));
    }
    for (var i = 0u; i < m; i++) {
        o_v[i] = key_f32(o_key[i]) / row.temp;
    }
    let mx = o_v[0];
    var total = vec2<f32>(0.0, 0.0);
    for (var i = 0u; i < m; i++) {
        let e = exp(o_v[i] - mx);
        o_v[i] = e;
        total = pair_add(total, e);
    }
    kept = m;
    kept_total = total.x + total.y;
    let goal = pair_mul(total, vec2<f32>(row.u_hi, row.u_lo));
    var run = vec2<f32>(0.0, 0.0);
    var sel = m - 1u;
    for (var i = 0u; i < m; i++) {
        run = pair_add(run, o_v[i]);
        if (pair_ge(run, goal)) {
            sel = i;
            break;
        }
    }
    return vec2<u32>(o_id[sel], bitcast<u32>(o_v[sel] / (total.x + total.y)));
}

// Row r's first n_probs final candidates with their probabilities (llama-server's
// post-sampling probabilities); places past what the chain kept get (0, 0.0).
fn write_probs(r: u32) {
    let n = min(row.n_probs, p.probs_stride);
    for (var i = 0u; i < n; i++) {
        var out = vec2<u32>(0u, 0u);
        if (i < kept) {
            out = vec2<u32>(o_id[i], bitcast<u32>(o_v[i] / kept_total));
        }
        probs[r * p.probs_stride + i] = out;
    }
}

// Row r's end, once its n sorted candidates are in place: runs the chain, records the
// token in the penalty history where asked, and writes (token, probability) and the
// final candidates (nothing kept when n is 0: token 0, probability 0).
fn finish_row(r: u32, n: u32) {
    var out = vec2<u32>(0u, 0u);
    kept = 0u;
    if (n > 0u) {
        out = chain(n);
        if ((row.flags & 2u) != 0u) {
            accept(out.x);
        }
    }
    write_probs(r);
    result[r] = out;
}

// The token joins the session's last ring_cap tokens; the oldest leaves when full.
fn accept(t: u32) {
    let cap = row.ring_cap;
    if (cap == 0u) {
        return;
    }
    let base = row.slot * (p.ring_max + 2u);
    let counts_base = row.slot * p.n_vocab;
    let head = ring[base];
    let len = ring[base + 1u];
    if (len >= cap) {
        let old = ring[base + 2u + head];
        counts[counts_base + old] -= 1u;
        ring[base + 2u + head] = t;
        ring[base] = (head + 1u) % cap;
    } else {
        ring[base + 2u + (head + len) % cap] = t;
        ring[base + 1u] = len + 1u;
    }
    counts[counts_base + t] += 1u;
}
