//! The llama architecture (Llama 1-3, Mistral, SmolLM2...) and its close relatives: pre-norm
//! blocks of grouped-query attention with RoPE and a SwiGLU feed-forward.
//!
//! Qwen2, Qwen3 and Phi-3 run through this same graph: what sets them apart is data the
//! loader and the hyperparameters already carry — Q/K/V biases (Qwen2), per-head Q/K RMS
//! norms (Qwen3), NeoX-style rotation (all three), fused QKV and gate/up tensors (Phi-3,
//! re-laid out at load), Llama 3's RoPE frequency factors (in the RoPE table).

use super::{
    attn_shape, close_layer, kv_layer, layer_input, output_head, CacheKind, GraphInput, GraphIo,
    Hparams, Model,
};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, Graph};
use crate::kv::MaskKind;
use crate::memory::Memory;
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

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let (t, eps) = (io.n_tok, hp.eps);
    let mut g = super::builder(m, io);
    let tokens = g.input(io.tokens()?, [t, 1]);
    let rope = g.input(io.rope(hp.rope)?, [hp.rope.n_dims, t]);
    let slots = g.input(io.kv_slots(CacheKind::Full)?, [t, 1]);
    let mask = g.input(io.mask(MaskKind::default())?, [io.n_kv, t]);
    let shape = attn_shape(hp, mem, t, io.n_kv);
    let sp = SoftmaxParams {
        scale: hp.attn_scale,
        max_bias: 0.0,
        n_head: hp.n_head,
        softcap: hp.attn_softcap,
    };

    let mut x = g.get_rows(&w.tok_embd, tokens);
    // The attention norm of layer il > 0 comes out of the previous layer's fused
    // residual add (AddRmsNorm); layer 0 norms the embeddings on its own.
    let mut normed = None;
    for (il, lw) in w.layers.iter().enumerate() {
        g.layer(il);
        let kv = kv_layer(mem, il)?;
        let cur = layer_input(&mut g, &mut normed, x, &lw.attn_norm, eps);
        let qk_norm = match (&lw.attn_q_norm, &lw.attn_k_norm) {
            (Some(q), Some(k)) => Some((q, k, eps)),
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
            rope_p: hp.rope,
            shape,
            sp,
            qk_norm,
            sinks: None,
            wo_bias: None,
        };
        let o = g.attn_block(cur, &attn)?;
        let (x_attn, cur) = g.add_rms_norm(x, o, &lw.ffn_norm, eps);
        let ffn = g.ffn(cur, &lw.ffn, Activation::Silu);
        x = close_layer(&mut g, &w.layers, il, (x_attn, ffn), eps, &mut normed);
    }

    output_head(g, m, io, x)
}
