//! RMS norm fused with the weight multiply: dst = x / sqrt(mean(x²) + eps) * w.

use super::uniforms::NormUniform;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// x and dst are [n, n_rows]; w has n elements.
pub fn rms_norm(
    gpu: &Gpu,
    x: &View,
    w: &View,
    dst: &View,
    n: u32,
    n_rows: u32,
    eps: f32,
) -> Result<Dispatch, GpuError> {
    let pipeline = gpu.pipeline(KernelKey::RmsNorm)?;
    let params = NormUniform {
        n,
        eps,
        ..Default::default()
    };
    let (gx, gy) = split_groups(n_rows);
    record(
        gpu,
        "rms_norm",
        pipeline,
        bytemuck::bytes_of(&params),
        &[x, w, dst],
        [gx, gy, 1],
    )
}

pub fn rms_norm_ref(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let scale = 1.0 / (ms + eps as f64).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &g)| (v as f64 * scale) as f32 * g)
        })
        .collect()
}
