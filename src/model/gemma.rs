//! The Gemma 2 and 3 architectures: embeddings scaled by sqrt(n_embd); RMS norms both
//! before and after attention and the feed-forward (the "sandwich"); a GELU-gated
//! feed-forward; the output tied to the embeddings; layers attending over a sliding window
//! interleaved with global ones.
//! * Gemma 2: every other layer (the even ones) sees a window; the attention scores and
//!   the output logits are soft-capped (`Hparams::attn_softcap`, `final_softcap`).
//! * Gemma 3: per-head RMS norms of Q and K; five of every six layers see a window, with
//!   their own RoPE base.

use super::{
    attn_shape, close_layer, kv_layer, layer_input, output_head, Arch, CacheKind, GraphIo, Model,
};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, Graph, GraphBuilder};
use crate::kv::MaskKind;
use crate::memory::Memory;
use crate::ops::glu::Activation;
use crate::ops::softmax::SoftmaxParams;

/// A norm vector every Gemma layer of the kind has: a missing one is a loader bug, reported.
fn need<'a>(v: &'a Option<crate::ops::View>, what: &str) -> Result<&'a crate::ops::View, GpuError> {
    v.as_ref()
        .ok_or_else(|| GpuError::Validation(format!("gemma layer without its {what}")))
}

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w, gpu) = (&m.hp, &m.weights, &*m.gpu);
    let (t, eps) = (io.n_tok, hp.eps);
    let mut g = GraphBuilder::new_on(gpu);
    let tokens = g.input(io.tokens()?, [t, 1]);
    let global_slots = g.input(io.kv_slots(CacheKind::Full)?, [t, 1]);
    let local_slots = g.input(io.kv_slots(CacheKind::Window)?, [t, 1]);
    let global_mask = g.input(io.mask(MaskKind::default())?, [io.n_kv, t]);
    let local_mask = g.input(io.mask(super::window_mask(hp))?, [io.n_kv_window, t]);
    let global_rope = g.input(io.rope(hp.rope)?, [hp.rope.n_dims, t]);
    let local_rope = g.input(io.rope(hp.rope_swa)?, [hp.rope_swa.n_dims, t]);
    let global_shape = attn_shape(hp, mem, t, io.n_kv);
    let local_shape = attn_shape(hp, mem, t, io.n_kv_window);
    // Gemma scales Q before the product; scaling the scores instead is the same.
    let sp = SoftmaxParams {
        scale: hp.attn_scale,
        max_bias: 0.0,
        n_head: hp.n_head,
        softcap: hp.attn_softcap,
    };
    let mut x = g.get_rows(&w.tok_embd, tokens);
    if let Some(s) = &w.embd_scale {
        let s = g.input(s.clone(), [1, 1]);
        x = g.mul(x, s);
    }
    // The attention norm of layer il > 0 comes out of the previous layer's fused
    // residual add; layer 0 norms the scaled embeddings on its own.
    let mut normed = None;
    for (il, lw) in w.layers.iter().enumerate() {
        let kv = kv_layer(mem, il)?;
        let cur = layer_input(&mut g, &mut normed, x, &lw.attn_norm, eps);
        // The memory says which store holds the layer's rows (the rolling buffer, or the
        // full store with --swa-full); the model says what the layer sees.
        let (slots, shape) = match kv.store {
            CacheKind::Full => (global_slots, global_shape),
            CacheKind::Window => (local_slots, local_shape),
        };
        let (mask, rope) = match hp.is_swa(il) {
            true => (local_mask, local_rope),
            false => (global_mask, global_rope),
        };
        // Gemma 3 norms Q and K heads; Gemma 2 does not.
        let qk_norm = match hp.arch {
            Arch::Gemma3 => Some((
                need(&lw.attn_q_norm, "Q norm")?,
                need(&lw.attn_k_norm, "K norm")?,
                eps,
            )),
            _ => None,
        };
        let attn = AttnBlock {
            qkv: &lw.qkv,
            qkv_bias: lw.qkv_bias.as_ref(),
            wo: &lw.wo,
            k_cache: kv.k,
            v_cache: kv.v,
            slots,
            mask,
            rope,
            rope_p: hp.layer_rope(il),
            shape,
            sp,
            qk_norm,
            sinks: None,
            wo_bias: None,
        };
        let o = g.attn_block(gpu, cur, &attn)?;
        let o = g.rms_norm(o, need(&lw.attn_post_norm, "post-attention norm")?, eps);
        let (x_attn, cur) = g.add_rms_norm(x, o, &lw.ffn_norm, eps);
        let ffn = g.ffn(cur, &lw.ffn, Activation::Gelu);
        let ffn = g.rms_norm(ffn, need(&lw.ffn_post_norm, "post-feed-forward norm")?, eps);
        x = close_layer(&mut g, &w.layers, il, (x_attn, ffn), eps, &mut normed);
    }

    output_head(g, m, io, x)
}
