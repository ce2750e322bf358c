// Row softmax of (x * scale + slope * mask), as ggml_soft_max_ext: mask is [n_cols, rows_per_head]
// (one row per token, shared by every head); slope is 1, or the ALiBi slope of the row's
// head when max_bias > 0. Masked entries (-inf) get exactly 0. softmax_common.wgsl
// (MASKED, alibi_slope) is prepended.

// `Params` is `SoftmaxUniform` in src/ops/softmax.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> mask: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
// With p.has_sinks, one logit per head that joins the row's maximum and sum (gpt-oss's
// attention sinks: probability mass that goes to no cell).
@group(0) @binding(3) var<storage, read> sinks: array<f32>;

// WG invocations per row: 64 on CPU-like adapters, 256 on GPUs (a decoded token's few
// rows over a deep cache must still fill the device).
const WG: u32 = {{WG}}u;

var<workgroup> red: array<f32, WG>;

fn reduce_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * 65535u + wid.x;
    let t = row % p.rows_per_head;
    let h = row / p.rows_per_head;
    let slope = alibi_slope(h);
    let base = row * p.n_cols;
    let mbase = t * p.n_cols;
    var mx = MASKED;
    for (var c = lid; c < p.n_cols; c += WG) {
        var v = capped(x[base + c] * p.scale);
        if (p.has_mask != 0u) {
            let m = mask[mbase + c];
            v = select(v + slope * m, MASKED, m <= MASKED);
        }
        x[base + c] = v;
        mx = max(mx, v);
    }
    mx = reduce_max(mx, lid);
    if (p.has_sinks != 0u) {
        mx = max(mx, sinks[h]);
    }
    var sum = 0.0;
    for (var c = lid; c < p.n_cols; c += WG) {
        let v = x[base + c];
        var e = 0.0;
        if (v > MASKED) {
            e = exp(v - mx);
        }
        x[base + c] = e;
        sum += e;
    }
    sum = reduce_sum(sum, lid);
    if (p.has_sinks != 0u) {
        sum += exp(sinks[h] - mx);
    }
    let inv = select(0.0, 1.0 / sum, sum > 0.0);
    for (var c = lid; c < p.n_cols; c += WG) {
        x[base + c] *= inv;
    }
}
