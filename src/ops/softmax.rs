//! Softmax with scale, KQ mask and ALiBi slope, as ggml_soft_max_ext, in place on rows.

use super::kernels::{kernel_files, Family, SHAPES};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{compose, SOFTMAX_COMMON};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError, KernelShape};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxParams {
    pub scale: f32,
    /// ALiBi: 0 disables it (slope 1 for every head).
    pub max_bias: f32,
    pub n_head: u32,
    /// Logit soft-capping (Gemma 2): each scaled score s becomes softcap tanh(s / softcap)
    /// before the mask is added, as llama.cpp caps them; 0 disables it.
    pub softcap: f32,
}

impl SoftmaxParams {
    /// (n_head_log2, m0, m1) of ggml's ALiBi slopes.
    pub(crate) fn alibi(&self) -> (u32, f32, f32) {
        let n_head_log2 = 1u32 << (31 - self.n_head.max(1).leading_zeros());
        let m0 = 2f32.powf(-self.max_bias / n_head_log2 as f32);
        let m1 = 2f32.powf(-(self.max_bias / 2.0) / n_head_log2 as f32);
        (n_head_log2, m0, m1)
    }

    /// A scaled score soft-capped (unchanged without capping): the CPU reference of the
    /// kernels' `capped`.
    pub fn capped(&self, v: f64) -> f64 {
        if self.softcap <= 0.0 {
            return v;
        }
        let c = self.softcap as f64;
        c * (v / c).tanh()
    }

    /// The ALiBi slope of head h (1 without ALiBi).
    pub fn slope(&self, h: u32) -> f32 {
        if self.max_bias <= 0.0 {
            return 1.0;
        }
        let (n2, m0, m1) = self.alibi();
        if h < n2 {
            m0.powi(h as i32 + 1)
        } else {
            m1.powi(2 * (h - n2) as i32 + 1)
        }
    }
}

/// x is [n_cols, rows_per_head, n_head]; mask (if any) is [n_cols, rows_per_head].
pub fn softmax(
    gpu: &Gpu,
    sp: &SoftmaxParams,
    mask: Option<&View>,
    x: &View,
    n_cols: u32,
    rows_per_head: u32,
) -> Result<Dispatch, GpuError> {
    softmax_sinks(gpu, sp, mask, None, x, n_cols, rows_per_head)
}

/// [`softmax`] with attention sinks (one logit per head, `[n_head]`) joining each row's
/// maximum and sum.
pub fn softmax_sinks(
    gpu: &Gpu,
    sp: &SoftmaxParams,
    mask: Option<&View>,
    sinks: Option<&View>,
    x: &View,
    n_cols: u32,
    rows_per_head: u32,
) -> Result<Dispatch, GpuError> {
    if rows_per_head == 0 {
        // The shader divides by it; the kernels run without division guards.
        return Err(GpuError::Validation("softmax: no rows per head".into()));
    }
    let kernel = Kernel { shape: gpu.kernels };
    let pipeline = gpu.pipeline(KernelKey::Softmax(kernel))?;
    let (n_head_log2, m0, m1) = sp.alibi();
    let params = SoftmaxUniform {
        n_cols,
        rows_per_head,
        has_mask: mask.is_some() as u32,
        n_head_log2,
        scale: sp.scale,
        max_bias: sp.max_bias,
        m0,
        m1,
        softcap: sp.softcap,
        has_sinks: sinks.is_some() as u32,
        ..Default::default()
    };
    let (gx, gy) = split_groups(rows_per_head * sp.n_head);
    // Without a mask or sinks the binding still needs a buffer; the shader never reads it.
    let dummy = View::whole(gpu.placeholder());
    record(
        gpu,
        "softmax",
        pipeline,
        bytemuck::bytes_of(&params),
        &[mask.unwrap_or(&dummy), x, sinks.unwrap_or(&dummy)],
        [gx, gy, 1],
    )
}

pub fn softmax_ref(
    sp: &SoftmaxParams,
    x: &[f32],
    mask: Option<&[f32]>,
    n_cols: usize,
    rows_per_head: usize,
) -> Vec<f32> {
    softmax_sinks_ref(sp, x, mask, None, n_cols, rows_per_head)
}

