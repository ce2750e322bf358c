//! RMS norm fused with the weight multiply: dst = x / sqrt(mean(x²) + eps) * w.

use super::kernels::{by_shape, kernel_files, shape_suffix, Family, SHAPES};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::compose;
use super::uniforms::NormUniform;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError, KernelShape};

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
    rms_norm_rows(gpu, x, w, dst, [n, n_rows, 1], eps)
}

/// [`rms_norm`] with a weight of `w_rows` rows of n, row r of x scaled by weight row
/// r % w_rows (Mamba-2's norm over groups of channels, a weight per group).
pub fn rms_norm_rows(
    gpu: &Gpu,
    x: &View,
    w: &View,
    dst: &View,
    [n, n_rows, w_rows]: [u32; 3],
    eps: f32,
) -> Result<Dispatch, GpuError> {
    let params = NormUniform {
        n,
        eps,
        w_rows,
        n_rows,
    };
    record_norm(gpu, false, &params, &[x, w, dst])
}

/// Records a norm kernel (with the residual add where `add`) over `params.n_rows` rows: a workgroup per
/// row, or where the kernels are CPU-shaped and written out (SwiftShader, which runs a
/// kernel with a barrier as coroutines) 64 rows per workgroup, one per invocation.
/// lavapipe keeps the workgroup tree: the row's running sum rounds differently, and a
/// q4_0 cache's perplexity, where a code flips on the least rounding, moved 4-7 % off
/// llama.cpp's with it (tests/kv_types_cli.rs).
pub(super) fn record_norm(
    gpu: &Gpu,
    add: bool,
    params: &NormUniform,
    views: &[&View],
) -> Result<Dispatch, GpuError> {
    let rows = gpu.kernels != KernelShape::Gpu && gpu.unroll;
    let shape = if rows {
        KernelShape::Cpu
    } else {
        KernelShape::Gpu
    };
    let pipeline = gpu.pipeline(KernelKey::RmsNorm(Kernel { add, shape }))?;
    let groups = if rows {
        params.n_rows.div_ceil(64)
    } else {
        params.n_rows
    };
    let (gx, gy) = split_groups(groups);
    let label = if add { "add_rms_norm" } else { "rms_norm" };
    record(
        gpu,
        label,
        pipeline,
        bytemuck::bytes_of(params),
        views,
        [gx, gy, 1],
    )
}

pub fn rms_norm_ref(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    x.chunks(n)
        .enumerate()
        .flat_map(|(r, row)| {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let scale = 1.0 / (ms + eps as f64).sqrt();
            // A weight of several rows cycles over the rows of x.
            let w_rows = (w.len() / n).max(1);
            let wr = &w[(r % w_rows) * n..];
            row.iter()
                .zip(wr)
                .map(move |(&v, &g)| (v as f64 * scale) as f32 * g)
        })
        .collect()
}

kernel_files! {
    /// The bindings and row reading of the plain norm.
    RMS_NORM = "common/rms_norm.wgsl";
    /// The same with the residual add (`add_rms_norm`).
    ADD_RMS_NORM = "common/add_rms_norm.wgsl";
    NORM_WG = "kernels/norm_wg.wgsl";
    NORM_ROWS = "kernels/norm_rows.wgsl";
}

/// An RMS norm, with the residual add before it where `add`: a workgroup per row
/// (GPU-shaped), or one invocation per row (CPU-shaped: no barriers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub add: bool,
    pub shape: KernelShape,
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        let each = |add| SHAPES.map(|shape| Kernel { add, shape });
        [each(false), each(true)].concat()
    }
    fn body(&self) -> Result<String, String> {
        let io = if self.add { ADD_RMS_NORM } else { RMS_NORM };
        Ok(compose(
            &[io, by_shape(self.shape, NORM_ROWS, NORM_WG)],
            &[],
        ))
    }
    fn uniform_wgsl(&self) -> &'static str {
        NormUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        by_shape(self.shape, 64, 256)
    }
    fn cpu_shaped(&self) -> bool {
        self.shape == KernelShape::Cpu
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let add = if self.add { "add_" } else { "" };
        write!(f, "{add}rms_norm{}", shape_suffix(self.shape))
    }
}

/// The graph's `Op::RmsNorm`: reads [x, weight], writes [dst]; row r of x takes weight row
/// r % w_rows
pub struct RmsNormNode {
    pub n: u32,
    pub rows: u32,
    pub w_rows: u32,
    pub eps: f32,
}

impl GraphOp for RmsNormNode {
    fn kind(&self) -> String {
        "rms_norm".into()
    }

    fn cost(&self) -> OpCost {
        let Self { n, rows, .. } = self;
        let e = *n as u64 * *rows as u64;
        OpCost::new(2 * e * F32_BYTES + *n as u64 * F32_BYTES, 4 * e)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self {
            n,
            rows,
            w_rows,
            eps,
        } = self;
        dispatches.push(rms_norm_rows(
            gpu,
            &r[0],
            &r[1],
            &w[0],
            [*n, *rows, *w_rows],
            *eps,
        )?);
        Ok(())
    }
}
