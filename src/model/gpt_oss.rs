//! OpenAI's gpt-oss: pre-norm blocks of grouped-query attention with Q/K/V and output
//! biases and one learned sink logit per head joining the softmax; even layers attend over
//! a sliding window, odd ones over everything (one RoPE, YaRN-scaled); every feed-forward
//! a mixture of experts with biases, chosen by the router's top logits (their softmax the
//! weights) and gated by a clamped SwiGLU.

use super::{close_layer, kv_layer, layer_input, output_head, GraphIo, Model, Windowed};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, Graph};
use crate::memory::Memory;
use crate::ops::glu::Activation;
use crate::ops::softmax::SoftmaxParams;

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let eps = hp.eps;
    let mut g = super::builder(m, io);
    let inp = Windowed::new(&mut g, hp, io, mem)?;
    let sp = SoftmaxParams {
        scale: hp.attn_scale,
        max_bias: 0.0,
        n_head: hp.n_head,
        softcap: 0.0,
    };
    let mut x = g.get_rows(&w.tok_embd, inp.tokens);
    let mut normed = None;
    for (il, lw) in w.layers.iter().enumerate() {
        g.layer(il);
        let kv = kv_layer(mem, il)?;
        let cur = layer_input(&mut g, &mut normed, x, &lw.attn_norm, eps);
        let ((slots, shape), (mask, rope)) = inp.layer(hp, il, kv.store);
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
            qk_norm: None,
            sinks: lw.attn_sinks.as_ref(),
            wo_bias: lw.wo_bias.as_ref(),
        };
        let o = g.attn_block(cur, &attn)?;
        let (x_attn, cur) = g.add_rms_norm(x, o, &lw.ffn_norm, eps);
        let ffn = g.ffn(cur, &lw.ffn, Activation::SwigluOai);
        x = close_layer(&mut g, &w.layers, il, (x_attn, ffn), eps, &mut normed);
    }

    output_head(g, m, io, x)
}
