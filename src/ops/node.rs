//! An op as a node of the graph: the parameters of one call, from which the graph gets
//! the node's name in profiles, its cost model and its dispatches. Each op file
//! implements [`GraphOp`] for its nodes beside its dispatch functions, so the graph
//! (`graph::Op`, an enum over these types) repeats none of an op's facts.

use super::{Dispatch, View};
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
