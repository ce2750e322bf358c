//! Layer norm with a weight and a bias (BERT's `LayerNorm`, ggml's `norm` then `mul` and
//! `add`): dst = (x - mean) / sqrt(var + eps) * w + b per row.

use super::kernels::{kernel_files, one_kernel};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::uniforms::NormUniform;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// x and dst are [n, n_rows]; w and b have n elements.
pub fn layer_norm(
    gpu: &Gpu,
    [x, w, b]: [&View; 3],
    dst: &View,
    n: u32,
    n_rows: u32,
    eps: f32,
) -> Result<Dispatch, GpuError> {
    if n == 0 {
        return Err(GpuError::Validation(
            "layer norm: rows of no elements".into(),
        ));
    }
    let params = NormUniform {
        n,
        eps,
        w_rows: 1,
        n_rows,
    };
    let pipeline = gpu.pipeline(KernelKey::LayerNorm(Kernel))?;
    let (gx, gy) = split_groups(n_rows);
    record(
        gpu,
        "layer_norm",
        pipeline,
        bytemuck::bytes_of(&params),
        &[x, w, b, dst],
        [gx, gy, 1],
    )
}

/// The CPU reference of [`layer_norm`], in f64.
pub fn layer_norm_ref(x: &[f32], w: &[f32], b: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let scale = 1.0 / (var + eps as f64).sqrt();
        out.extend(
            (row.iter().zip(w).zip(b))
                .map(|((&v, &w), &b)| ((v as f64 - mean) * scale * w as f64 + b as f64) as f32),
        );
    }
    out
}

kernel_files! {
    LAYER_NORM = "kernels/layer_norm.wgsl";
}

one_kernel!("layer_norm", LAYER_NORM, NormUniform, 256);

/// The graph's `Op::LayerNorm`: reads [x, weight, bias], writes [dst]: layer norm, scaled
/// and shifted
pub struct LayerNormNode {
    pub n: u32,
    pub rows: u32,
    pub eps: f32,
}

impl GraphOp for LayerNormNode {
    fn kind(&self) -> String {
        "layer_norm".into()
    }

    fn cost(&self) -> OpCost {
        let Self { n, rows, .. } = self;
        let e = *n as u64 * *rows as u64;
        OpCost::new(2 * e * F32_BYTES + 2 * *n as u64 * F32_BYTES, 7 * e)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { n, rows, eps } = self;
        dispatches.push(layer_norm(
            gpu,
            [&r[0], &r[1], &r[2]],
            &w[0],
            *n,
            *rows,
            *eps,
        )?);
        Ok(())
    }
}
