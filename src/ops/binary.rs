//! Element-wise add and multiply, with `b` broadcast along rows (b.len() divides a.len()).

use super::uniforms::BinaryUniform;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Mul,
}

impl BinaryOp {
    /// Every op, for enumerating the kernel variants.
    pub const ALL: &'static [BinaryOp] = &[BinaryOp::Add, BinaryOp::Mul];

    pub(crate) fn expr(self) -> &'static str {
        match self {
            BinaryOp::Add => "av + bv",
            BinaryOp::Mul => "av * bv",
        }
    }
    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Mul => a * b,
        }
    }
}

/// dst[i] = a[i] op b[i % nb] for i < n. dst may be the same buffer as neither input.
pub fn binary(
    gpu: &Gpu,
    op: BinaryOp,
    a: &View,
    b: &View,
    dst: &View,
    n: u32,
    nb: u32,
) -> Result<Dispatch, GpuError> {
    if nb == 0 {
        // The shader repeats b with `i % nb`; the kernels run without division guards.
        return Err(GpuError::Validation("binary: b has no elements".into()));
    }
    let pipeline = gpu.pipeline(KernelKey::Binary(op))?;
    let params = BinaryUniform {
        n,
        nb,
        ..Default::default()
    };
    let (gx, gy) = split_groups(n.div_ceil(256));
    record(
        gpu,
        "binary",
        pipeline,
        bytemuck::bytes_of(&params),
        &[a, b, dst],
        [gx, gy, 1],
    )
}

pub fn binary_ref(op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter()
        .enumerate()
        .map(|(i, &v)| op.apply(v, b[i % b.len()]))
        .collect()
}
