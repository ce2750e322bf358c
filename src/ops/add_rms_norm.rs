//! Residual add fused with RMS norm: sum = a + b, dst = rms_norm(sum) * w, one dispatch.

use super::node::{GraphOp, OpCost, F32_BYTES};
use super::rms_norm::record_norm;
use super::uniforms::NormUniform;
use super::{Dispatch, View};
use crate::gpu::{Gpu, GpuError};

/// a, b, sum and dst are [n, n_rows]; w has n elements.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    gpu: &Gpu,
    a: &View,
    b: &View,
    w: &View,
    sum: &View,
    dst: &View,
    n: u32,
    n_rows: u32,
    eps: f32,
) -> Result<Dispatch, GpuError> {
    let params = NormUniform {
        n,
        eps,
        w_rows: 0,
        n_rows,
    };
    record_norm(gpu, true, &params, &[a, b, w, sum, dst])
}

/// CPU reference: (sum, normed).
pub fn add_rms_norm_ref(
    a: &[f32],
    b: &[f32],
    w: &[f32],
    n: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let sum: Vec<f32> = a.iter().zip(b).map(|(x, y)| x + y).collect();
    let normed = super::rms_norm::rms_norm_ref(&sum, w, n, eps);
    (sum, normed)
}

/// The graph's `Op::AddRmsNorm`: reads [a, b, weight], writes [sum, dst]: sum = a + b, dst
/// = rms_norm(sum) * weight
pub struct AddRmsNormNode {
    pub n: u32,
    pub rows: u32,
    pub eps: f32,
}

impl GraphOp for AddRmsNormNode {
    fn kind(&self) -> String {
        "add_rms_norm".into()
    }

    fn cost(&self) -> OpCost {
        let Self { n, rows, .. } = self;
        let e = *n as u64 * *rows as u64;
        OpCost::new(4 * e * F32_BYTES + *n as u64 * F32_BYTES, 5 * e)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { n, rows, eps } = self;
        dispatches.push(add_rms_norm(
            gpu, &r[0], &r[1], &r[2], &w[0], &w[1], *n, *rows, *eps,
        )?);
        Ok(())
    }
}
