// The step between the fused Q/K/V projection and attention, in one dispatch: from the
// projection's output [q heads | k heads | v heads] per token, Q heads are (optionally
// RMS-normed per head, then) rotated into `q`; K heads the same, rotated straight into
// the K cache at the token's cell; V heads are copied into the V cache. Replaces two RoPE
// dispatches, two set_rows and (Gemma) two per-head norms. The (cos, sin) table comes
// from the host (f64 angles), as for rope.wgsl. K and V heads are written through
// k_put/v_put: plain caches (f32, f16) take each value at once, packed ones (bf16, the
// block types) collect the head in `stage` and k_flush/v_flush quantize it a block per
// invocation after a barrier (src/ops/shaders.rs generates both).
// One workgroup of 64 per (head slot, token): slots [0, n_head) are Q heads, then
// n_head_kv K heads, then n_head_kv V heads.

const NORM: bool = {{NORM}};

// `Params` is `RopeStoreUniform` in src/ops/uniforms.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> q: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<{{K_ELEM}}>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<{{V_ELEM}}>;
{{NORM_BINDINGS}}

var<workgroup> red: array<f32, 64>;
// The K or V head being written, for packed caches (heads of up to 256 values).
var<workgroup> stage: array<f32, 256>;

{{KV_STORE}}

// Element e of the head being processed, normed when NORM (scale is 1 otherwise).
fn head_val(src: u32, e: u32, scale: f32, is_q: bool) -> f32 {
    var v = qkv[src + e];
    if (NORM) {
        v *= scale * norm_weight(e, is_q);
    }
    return v;
}

// RoPE pair i of the head starting at src (scaled by the norm's `scale`): positions a, b
// and their rotated values.
struct Pair {
    a: u32,
    b: u32,
    y0: f32,
    y1: f32,
}

fn rope_pair(i: u32, t: u32, src: u32, scale: f32, is_q: bool) -> Pair {
    let half_dims = p.n_dims / 2u;
    var a = 2u * i;
    var b = a + 1u;
    if (p.neox != 0u) {
        a = i;
        b = i + half_dims;
    }
    let r = cs[t * half_dims + i];
    let x0 = head_val(src, a, scale, is_q);
    let x1 = head_val(src, b, scale, is_q);
    return Pair(a, b, x0 * r.x - x1 * r.y, x0 * r.y + x1 * r.x);
}

// llama.cpp's attention rotation of a quantized cache: the head (Q, K or V) is built in
// `stage`, each chunk of n values multiplied by the orthonormal Walsh-Hadamard matrix
// (butterflies in workgroup memory, hadamard.wgsl's order), then written out.
fn rotated(t: u32, h: u32, src: u32, scale: f32, is_q: bool, is_v: bool, n: u32, lid: u32) {
    let hd = p.head_dim;
    let kv_row = slots[t] * (p.n_head_kv * hd);
    if (is_v) {
        for (var e = lid; e < hd; e += 64u) {
            stage[e] = qkv[src + e];
        }
    } else {
        for (var i = lid; i < p.n_dims / 2u; i += 64u) {
            let r = rope_pair(i, t, src, scale, is_q);
            stage[r.a] = r.y0;
            stage[r.b] = r.y1;
        }
        for (var e = p.n_dims + lid; e < hd; e += 64u) {
            stage[e] = head_val(src, e, scale, is_q);
        }
    }
    workgroupBarrier();
    for (var s = 1u; s < n; s *= 2u) {
        for (var i = lid; i < hd / 2u; i += 64u) {
            let k = i % (n / 2u);
            let a = (i / (n / 2u)) * n + (k / s) * 2u * s + k % s;
            let x0 = stage[a];
            stage[a] = x0 + stage[a + s];
            stage[a + s] = x0 - stage[a + s];
        }
        workgroupBarrier();
    }
    let sc = inverseSqrt(f32(n));
    let v_dst = kv_row + (h - p.n_head - p.n_head_kv) * hd;
    let k_dst = kv_row + (h - p.n_head) * hd;
    for (var e = lid; e < hd; e += 64u) {
        let y = stage[e] * sc;
        if (is_q) {
            q[t * p.n_head * hd + h * hd + e] = y;
        } else if (is_v) {
            v_put(v_dst, e, y);
        } else {
            k_put(k_dst, e, y);
        }
    }
    workgroupBarrier();
    if (is_v) {
        v_flush(v_dst, hd, lid);
    } else if (!is_q) {
        k_flush(k_dst, hd, lid);
    }
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

    let n_rot = select(p.rot_k, p.rot_v, is_v);
    if (n_rot > 0u) {
        rotated(t, h, src, scale, is_q, is_v, n_rot, lid);
        return;
    }

    let v_dst = kv_row + (h - p.n_head - p.n_head_kv) * hd;
    let k_dst = kv_row + (h - p.n_head) * hd;
    if (is_v) {
        for (var e = lid; e < hd; e += 64u) {
            v_put(v_dst, e, qkv[src + e]);
        }
        workgroupBarrier();
        v_flush(v_dst, hd, lid);
        return;
    }

    for (var i = lid; i < p.n_dims / 2u; i += 64u) {
        let r = rope_pair(i, t, src, scale, is_q);
        if (is_q) {
            let dst = t * p.n_head * hd + h * hd;
            q[dst + r.a] = r.y0;
            q[dst + r.b] = r.y1;
        } else {
            k_put(k_dst, r.a, r.y0);
            k_put(k_dst, r.b, r.y1);
        }
    }
    // Dimensions past n_dims pass through unrotated.
    for (var e = p.n_dims + lid; e < hd; e += 64u) {
        let y = head_val(src, e, scale, is_q);
        if (is_q) {
            q[t * p.n_head * hd + h * hd + e] = y;
        } else {
            k_put(k_dst, e, y);
        }
    }
    if (!is_q) {
        workgroupBarrier();
        k_flush(k_dst, hd, lid);
    }
}
