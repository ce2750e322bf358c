//! BERT encoders (embedding models, and the encoders of rerankers): token, position and
//! token-type embeddings summed and layer-normed; then blocks of biased attention that
//! sees the whole sequence (both ways, no rotation) and a GELU feed-forward, each closed
//! by a residual add and a layer norm. No output head: the last block's states are the
//! output, which an embeddings context pools.

use super::{attn_shape, kv_layer, CacheKind, GraphInput, GraphIo, Hparams, Model};
use crate::gpu::GpuError;
use crate::graph::{AttnBlock, AttnInputs, Graph, GraphBuilder, TensorId};
use crate::kv::MaskKind;
use crate::memory::Memory;
use crate::ops::binary::BinaryOp;
use crate::ops::softmax::SoftmaxParams;

/// Every token sees its whole sequence.
fn mask() -> MaskKind {
    MaskKind {
        non_causal: true,
        ..MaskKind::default()
    }
}

pub fn inputs(hp: &Hparams) -> Vec<GraphInput> {
    Encoder::declare(hp)
}

/// An encoder's inputs: its tokens and their positions, and the attention's (every token
/// seeing its whole sequence, no rotation), declared and fetched side by side.
struct Encoder {
    tokens: TensorId,
    positions: TensorId,
    attn: AttnInputs,
}

impl Encoder {
    /// What the graph reads per ubatch.
    fn declare(hp: &Hparams) -> Vec<GraphInput> {
        vec![
            GraphInput::Tokens,
            GraphInput::Positions,
            GraphInput::KvSlots(CacheKind::Full),
            GraphInput::OutIds,
            GraphInput::KqMask(mask()),
            // No dimension rotates (n_dims 0): the attention kernels' RoPE passes K through.
            GraphInput::Rope(hp.rope),
        ]
    }

    /// The declared inputs of the ubatch `io` describes, as graph tensors (the output
    /// rows are fetched where the last layer keeps them).
    fn new(
        g: &mut GraphBuilder,
        hp: &Hparams,
        io: &GraphIo,
        mem: &dyn Memory,
    ) -> Result<Self, GpuError> {
        let t = io.n_tok;
        Ok(Encoder {
            tokens: g.input(io.tokens()?, [t, 1]),
            positions: g.input(io.positions()?, [t, 1]),
            attn: AttnInputs {
                slots: g.input(io.kv_slots(CacheKind::Full)?, [t, 1]),
                mask: g.input(io.mask(mask())?, [io.n_kv, t]),
                rope: g.input(io.rope(hp.rope)?, [hp.rope.n_dims, t]),
                rope_p: hp.rope,
                shape: attn_shape(hp, mem, t, io.n_kv),
                sp: SoftmaxParams {
                    scale: hp.attn_scale,
                    max_bias: 0.0,
                    n_head: hp.n_head,
                    softcap: 0.0,
                },
            },
        })
    }
}

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let bw = w.bert.as_ref().ok_or_else(|| {
        GpuError::Validation("a BERT graph for a model loaded without BERT weights".into())
    })?;
    if !io.embeddings {
        return Err(GpuError::Validation(
            "BERT has no output head: it runs in an embeddings context only".into(),
        ));
    }
    let (t, eps) = (io.n_tok, hp.eps);
    let mut g = super::builder(m, io);
    let Encoder {
        tokens,
        positions,
        attn: inp,
    } = Encoder::new(&mut g, hp, io, mem)?;

    let mut x = g.get_rows(&w.tok_embd, tokens);
    if let Some(types) = &bw.type_embd {
        let types = g.input(types.clone(), [hp.n_embd, 1]);
        x = g.add(x, types);
    }
    let pos = g.get_rows(&bw.pos_embd, positions);
    x = g.add(x, pos);
    x = g.layer_norm(x, (&bw.embd_norm.0, &bw.embd_norm.1), eps);

    let last = bw.layers.len().saturating_sub(1);
    // The rows the output keeps: after the last attention only they go on.
    let out_ids = (io.n_out > 0 && io.n_out < t)
        .then(|| io.out_ids().map(|v| g.input(v, [io.n_out, 1])))
        .transpose()?;
    for (il, lw) in bw.layers.iter().enumerate() {
        g.layer(il);
        let kv = kv_layer(mem, il)?;
        let attn = AttnBlock {
            qkv_bias: Some(&lw.qkv_bias),
            wo_bias: Some(&lw.wo_bias),
            ..AttnBlock::new(&lw.qkv, &lw.wo, (kv.k, kv.v), inp)
        };
        let mut o = g.attn_block(x, &attn)?;
        if let (true, Some(ids)) = (il == last, out_ids) {
            o = g.select_rows(o, ids);
            x = g.select_rows(x, ids);
        }
        let h = g.add(o, x);
        let h = g.layer_norm(h, (&lw.attn_out_norm.0, &lw.attn_out_norm.1), eps);
        let up = g.matmul(&lw.up, h);
        let up = g.add_act(BinaryOp::AddGelu, up, &lw.up_bias);
        let down = g.matmul(&lw.down, up);
        let n_embd = hp.n_embd;
        let down_bias = g.input(lw.down_bias.clone(), [n_embd, 1]);
        let down = g.add(down, down_bias);
        let y = g.add(down, h);
        let norm = (&lw.out_norm.0, &lw.out_norm.1);
        if il == last && io.n_out > 0 && !io.rank {
            let out = g.input(io.logits.clone(), [hp.n_embd, io.n_out]);
            g.layer_norm_into(y, norm, eps, out);
        } else {
            x = g.layer_norm(y, norm, eps);
        }
    }
    if io.rank && io.n_out > 0 {
        classify(&mut g, m, io, x)?;
    }
    g.build()
}

/// A reranker's head over the output rows' states: the dense layer with tanh, then the
/// projection to scores, into the output buffer (llama.cpp's rank pooling of a BERT).
fn classify(
    g: &mut GraphBuilder,
    m: &Model,
    io: &GraphIo,
    x: crate::graph::TensorId,
) -> Result<(), GpuError> {
    let c = (m.weights.bert.as_ref())
        .and_then(|b| b.classifier.as_ref())
        .ok_or_else(|| {
            GpuError::Validation("reranking with a model that has no classifier head".into())
        })?;
    let out = g.input(io.logits.clone(), [m.n_rank_out(), io.n_out]);
    match (&c.dense, &c.out) {
        // No projection: the dense layer's tanh is the output.
        (Some((w, b)), None) => {
            let d = g.matmul(w, x);
            g.add_act_into(BinaryOp::AddTanh, d, b, out);
        }
        (dense, Some((w, b))) => {
            let h = match dense {
                Some((dw, db)) => {
                    let d = g.matmul(dw, x);
                    g.add_act(BinaryOp::AddTanh, d, db)
                }
                None => x,
            };
            let s = g.matmul(w, h);
            g.add_act_into(BinaryOp::Add, s, b, out);
        }
        (None, None) => {
            return Err(GpuError::Validation(
                "a classifier head with neither a dense layer nor a projection".into(),
            ))
        }
    }
    Ok(())
}