/// The CPU reference of [`softmax_sinks`]: a head's sink joins the maximum and the sum
/// as llama.cpp's soft_max with sinks does (not scaled, masked or capped).
pub fn softmax_sinks_ref(
    sp: &SoftmaxParams,
    x: &[f32],
    mask: Option<&[f32]>,
    sinks: Option<&[f32]>,
    n_cols: usize,
    rows_per_head: usize,
) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for (row, (src, dst)) in x.chunks(n_cols).zip(out.chunks_mut(n_cols)).enumerate() {
        let (t, h) = (row % rows_per_head, row / rows_per_head);
        let slope = sp.slope(h as u32) as f64;
        let vals: Vec<f64> = src
            .iter()
            .enumerate()
            .map(|(c, &v)| {
                let m = mask.map_or(0.0, |m| m[t * n_cols + c] as f64);
                sp.capped(v as f64 * sp.scale as f64) + slope * m
            })
            .collect();
        let sink = sinks.map(|s| s[h] as f64);
        let mx = vals
            .iter()
            .copied()
            .chain(sink)
            .fold(f64::NEG_INFINITY, f64::max);
        if mx == f64::NEG_INFINITY {
            continue;
        }
        let sum: f64 = vals.iter().chain(&sink).map(|v| (v - mx).exp()).sum();
        for (d, v) in dst.iter_mut().zip(&vals) {
            *d = ((v - mx).exp() / sum) as f32;
        }
    }
    out
}

uniform_struct! {
    /// softmax with scale, mask and ALiBi.
    SoftmaxUniform {
        n_cols: u32,
        rows_per_head: u32,
        has_mask: u32,
        n_head_log2: u32,
        scale: f32,
        max_bias: f32,
        m0: f32,
        m1: f32,
        /// Gemma 2's logit soft-capping: scaled scores become softcap tanh(s / softcap)
        /// before the mask; 0: none.
        softcap: f32,
        /// Whether `sinks` holds one logit per head that joins each row's softmax
        /// (gpt-oss): in the maximum and the sum, with no value.
        has_sinks: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

kernel_files! {
    SOFTMAX = "kernels/softmax.wgsl";
}

/// The masked softmax: a workgroup per row, 64 invocations for CPU-shaped adapters and
/// 256 for GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub shape: KernelShape,
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        SHAPES.map(|shape| Kernel { shape }).to_vec()
    }
    fn body(&self) -> Result<String, String> {
        let wg = self.workgroup_size().to_string();
        Ok(compose(&[SOFTMAX_COMMON, SOFTMAX], &[("WG", wg)]))
    }
    fn uniform_wgsl(&self) -> &'static str {
        SoftmaxUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        match self.shape {
            KernelShape::Cpu => 64,
            _ => 256,
        }
    }
    fn cpu_shaped(&self) -> bool {
        self.shape == KernelShape::Cpu
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "softmax_{}", self.workgroup_size())
    }
}

/// The graph's `Op::SoftmaxRows`: writes [x] (read too): each row of n_cols softmaxed in
/// place
pub struct SoftmaxRowsNode {
    pub n_cols: u32,
    pub rows: u32,
}

impl GraphOp for SoftmaxRowsNode {
    fn kind(&self) -> String {
        "softmax".into()
    }

    fn cost(&self) -> OpCost {
        let Self { n_cols, rows } = self;
        let e = *n_cols as u64 * *rows as u64;
        OpCost::new(2 * e * F32_BYTES, 4 * e)
    }

    fn record(
        &self,
        gpu: &Gpu,
        _r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { n_cols, rows } = self;
        let sp = SoftmaxParams {
            scale: 1.0,
            max_bias: 0.0,
            n_head: 1,
            softcap: 0.0,
        };
        dispatches.push(crate::ops::softmax::softmax(
            gpu, &sp, None, &w[0], *n_cols, *rows,
        )?);
        Ok(())
    }
}
