//! The llama architecture (SmolLM2 among others): pre-norm blocks of grouped-query
//! attention with RoPE and a SwiGLU feed-forward.

use super::{GraphIo, KvBuffers, Model};
use crate::gpu::GpuError;
use crate::graph::{Graph, GraphBuilder, Op, TensorId};
use crate::ops::attention::AttnShape;
use crate::ops::binary::BinaryOp;
use crate::ops::glu::Activation;
use crate::ops::softmax::SoftmaxParams;

pub fn build(m: &Model, io: &GraphIo, kv: &KvBuffers) -> Result<Graph, GpuError> {
    let hp = &m.hp;
    let w = &m.weights;
    let (t, e) = (io.n_tok, hp.n_embd);
    let (nq, nkv, ff) = (hp.n_embd_q(), hp.n_embd_kv(), hp.n_ff);
    let mut g = GraphBuilder::new();
    let tokens = g.external(io.tokens.clone());
    let table = g.external(io.rope_table.clone());
    let slots = g.external(io.kv_slots.clone());
    let mask = g.external(io.mask.clone());
    let out_ids = g.external(io.out_ids.clone());
    let logits = g.external(io.logits.clone());
    let t64 = t as u64;

    let mut x = g.scratch(e as u64 * t64);
    g.node(
        Op::GetRows {
            w: w.tok_embd.clone(),
            n_ids: t,
        },
        &[tokens],
        &[x],
    );

    let shape = AttnShape {
        head_dim: hp.head_dim,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        n_tok: t,
        n_kv: io.n_kv,
        kv_f16: kv.f16,
    };
    let sp = SoftmaxParams {
        scale: 1.0 / (hp.head_dim as f32).sqrt(),
        max_bias: 0.0,
        n_head: hp.n_head,
    };
    // The attention norm of layer il > 0 comes out of the previous layer's fused
    // residual add (AddRmsNorm); layer 0 norms the embeddings on its own.
    let mut normed: Option<TensorId> = None;
    for (il, lw) in w.layers.iter().enumerate() {
        let cur = match normed.take() {
            Some(c) => c,
            None => {
                let norm_w = g.external(lw.attn_norm.clone());
                let cur = g.scratch(e as u64 * t64);
                g.node(
                    Op::RmsNorm {
                        n: e,
                        rows: t,
                        eps: hp.eps,
                    },
                    &[x, norm_w],
                    &[cur],
                );
                cur
            }
        };
        let q = g.scratch(nq as u64 * t64);
        let k = g.scratch(nkv as u64 * t64);
        let v = g.scratch(nkv as u64 * t64);
        g.node(
            Op::Matmul {
                w: lw.wq.clone(),
                n_tok: t,
            },
            &[cur],
            &[q],
        );
        g.node(
            Op::Matmul {
                w: lw.wk.clone(),
                n_tok: t,
            },
            &[cur],
            &[k],
        );
        g.node(
            Op::Matmul {
                w: lw.wv.clone(),
                n_tok: t,
            },
            &[cur],
            &[v],
        );
        g.node(
            Op::Rope {
                p: hp.rope,
                n_head: hp.n_head,
                n_tok: t,
            },
            &[table],
            &[q],
        );
        g.node(
            Op::Rope {
                p: hp.rope,
                n_head: hp.n_head_kv,
                n_tok: t,
            },
            &[table],
            &[k],
        );
        let kc = g.external(kv.k[il].clone());
        let vc = g.external(kv.v[il].clone());
        g.node(
            Op::SetRows {
                row_len: nkv,
                n_rows: t,
                dst_f16: kv.f16,
            },
            &[k, slots],
            &[kc],
        );
        g.node(
            Op::SetRows {
                row_len: nkv,
                n_rows: t,
                dst_f16: kv.f16,
            },
            &[v, slots],
            &[vc],
        );
        let scores = g.scratch(shape.scores_len(&m.gpu)?);
        let attn = g.scratch(nq as u64 * t64);
        let partials = g.scratch(shape.partials_len(&m.gpu));
        g.node(
            Op::Attention { shape, sp },
            &[q, kc, vc, mask],
            &[scores, attn, partials],
        );
        let o = g.scratch(e as u64 * t64);
        g.node(
            Op::Matmul {
                w: lw.wo.clone(),
                n_tok: t,
            },
            &[attn],
            &[o],
        );
        let x_attn = g.scratch(e as u64 * t64);
        let ffn_w = g.external(lw.ffn_norm.clone());
        let cur = g.scratch(e as u64 * t64);
        g.node(
            Op::AddRmsNorm {
                n: e,
                rows: t,
                eps: hp.eps,
            },
            &[x, o, ffn_w],
            &[x_attn, cur],
        );
        let gate = g.scratch(ff as u64 * t64);
        let up = g.scratch(ff as u64 * t64);
        g.node(
            Op::Matmul {
                w: lw.gate.clone(),
                n_tok: t,
            },
            &[cur],
            &[gate],
        );
        g.node(
            Op::Matmul {
                w: lw.up.clone(),
                n_tok: t,
            },
            &[cur],
            &[up],
        );
        let h = g.scratch(ff as u64 * t64);
        g.node(
            Op::Glu {
                act: Activation::Silu,
                n: ff * t,
            },
            &[gate, up],
            &[h],
        );
        let down = g.scratch(e as u64 * t64);
        g.node(
            Op::Matmul {
                w: lw.down.clone(),
                n_tok: t,
            },
            &[h],
            &[down],
        );
        let x_next = g.scratch(e as u64 * t64);
        if let Some(next) = w.layers.get(il + 1) {
            let norm_w = g.external(next.attn_norm.clone());
            let cur = g.scratch(e as u64 * t64);
            g.node(
                Op::AddRmsNorm {
                    n: e,
                    rows: t,
                    eps: hp.eps,
                },
                &[x_attn, down, norm_w],
                &[x_next, cur],
            );
            normed = Some(cur);
        } else {
            g.node(
                Op::Binary {
                    op: BinaryOp::Add,
                    n: e * t,
                    nb: e * t,
                },
                &[x_attn, down],
                &[x_next],
            );
        }
        x = x_next;
    }

    // Only the rows that need logits go through the output head.
    let n_out = io.n_out;
    if n_out == 0 {
        return g.build(&m.gpu);
    }
    if n_out < t {
        let sel = g.scratch(e as u64 * n_out as u64);
        g.node(
            Op::SelectRows {
                n_cols: e,
                n_rows: t,
                n_ids: n_out,
            },
            &[x, out_ids],
            &[sel],
        );
        x = sel;
    }
    let out_norm_w = g.external(w.output_norm.clone());
    let cur = g.scratch(e as u64 * n_out as u64);
    g.node(
        Op::RmsNorm {
            n: e,
            rows: n_out,
            eps: hp.eps,
        },
        &[x, out_norm_w],
        &[cur],
    );
    g.node(
        Op::Matmul {
            w: w.output.clone(),
            n_tok: n_out,
        },
        &[cur],
        &[logits],
    );
    g.build(&m.gpu)
}
