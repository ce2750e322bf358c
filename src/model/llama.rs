//! The llama architecture (Llama 1-3, Mistral, SmolLM2...) and its close relatives: pre-norm
//! blocks of grouped-query attention with RoPE and a SwiGLU feed-forward.
//!
//! Qwen2, Qwen3 and Phi-3 run through this same graph: what sets them apart is data the
//! loader and the hyperparameters already carry — Q/K/V biases (Qwen2), per-head Q/K RMS
//! norms (Qwen3), NeoX-style rotation (all three), fused QKV and gate/up tensors (Phi-3,
//! re-laid out at load), Llama 3's RoPE frequency factors (in the RoPE table).

use super::{
    input_rows, kv_layer, layer_attn, output_head, Causal, GraphInput, GraphIo, Hparams, Model,
};
use crate::gpu::GpuError;
use crate::graph::Graph;
use crate::memory::Memory;
use crate::ops::glu::Activation;

pub fn inputs(hp: &Hparams) -> Vec<GraphInput> {
    Causal::declare(hp)
}

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let eps = hp.eps;
    let mut g = super::builder(m, io);
    let inp = Causal::new(&mut g, hp, io, mem)?;

    let mut x = input_rows(&mut g, m, io, inp.tokens)?;
    for (il, lw) in w.layers.iter().enumerate() {
        g.layer(il);
        let kv = kv_layer(mem, il)?;
        let cur = g.rms_norm(x, &lw.attn_norm, eps);
        let o = g.attn_block(cur, &layer_attn(lw, &kv, inp.attn, eps))?;
        let x_attn = g.add(x, o);
        let cur = g.rms_norm(x_attn, &lw.ffn_norm, eps);
        let ffn = g.ffn(cur, &lw.ffn, Activation::Silu);
        x = g.add(x_attn, ffn);
    }

    output_head(g, m, io, x)
}
