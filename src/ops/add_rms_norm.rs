//! Residual add fused with RMS norm: sum = a + b, dst = rms_norm(sum) * w, one dispatch.

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
