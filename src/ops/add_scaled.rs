//! A scaled correction added into rows of an existing tensor: how a LoRA adapter's
//! low-rank product `scale · B (A x)` joins the base matmul's output (llama.cpp's
//! `ggml_scale` then `ggml_add` in one pass), at the rows that weight's output occupies in a
//! stacked (Q/K/V) or interleaved (gate/up) output.

use super::kernels::{kernel_files, one_kernel};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// Where the `n` values of each of `n_tok` source rows land in the destination: value j
/// of row t at `t * stride + offset + j * step`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaledRows {
    pub n: u32,
    pub n_tok: u32,
    pub stride: u32,
    pub offset: u32,
    pub step: u32,
    pub scale: f32,
}

impl ScaledRows {
    /// Refuses a placement that reaches past a destination row (the kernel would write
    /// into the next token's row) or a step of zero (two values onto one output).
    pub fn check(&self) -> Result<(), GpuError> {
        let last = self.offset as u64 + (self.n.max(1) as u64 - 1) * self.step as u64;
        if self.step == 0 || last >= self.stride as u64 {
            return Err(GpuError::Validation(format!(
                "add_scaled: {} values at offset {} step {} do not fit rows of {}",
                self.n, self.offset, self.step, self.stride
            )));
        }
        Ok(())
    }
}

/// dst[t * stride + offset + j * step] += scale * src[t * n + j], in place.
pub fn add_scaled(gpu: &Gpu, src: &View, dst: &View, p: ScaledRows) -> Result<Dispatch, GpuError> {
    p.check()?;
    let pipeline = gpu.pipeline(KernelKey::AddScaled(Kernel))?;
    let params = AddScaledUniform {
        n: p.n,
        n_tok: p.n_tok,
        stride: p.stride,
        offset: p.offset,
        step: p.step,
        scale: p.scale,
        ..Default::default()
    };
    let (gx, gy) = split_groups((p.n * p.n_tok).div_ceil(256));
    record(
        gpu,
        "add_scaled",
        pipeline,
        bytemuck::bytes_of(&params),
        &[src, dst],
        [gx, gy, 1],
    )
}

/// The CPU reference of [`add_scaled`]: `dst` after the correction.
pub fn add_scaled_ref(src: &[f32], dst: &[f32], p: ScaledRows) -> Vec<f32> {
    let mut out = dst.to_vec();
    for t in 0..p.n_tok as usize {
        for j in 0..p.n as usize {
            let o = t * p.stride as usize + p.offset as usize + j * p.step as usize;
            out[o] += p.scale * src[t * p.n as usize + j];
        }
    }
    out
}

uniform_struct! {
    /// add_scaled: `n` values of `n_tok` rows added, times `scale`, at `offset + j * step`
    /// of destination rows `stride` long.
    AddScaledUniform {
        n: u32,
        n_tok: u32,
        stride: u32,
        offset: u32,
        step: u32,
        scale: f32,
        _pad0: u32,
        _pad1: u32,
    }
}

kernel_files! {
    ADD_SCALED = "kernels/add_scaled.wgsl";
}

one_kernel!("add_scaled", ADD_SCALED, AddScaledUniform, 256);

/// The graph's `Op::AddScaled`: reads [src], writes [dst] (read too): a LoRA correction
/// added into a matmul's output rows
pub struct AddScaledNode {
    pub p: ScaledRows,
}

impl GraphOp for AddScaledNode {
    fn kind(&self) -> String {
        "add_scaled".into()
    }

    fn cost(&self) -> OpCost {
        let Self { p } = self;
        let n = p.n as u64 * p.n_tok as u64;
        OpCost::new(3 * n * F32_BYTES, 2 * n)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { p } = self;
        dispatches.push(add_scaled(gpu, &r[0], &w[0], *p)?);
        Ok(())
    }
}
