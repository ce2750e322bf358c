// The step between the fused Q/K/V projection and attention, in one dispatch: from the
// projection's output [q heads | k heads | v heads] per token, Q heads are (optionally
// RMS-normed per head, then) rotated into `q`; K heads the same, rotated straight into
// the K cache at the token's cell; V heads are copied into the V cache. Replaces two RoPE
// dispatches, two set_rows and (Gemma) two per-head norms. The (cos, sin) table comes
// from the host (f64 angles), as for rope.wgsl. K and V heads are written through
// k_put/v_put: plain caches (f32, f16) take each value at once, packed ones (bf16, the
// block types) collect the head in `stage` and k_flush/v_flush quantize it a block per
// invocation after a barrier (src/ops/shaders.rs generates both).
// Head slots [0, n_head) of a token are Q heads, then n_head_kv K heads, then n_head_kv V
// heads. This file holds the bindings and the per-element helpers; rope_store_wg.wgsl
// (a workgroup of 64 per head slot and token) or rope_store_rows.wgsl (an invocation per
// head slot and token) follows with the kernel.

const NORM: bool = {{NORM}};

// `Params` is `RopeStoreUniform` in src/ops/rope_store.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> q: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<{{K_ELEM}}>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<{{V_ELEM}}>;
{{NORM_BINDINGS}}

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

