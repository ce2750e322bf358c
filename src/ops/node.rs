//! An op as a node of the graph: the parameters of one call, from which the graph gets
//! the node's name in profiles, its cost model and its dispatches. Each op file
//! implements [`GraphOp`] for its nodes beside its dispatch functions, so the graph
//! (`graph::Op`, an enum over these types) repeats none of an op's facts.

use super::{Dispatch, View, Weight};
use crate::gpu::{Gpu, GpuError};

/// Bytes of an f32 activation value: the unit the cost models count activations in.
pub const F32_BYTES: u64 = 4;

/// What one node costs at the least: bytes it must move through memory (weights, K/V
/// and activations read, outputs written, each once) and arithmetic operations. A profile
/// divides these by the measured time, so a kernel's GB/s and GFLOP/s say how far it is
/// from the device's bandwidth and compute peaks. Weights count once per node (the
/// kernels stream each block once per tile of tokens, so this is the ideal).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpCost {
    pub bytes: u64,
    pub flops: u64,
}

impl OpCost {
    pub fn new(bytes: u64, flops: u64) -> Self {
        OpCost { bytes, flops }
    }

    /// A product by weight matrix `w` over `n_tok` tokens: the weights once, `x_bytes` of
    /// input, `out_per_tok` f32 values written per token, two operations per weight and
    /// token plus `extra_per_tok` (a fused activation's).
    pub fn matmul(
        w: &Weight,
        n_tok: u32,
        x_bytes: u64,
        out_per_tok: u64,
        extra_per_tok: u64,
    ) -> Self {
        let (cols, rows, t) = (w.n_cols as u64, w.n_rows as u64, n_tok as u64);
        OpCost::new(
            w.gpu_bytes() + x_bytes + out_per_tok * t * F32_BYTES,
            (2 * rows * cols + extra_per_tok) * t,
        )
    }
}

/// One call of an op as a graph node.
pub trait GraphOp {
    /// The op's name in profiles, with the weight type where there is one (`matmul
    /// q4_1`): the same op on different formats runs different kernels.
    fn kind(&self) -> String;

    /// The cost model (see [`OpCost`]).
    fn cost(&self) -> OpCost;

    /// Appends the node's dispatches over the views of the tensors it reads (`r`) and
    /// writes (`w`), in the order its doc lists them, on the device it runs on.
    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError>;
}
