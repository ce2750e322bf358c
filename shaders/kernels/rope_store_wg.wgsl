// rope_store as GPUs run it (after rope_store.wgsl): one workgroup of 64 per (head slot,
// token), the head's values spread over the invocations, with workgroup memory for the
// per-head norm, the Hadamard rotation and packed caches' staging.

var<workgroup> red: array<f32, 64>;
// The K or V head being written, for packed caches (heads of up to 256 values).
var<workgroup> stage: array<f32, 256>;

// llama.cpp's attention rotation of a quantized cache: the head (Q, K or V) is built in
// `stage`, each chunk of n values multiplied by the orthonormal Walsh-Hadamard matrix
// (butterflies in workgroup memory, hadamard_rows.wgsl's order), then written out.
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
