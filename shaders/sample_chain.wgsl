// Sampling, second pass: one workgroup per row takes the k best of the first pass's
// candidates, sorts them (larger logit first, ties by token id), then one invocation
// runs llama.cpp's chain on them in its order and arithmetic — top-p, min-p,
// temperature, the draw with the host's uniform number u — writes (token, its
// probability), and records the token in the session's penalty history (ring and
// per-token counts). Sums of the draw are kept as float pairs (WGSL has no f64).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> rows: array<SampleRow>;
@group(0) @binding(2) var<storage, read> cand: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;
@group(0) @binding(4) var<storage, read_write> ring: array<u32>;
@group(0) @binding(5) var<storage, read_write> result: array<vec2<u32>>;

var<workgroup> s_key: array<u32, 256>;
var<workgroup> s_id: array<u32, 256>;
var<workgroup> o_key: array<u32, 256>;
var<workgroup> o_id: array<u32, 256>;
var<workgroup> o_v: array<f32, 256>;

var<private> row: SampleRow;
var<private> in_base: u32;

fn item_key(i: u32) -> u32 {
    return cand[in_base + i].x;
}

fn item_out(pos: u32, key: u32, i: u32) {
    s_key[pos] = key;
    s_id[pos] = cand[in_base + i].y;
}

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

const NEG_INF_BITS: u32 = 0xff800000u;

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
    for (var i = 0u; i < m; i++) {
        var x = key_f32(o_key[i]);
        if (row.temp <= 0.0) {
            if (i > 0u) {
                x = bitcast<f32>(NEG_INF_BITS);
            }
        } else {
            x = x / row.temp;
        }
        o_v[i] = x;
    }
    if (m == 1u) {
        return vec2<u32>(o_id[0], bitcast<u32>(1.0));
    }
    let mx = o_v[0];
    var total = vec2<f32>(0.0, 0.0);
    for (var i = 0u; i < m; i++) {
        var e = 0.0;
        if (bitcast<u32>(o_v[i]) != NEG_INF_BITS) {
            e = exp(o_v[i] - mx);
        }
        o_v[i] = e;
        total = pair_add(total, e);
    }
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    row = rows[wid.x];
    let n_items = p.n_seg * p.k_stride;
    in_base = wid.x * n_items;
    let per = (n_items + 255u) / 256u;
    let lo = min(lid * per, n_items);
    let hi = min(lo + per, n_items);
    let n = select_top(lid, lo, hi, min(row.k, p.k_stride));
    workgroupBarrier();
    if (lid < n) {
        let kt = s_key[lid];
        let it = s_id[lid];
        var r = 0u;
        for (var j = 0u; j < n; j++) {
            let kj = s_key[j];
            if (kj > kt || (kj == kt && s_id[j] < it)) {
                r++;
            }
        }
        o_key[r] = kt;
        o_id[r] = it;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var out = vec2<u32>(0u, 0u);
        if (n > 0u) {
            out = chain(n);
            if ((row.flags & 2u) != 0u) {
                accept(out.x);
            }
        }
        result[wid.x] = out;
    }
}
