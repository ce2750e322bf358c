//! LFM2 (LiquidAI): pre-norm blocks whose mixer is either grouped-query attention with
//! per-head Q/K norms and NeoX RoPE, or a gated short convolution over the recurrent
//! memory; every block ends with a SwiGLU feed-forward. The hybrid memory keeps the
//! attention layers' K/V and the convolution layers' states.
//!
//! The convolution block: B, C and x from the normed input, y = C * conv(B * x) with the
//! convolution continuing each sequence's state (its last width - 1 gated inputs), then
//! the output projection.

use super::Lfm2Mixer;
use super::{input_rows, kv_layer, output_head, Causal, GraphInput, GraphIo, Model, RsRows};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, Graph};
use crate::memory::Memory;
use crate::ops::glu::Activation;
use crate::ops::ssm::ConvShape;

/// The attention layers' inputs, and the convolution layers' state rows.
pub fn inputs(hp: &super::Hparams) -> Vec<GraphInput> {
    [Causal::declare(hp), RsRows::declare()].concat()
}

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let eps = hp.eps;
    let mut g = super::builder(m, io);
    let rows = RsRows::new(&mut g, io)?;
    let inp = Causal::new(&mut g, hp, io, mem)?;

    let mut x = input_rows(&mut g, m, io, inp.tokens)?;
    for (il, lw) in w.lfm2.iter().enumerate() {
        g.layer(il);
        let cur = g.rms_norm(x, &lw.attn_norm, eps);
        let mixed = match &lw.mixer {
            Lfm2Mixer::Attention {
                qkv,
                wo,
                q_norm,
                k_norm,
            } => {
                let kv = kv_layer(mem, il)?;
                let attn = AttnBlock {
                    qk_norm: Some((q_norm, k_norm, eps)),
                    ..AttnBlock::new(qkv, wo, (kv.k, kv.v), inp.attn)
                };
                g.attn_block(cur, &attn)?
            }
            Lfm2Mixer::Conv {
                in_b,
                in_c,
                in_x,
                conv,
                out,
            } => {
                let rs = mem.rs_layer(il).ok_or_else(|| {
                    GpuError::Validation(format!(
                        "the model's memory holds no state for layer {il}"
                    ))
                })?;
                let per = (rs.conv.size / 4 / rs.rows as u64) as u32;
                let conv_all = g.input(rs.conv.clone(), [per, rs.rows]);
                let b = g.matmul(in_b, cur);
                let c = g.matmul(in_c, cur);
                let xi = g.matmul(in_x, cur);
                let bx = g.mul(b, xi);
                let state = g.select_rows(conv_all, rows.src);
                let cs = ConvShape {
                    ch: hp.n_embd,
                    k: hp.shortconv_l_cache,
                    n_t: rows.n_t,
                    n_s: rows.n_s,
                    x_stride: hp.n_embd,
                    silu: false,
                };
                let (y, new_state) = g.ssm_conv(state, bx, conv, None, cs);
                g.store_rows(new_state, rows.dst, conv_all);
                let y = g.mul(c, y);
                g.matmul(out, y)
            }
        };
        let x_mid = g.add(x, mixed);
        let cur = g.rms_norm(x_mid, &lw.ffn_norm, eps);
        let ffn = g.ffn_block(cur, &lw.gate_up, &lw.down, Activation::Silu);
        x = g.add(x_mid, ffn);
    }
    output_head(g, m, io, x)
}
