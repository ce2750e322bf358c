// rope_store as CPU-like adapters run it (after rope_store.wgsl): one invocation per
// (head slot, token), looping over its head, with no workgroup memory and no barrier (a
// barrier anywhere in a kernel makes SwiftShader run every SIMD group of the workgroup as
// a coroutine). For plain caches (f32, f16) without the Hadamard rotation: packed caches
// and rotations take rope_store_wg.wgsl. Workgroups are (64 head slots, one token).

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n_slots = p.n_head + 2u * p.n_head_kv;
    let h = wid.x * 64u + lid;
    let t = wid.y;
    if (h >= n_slots) {
        return;
    }
    let hd = p.head_dim;
    let src = (t * n_slots + h) * hd;
    let kv_row = slots[t] * (p.n_head_kv * hd);
    if (h >= p.n_head + p.n_head_kv) {
        let v_dst = kv_row + (h - p.n_head - p.n_head_kv) * hd;
        for (var e = 0u; e < hd; e++) {
            v_put(v_dst, e, qkv[src + e]);
        }
        return;
    }
    let is_q = h < p.n_head;
    var scale = 1.0;
    if (NORM) {
        var s = 0.0;
        for (var e = 0u; e < hd; e++) {
            let v = qkv[src + e];
            s += v * v;
        }
        scale = inverseSqrt(s / f32(hd) + p.eps);
    }
    let q_dst = (t * p.n_head + h) * hd;
    let k_dst = kv_row + (h - p.n_head) * hd;
    for (var i = 0u; i < (p.n_dims >> 1u); i++) {
        let r = rope_pair(i, t, src, scale, is_q);
        if (is_q) {
            q[q_dst + r.a] = r.y0;
            q[q_dst + r.b] = r.y1;
        } else {
            k_put(k_dst, r.a, r.y0);
            k_put(k_dst, r.b, r.y1);
        }
    }
    // Dimensions past n_dims pass through unrotated.
    for (var e = p.n_dims; e < hd; e++) {
        let y = head_val(src, e, scale, is_q);
        if (is_q) {
            q[q_dst + e] = y;
        } else {
            k_put(k_dst, e, y);
        }
    }
}
