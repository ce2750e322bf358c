//! The llama architecture (Llama 1-3, Mistral, SmolLM2...) and its close relatives: pre-norm
//! blocks of grouped-query attention with RoPE and a SwiGLU feed-forward.
//!
//! Qwen2, Qwen3 and Phi-3 run through this same graph: what sets them apart is data the
//! loader and the hyperparameters already carry — Q/K/V biases (Qwen2), per-head Q/K RMS
//! norms (Qwen3), NeoX-style rotation (all three), fused QKV and gate/up tensors (Phi-3,
//! re-laid out at load), Llama 3's RoPE frequency factors (in the RoPE table).

use super::{output_head, CacheKind, GraphInput, GraphIo, Hparams, KvBuffers, Model};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, Graph, GraphBuilder};
use crate::kv::MaskKind;
use crate::ops::attention::AttnShape;
use crate::ops::glu::Activation;
use crate::ops::softmax::SoftmaxParams;

/// One causal mask and one RoPE table serve every layer.
pub fn inputs(hp: &Hparams) -> Vec<GraphInput> {
    vec![
        GraphInput::Tokens,
        GraphInput::KvSlots(CacheKind::Full),
        GraphInput::OutIds,
        GraphInput::KqMask(MaskKind::default()),
        GraphInput::Rope(hp.rope),
    ]
}

pub fn build(m: &Model, io: &GraphIo, kv: &KvBuffers) -> Result<Graph, GpuError> {
    let (hp, w, gpu) = (&m.hp, &m.weights, &*m.gpu);
    let (t, eps) = (io.n_tok, hp.eps);
    let mut g = GraphBuilder::new();
    let tokens = g.input(io.tokens()?, [t, 1]);
    let rope = g.input(io.rope(hp.rope)?, [hp.rope.n_dims, t]);
    let slots = g.input(io.kv_slots(CacheKind::Full)?, [t, 1]);
    let mask = g.input(io.mask(MaskKind::default())?, [io.n_kv, t]);
    let shape = AttnShape {
        head_dim: hp.head_dim,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        n_tok: t,
        n_kv: io.n_kv,
        k_type: kv.cache.type_k,
        v_type: kv.cache.type_v,
        flash: kv.cache.flash,
        rot_k: kv.cache.rot_k,
        rot_v: kv.cache.rot_v,
    };
    let sp = SoftmaxParams {
        scale: hp.attn_scale,
        max_bias: 0.0,
        n_head: hp.n_head,
    };

    if kv.k.len() != w.layers.len() || kv.v.len() != w.layers.len() {
        return Err(GpuError::Validation(
            "the K/V cache has a different layer count".into(),
        ));
    }
    let mut x = g.get_rows(&w.tok_embd, tokens);
    // The attention norm of layer il > 0 comes out of the previous layer's fused
    // residual add (AddRmsNorm); layer 0 norms the embeddings on its own.
    let mut normed = None;
    let caches = kv.k.iter().zip(&kv.v);
    for (il, (lw, (k_cache, v_cache))) in w.layers.iter().zip(caches).enumerate() {
        let cur = match normed.take() {
            Some(cur) => cur,
            None => g.rms_norm(x, &lw.attn_norm, eps),
        };
        let qk_norm = match (&lw.attn_q_norm, &lw.attn_k_norm) {
            (Some(q), Some(k)) => Some((q, k, eps)),
            _ => None,
        };
        let attn = AttnBlock {
            qkv: &lw.qkv,
            qkv_bias: lw.qkv_bias.as_ref(),
            wo: &lw.wo,
            k_cache,
            v_cache,
            slots,
            mask,
            rope,
            rope_p: hp.rope,
            shape,
            sp,
            qk_norm,
        };
        let o = g.attn_block(gpu, cur, &attn)?;
        let (x_attn, cur) = g.add_rms_norm(x, o, &lw.ffn_norm, eps);
        let ffn = g.ffn_block(cur, &lw.gate_up, &lw.down, Activation::Silu);
        x = match w.layers.get(il + 1) {
            Some(next) => {
                let (x_next, cur) = g.add_rms_norm(x_attn, ffn, &next.attn_norm, eps);
                normed = Some(cur);
                x_next
            }
            None => g.add(x_attn, ffn),
        };
    }

    output_head(g, m, io, x)
}
