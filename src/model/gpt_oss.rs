//! OpenAI's gpt-oss: pre-norm blocks of grouped-query attention with Q/K/V and output
//! biases and one learned sink logit per head joining the softmax; even layers attend over
//! a sliding window, odd ones over everything (one RoPE, YaRN-scaled); every feed-forward
//! a mixture of experts with biases, chosen by the router's top logits (their softmax the
//! weights) and gated by a clamped SwiGLU.

use super::{input_rows, kv_layer, layer_attn, output_head, GraphIo, Model, Windowed};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, Graph};
use crate::memory::Memory;
use crate::ops::glu::Activation;

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let eps = hp.eps;
    let mut g = super::builder(m, io);
    let inp = Windowed::new(&mut g, hp, io, mem)?;
    let mut x = input_rows(&mut g, m, io, inp.tokens)?;
    for (il, lw) in w.layers.iter().enumerate() {
        g.layer(il);
        let kv = kv_layer(mem, il)?;
        let cur = g.rms_norm(x, &lw.attn_norm, eps);
        let attn = AttnBlock {
            sinks: lw.attn_sinks.as_ref(),
            wo_bias: lw.wo_bias.as_ref(),
            ..layer_attn(lw, &kv, inp.layer(hp, il, kv.store), eps)
        };
        let o = g.attn_block(cur, &attn)?;
        let x_attn = g.add(x, o);
        let cur = g.rms_norm(x_attn, &lw.ffn_norm, eps);
        let ffn = g.ffn(cur, &lw.ffn, Activation::SwigluOai);
        x = g.add(x_attn, ffn);
    }

    output_head(g, m, io, x)
}
