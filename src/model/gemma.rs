//! The Gemma 2 and 3 architectures: embeddings scaled by sqrt(n_embd); RMS norms both
//! before and after attention and the feed-forward (the "sandwich"); a GELU-gated
//! feed-forward; the output tied to the embeddings; layers attending over a sliding window
//! interleaved with global ones.
//! * Gemma 2: every other layer (the even ones) sees a window; the attention scores and
//!   the output logits are soft-capped (`Hparams::attn_softcap`, `final_softcap`).
//! * Gemma 3: per-head RMS norms of Q and K; five of every six layers see a window, with
//!   their own RoPE base.

use super::{input_rows, kv_layer, layer_attn, output_head, Arch, GraphIo, Model, Windowed};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, Graph};
use crate::memory::Memory;
use crate::ops::glu::Activation;

/// A norm vector every Gemma layer of the kind has: a missing one is a loader bug, reported.
fn need<'a>(v: &'a Option<crate::ops::View>, what: &str) -> Result<&'a crate::ops::View, GpuError> {
    v.as_ref()
        .ok_or_else(|| GpuError::Validation(format!("gemma layer without its {what}")))
}

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let eps = hp.eps;
    let mut g = super::builder(m, io);
    // Gemma scales Q before the product; the softmax scaling the scores is the same.
    let inp = Windowed::new(&mut g, hp, io, mem)?;
    let mut x = input_rows(&mut g, m, io, inp.tokens)?;
    for (il, lw) in w.layers.iter().enumerate() {
        g.layer(il);
        let kv = kv_layer(mem, il)?;
        let cur = g.rms_norm(x, &lw.attn_norm, eps);
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
            qk_norm,
            ..layer_attn(lw, &kv, inp.layer(hp, il, kv.store), eps)
        };
        let o = g.attn_block(cur, &attn)?;
        let o = g.rms_norm(o, need(&lw.attn_post_norm, "post-attention norm")?, eps);
        let x_attn = g.add(x, o);
        let cur = g.rms_norm(x_attn, &lw.ffn_norm, eps);
        let ffn = g.ffn(cur, &lw.ffn, Activation::Gelu);
        let ffn = g.rms_norm(ffn, need(&lw.ffn_post_norm, "post-feed-forward norm")?, eps);
        x = g.add(x_attn, ffn);
    }

    output_head(g, m, io, x)
}
