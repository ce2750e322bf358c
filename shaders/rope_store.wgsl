// The step between the fused Q/K/V projection and attention, in one dispatch: from the
// projection's output [q heads | k heads | v heads] per token, Q heads are (optionally
// RMS-normed per head, then) rotated into `q`; K heads the same, rotated straight into
// the K cache at the token's cell; V heads are copied into the V cache. Replaces two RoPE
// dispatches, two set_rows and (Gemma) two per-head norms. The (cos, sin) table comes
// from the host (f64 angles), as for rope.wgsl. KV_T: the cache's f16 or f32.
// One workgroup of 64 per (head slot, token): slots [0, n_head) are Q heads, then
// n_head_kv K heads, then n_head_kv V heads.

const NORM: bool = {{NORM}};

// `Params` is `RopeStoreUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> q: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<{{KV_T}}>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<{{KV_T}}>;
{{NORM_BINDINGS}}

var<workgroup> red: array<f32, 64>;

// Element e of the head being processed, normed when NORM (scale is 1 otherwise).
fn head_val(src: u32, e: u32, scale: f32, is_q: bool) -> f32 {
    var v = qkv[src + e];
    if (NORM) {
        v *= scale * norm_weight(e, is_q);
    }
    return v;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let hd = p.head_dim;
    let n_slots = p.n_head + 2u * p.n_head_kv;
    let src = (t * n_slots + h) * hd;
    let is_q = h < p.n_head;
    let is_v = h >= p.n_head + p.n_head_kv;
    let kv_row = slots[t] * (p.n_head_kv * hd);

    var scale = 1.0;
    if (NORM) {
        var s = 0.0;
        for (var e = lid; e < hd; e += 64u) {
            let v = qkv[src + e];
            s += v * v;
        }
        red[lid] = s;
        workgroupBarrier();
        for (var w = 32u; w > 0u; w >>= 1u) {
            if (lid < w) {
                red[lid] += red[lid + w];
            }
            workgroupBarrier();
        }
        scale = inverseSqrt(red[0] / f32(hd) + p.eps);
    }

    if (is_v) {
        let dst = kv_row + (h - p.n_head - p.n_head_kv) * hd;
        for (var e = lid; e < hd; e += 64u) {
            v_cache[dst + e] = {{KV_T}}(qkv[src + e]);
        }
        return;
    }

    let half_dims = p.n_dims / 2u;
    for (var i = lid; i < half_dims; i += 64u) {
        var a = 2u * i;
        var b = a + 1u;
        if (p.neox != 0u) {
            a = i;
            b = i + half_dims;
        }
        let r = cs[t * half_dims + i];
        let x0 = head_val(src, a, scale, is_q);
        let x1 = head_val(src, b, scale, is_q);
        let y0 = x0 * r.x - x1 * r.y;
        let y1 = x0 * r.y + x1 * r.x;
        if (is_q) {
            let dst = t * p.n_head * hd + h * hd;
            q[dst + a] = y0;
            q[dst + b] = y1;
        } else {
            let dst = kv_row + (h - p.n_head) * hd;
            k_cache[dst + a] = {{KV_T}}(y0);
            k_cache[dst + b] = {{KV_T}}(y1);
        }
    }
    // Dimensions past n_dims pass through unrotated.
    for (var e = p.n_dims + lid; e < hd; e += 64u) {
        let y = head_val(src, e, scale, is_q);
        if (is_q) {
            q[t * p.n_head * hd + h * hd + e] = y;
        } else {
            k_cache[kv_row + (h - p.n_head) * hd + e] = {{KV_T}}(y);
        }
    }
}
