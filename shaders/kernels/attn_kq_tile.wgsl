// Attention scores for prompts on GPUs as a tiled matrix product:
// kq[h][t][c] = dot(q[t][h], k[c][h / (n_head / n_head_kv)]), one workgroup of 256 per
// tile of 64 cells x 64 tokens of one head. The head is walked in slices of DK vec4s:
// the tile's keys and queries are staged in workgroup memory (the next slice fetched into
// registers while this one is multiplied), and each invocation owns a 4 x 4 micro-tile
// (cells tx + 16 i, tokens ty + 16 j): 8 vec4 loads of workgroup memory per 16 dot
// products, where attn_kq.wgsl loads a query vec4 per dot product. A tile the mask hides
// from all its tokens (the causal half of a prompt's own cells) is skipped whole: the
// softmax masks its scores whatever they hold. After attn_kq_io.wgsl (the bindings).

const DK: u32 = {{DK}}u;
// vec4s of keys (and of queries) each invocation fetches per slice.
const NL: u32 = DK / 4u;

// [k4][cell] and [k4][token]: invocations with consecutive tx (ty) read consecutive vec4s.
var<workgroup> ks: array<vec4<f32>, 64u * DK>;
var<workgroup> qs: array<vec4<f32>, 64u * DK>;
var<workgroup> seen_any: atomic<u32>;
var<workgroup> seen: u32;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c0 = wid.x * 64u;
    let t0 = wid.y * 64u;
    let h = wid.z;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let hk = h / (p.n_head / p.n_head_kv);
    let d4 = p.head_dim / 4u;

    // Whether the mask lets any token of the tile see any of its cells.
    var vis = false;
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + ty + 16u * j;
        for (var i = 0u; i < 4u; i++) {
            let c = c0 + tx + 16u * i;
            if (t < p.n_tok && c < p.n_kv) {
                vis = vis || mask[t * p.n_kv + c] > -1e30;
            }
        }
    }
    if (vis) {
        atomicOr(&seen_any, 1u);
    }
    workgroupBarrier();
    if (lid == 0u) {
        seen = atomicLoad(&seen_any);
    }
    if (workgroupUniformLoad(&seen) == 0u) {
        return;
    }

    // Slice s + 1's keys and queries are fetched into registers while slice s is
    // multiplied out of workgroup memory.
    var kr: array<vec4<f32>, NL>;
    var qr: array<vec4<f32>, NL>;
    for (var r = 0u; r < NL; r++) {
        kr[r] = key(c0, hk, d4, lid + 256u * r, 0u);
        qr[r] = query(t0, h, d4, lid + 256u * r, 0u);
    }
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let n_slices = (d4 + DK - 1u) / DK;
    for (var s = 0u; s < n_slices; s++) {
        for (var r = 0u; r < NL; r++) {
            let e = lid + 256u * r;
            ks[(e % DK) * 64u + e / DK] = kr[r];
            qs[(e % DK) * 64u + e / DK] = qr[r];
        }
        workgroupBarrier();
        if (s + 1u < n_slices) {
            for (var r = 0u; r < NL; r++) {
                kr[r] = key(c0, hk, d4, lid + 256u * r, s + 1u);
                qr[r] = query(t0, h, d4, lid + 256u * r, s + 1u);
            }
        }
        for (var kk = 0u; kk < DK; kk++) {
            let a0 = ks[kk * 64u + tx];
            let a1 = ks[kk * 64u + tx + 16u];
            let a2 = ks[kk * 64u + tx + 32u];
            let a3 = ks[kk * 64u + tx + 48u];
            let b0 = qs[kk * 64u + ty];
            let b1 = qs[kk * 64u + ty + 16u];
            let b2 = qs[kk * 64u + ty + 32u];
            let b3 = qs[kk * 64u + ty + 48u];
            acc0 += vec4<f32>(dot(a0, b0), dot(a1, b0), dot(a2, b0), dot(a3, b0));
            acc1 += vec4<f32>(dot(a0, b1), dot(a1, b1), dot(a2, b1), dot(a3, b1));
            acc2 += vec4<f32>(dot(a0, b2), dot(a1, b2), dot(a2, b2), dot(a3, b2));
            acc3 += vec4<f32>(dot(a0, b3), dot(a1, b3), dot(a2, b3), dot(a3, b3));
        }
        workgroupBarrier();
    }
    store(t0 + ty, c0 + tx, h, acc0);
    store(t0 + ty + 16u, c0 + tx, h, acc1);
    store(t0 + ty + 32u, c0 + tx, h, acc2);
    store(t0 + ty + 48u, c0 + tx, h, acc3);
}

// Token t's scores of cells c, c + 16, c + 32 and c + 48 (those inside the shape).
fn store(t: u32, c: u32, h: u32, v: vec4<f32>) {
    if (t >= p.n_tok) {
        return;
    }
    let o = (h * p.n_tok + t) * p.n_kv + c;
    for (var i = 0u; i < 4u; i++) {
        if (c + 16u * i < p.n_kv) {
            kq[o + 16u * i] = v[i];
        }
    }
}

// Element e of slice s of the tile's keys: vec4 e % DK of the slice of cell c0 + e / DK
// (zeros past the cells or the head).
fn key(c0: u32, hk: u32, d4: u32, e: u32, s: u32) -> vec4<f32> {
    let d = s * DK + e % DK;
    let c = c0 + e / DK;
    if (d >= d4 || c >= p.n_kv) {
        return vec4<f32>(0.0);
    }
    return k_load4((c * p.n_head_kv + hk) * d4 + d);
}

// The same element of the tile's queries, of token t0 + e / DK.
fn query(t0: u32, h: u32, d4: u32, e: u32, s: u32) -> vec4<f32> {
    let d = s * DK + e % DK;
    let t = t0 + e / DK;
    if (d >= d4 || t >= p.n_tok) {
        return vec4<f32>(0.0);
    }
    return q[(t * p.n_head + h) * d4 + d];
}
