//! Building a graph: tensors are ids; each node names the tensors it reads and writes.

use super::{planner, Graph};
use crate::gpu::{Gpu, GpuError};
use crate::ops::add_rms_norm::add_rms_norm;
use crate::ops::attention::{attention, AttnShape, AttnViews};
use crate::ops::binary::{binary, BinaryOp};
use crate::ops::get_rows::{get_rows, select_rows};
use crate::ops::glu::{glu, Activation};
use crate::ops::matmul::matmul;
use crate::ops::rms_norm::rms_norm;
use crate::ops::rope::{rope, RopeParams};
use crate::ops::set_rows::set_rows;
use crate::ops::softmax::SoftmaxParams;
use crate::ops::{View, Weight};
use std::sync::Arc;

pub type TensorId = usize;

pub(super) enum Storage {
    /// A buffer owned elsewhere (weights, KV cache, step inputs, logits).
    External(View),
    /// An intermediate: the planner gives it a buffer.
    Scratch { bytes: u64 },
}

/// What a node computes. Reads and writes are listed in [`Node`] in the order the op
/// function takes them.
pub enum Op {
    /// reads [ids], writes [dst]
    GetRows { w: Arc<Weight>, n_ids: u32 },
    /// reads [src, ids], writes [dst]: rows of an f32 activation [n_cols, n_rows]
    SelectRows {
        n_cols: u32,
        n_rows: u32,
        n_ids: u32,
    },
    /// reads [x], writes [dst]
    Matmul { w: Arc<Weight>, n_tok: u32 },
    /// reads [x, weight], writes [dst]
    RmsNorm { n: u32, rows: u32, eps: f32 },
    /// reads [a, b, weight], writes [sum, dst]: sum = a + b, dst = rms_norm(sum) * weight
    AddRmsNorm { n: u32, rows: u32, eps: f32 },
    /// reads [a, b], writes [dst]
    Binary { op: BinaryOp, n: u32, nb: u32 },
    /// reads [gate, up], writes [dst]
    Glu { act: Activation, n: u32 },
    /// reads [table], writes [x] (in place)
    Rope {
        p: RopeParams,
        n_head: u32,
        n_tok: u32,
    },
    /// reads [src, idx], writes [dst] (f16 when dst_f16)
    SetRows {
        row_len: u32,
        n_rows: u32,
        dst_f16: bool,
    },
    /// reads [q, k, v, mask], writes [scores, dst, partials]
    Attention { shape: AttnShape, sp: SoftmaxParams },
}

pub struct Node {
    pub op: Op,
    pub reads: Vec<TensorId>,
    pub writes: Vec<TensorId>,
}

#[derive(Default)]
pub struct GraphBuilder {
    pub(super) tensors: Vec<Storage>,
    pub(super) nodes: Vec<Node>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn external(&mut self, v: View) -> TensorId {
        self.tensors.push(Storage::External(v));
        self.tensors.len() - 1
    }

    /// A new intermediate of `n` f32 elements.
    pub fn scratch(&mut self, n: u64) -> TensorId {
        self.tensors.push(Storage::Scratch { bytes: n * 4 });
        self.tensors.len() - 1
    }

    pub fn node(&mut self, op: Op, reads: &[TensorId], writes: &[TensorId]) {
        self.nodes.push(Node {
            op,
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        });
    }

    /// Plans scratch buffers and records every dispatch.
    pub fn build(self, gpu: &Gpu) -> Result<Graph, GpuError> {
        let plan = planner::plan(&self.tensors, &self.nodes);
        let mut scratch = Vec::with_capacity(plan.buffer_sizes.len());
        for (i, &bytes) in plan.buffer_sizes.iter().enumerate() {
            scratch.push(gpu.storage(&format!("scratch{i}"), bytes)?);
        }
        let view = |t: TensorId| -> View {
            match &self.tensors[t] {
                Storage::External(v) => v.clone(),
                Storage::Scratch { bytes } => View {
                    buf: scratch[plan.assignment[t].expect("planned")].clone(),
                    offset: 0,
                    size: bytes.div_ceil(16) * 16,
                },
            }
        };
        let mut dispatches = Vec::new();
        for node in &self.nodes {
            let r: Vec<View> = node.reads.iter().map(|&t| view(t)).collect();
            let w: Vec<View> = node.writes.iter().map(|&t| view(t)).collect();
            match &node.op {
                Op::GetRows { w: m, n_ids } => {
                    dispatches.extend(get_rows(gpu, m, &r[0], *n_ids, &w[0])?)
                }
                Op::SelectRows {
                    n_cols,
                    n_rows,
                    n_ids,
                } => dispatches.push(select_rows(
                    gpu, &r[0], *n_cols, *n_rows, &r[1], *n_ids, &w[0],
                )?),
                Op::Matmul { w: m, n_tok } => {
                    dispatches.extend(matmul(gpu, m, &r[0], *n_tok, &w[0])?)
                }
                Op::RmsNorm { n, rows, eps } => {
                    dispatches.push(rms_norm(gpu, &r[0], &r[1], &w[0], *n, *rows, *eps)?)
                }
                Op::AddRmsNorm { n, rows, eps } => dispatches.push(add_rms_norm(
                    gpu, &r[0], &r[1], &r[2], &w[0], &w[1], *n, *rows, *eps,
                )?),
                Op::Binary { op, n, nb } => {
                    dispatches.push(binary(gpu, *op, &r[0], &r[1], &w[0], *n, *nb)?)
                }
                Op::Glu { act, n } => dispatches.push(glu(gpu, *act, &r[0], &r[1], &w[0], *n)?),
                Op::Rope { p, n_head, n_tok } => {
                    dispatches.push(rope(gpu, p, &r[0], &w[0], *n_head, *n_tok, false)?)
                }
                Op::SetRows {
                    row_len,
                    n_rows,
                    dst_f16,
                } => dispatches.push(set_rows(
                    gpu, &r[0], &r[1], &w[0], *row_len, *n_rows, *dst_f16,
                )?),
                Op::Attention { shape, sp } => {
                    let io = AttnViews {
                        q: &r[0],
                        k: &r[1],
                        v: &r[2],
                        mask: &r[3],
                        scores: &w[0],
                        dst: &w[1],
                        partials: &w[2],
                    };
                    dispatches.extend(attention(gpu, shape, sp, &io)?)
                }
            }
        }
        gpu.check()?;
        if log::log_enabled!(log::Level::Debug) {
            let mut per_op: std::collections::BTreeMap<&str, usize> = Default::default();
            for d in &dispatches {
                *per_op.entry(d.label).or_default() += 1;
            }
            let counts: Vec<String> = per_op.iter().map(|(k, v)| format!("{k} {v}")).collect();
            log::debug!(
                "graph: {} dispatches per step ({})",
                dispatches.len(),
                counts.join(", ")
            );
        }
        let scratch_bytes = scratch.iter().map(|b| b.size()).sum();
        Ok(Graph {
            dispatches,
            scratch,
            scratch_bytes,
        })
    }
}
