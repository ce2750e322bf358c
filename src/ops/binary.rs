//! Element-wise ops of `a` and a broadcast `b`: either repeated along rows (b.len() divides
//! a.len(), [`binary`]) or one value per row of `a` ([`binary_rows`]).

use super::kernels::{kernel_files, Family};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::compose;
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Mul,
    /// a sigmoid(b): Qwen2-MoE's gate of its shared expert.
    MulSigmoid,
    /// b tanh(a / b): soft-capping at b (Gemma 2's logits), tanh written with exp so that
    /// large arguments give +-1.
    Softcap,
    /// gelu(a + b): a bias added, then the tanh-approximated GELU (BERT's feed-forward).
    AddGelu,
    /// tanh(a + b): a bias added, then tanh (a reranker's classifier head).
    AddTanh,
}

impl BinaryOp {
    /// Every op, for enumerating the kernel variants.
    pub const ALL: &'static [BinaryOp] = &[
        BinaryOp::Add,
        BinaryOp::Mul,
        BinaryOp::MulSigmoid,
        BinaryOp::Softcap,
        BinaryOp::AddGelu,
        BinaryOp::AddTanh,
    ];

    pub(crate) fn expr(self) -> &'static str {
        match self {
            BinaryOp::Add => "av + bv",
            BinaryOp::Mul => "av * bv",
            BinaryOp::MulSigmoid => "av / (1.0 + exp(-bv))",
            BinaryOp::Softcap => "bv * (1.0 - 2.0 / (exp(2.0 * av / bv) + 1.0))",
            // act.wgsl's gelu of av + bv, written out: exp, not tanh, so that large
            // arguments cannot overflow.
            BinaryOp::AddGelu => {
                "(av + bv) / (1.0 + exp(-1.5957691216057308 * (av + bv) * (1.0 + 0.044715 * (av + bv) * (av + bv))))"
            }
            BinaryOp::AddTanh => "1.0 - 2.0 / (exp(2.0 * (av + bv)) + 1.0)",
        }
    }
    fn apply(self, a: f32, b: f32) -> f32 {
        let (a64, b64) = (a as f64, b as f64);
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Mul => a * b,
            BinaryOp::MulSigmoid => (a64 / (1.0 + (-b64).exp())) as f32,
            BinaryOp::Softcap => (b64 * (a64 / b64).tanh()) as f32,
            BinaryOp::AddGelu => super::glu::Activation::Gelu.apply(a + b),
            BinaryOp::AddTanh => (a64 + b64).tanh() as f32,
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
    binary_strided(gpu, op, a, b, dst, n, nb, 1)
}

/// dst[i] = a[i] op b[i / row] for i < n: one value of b per row of `row` elements of a.
pub fn binary_rows(
    gpu: &Gpu,
    op: BinaryOp,
    a: &View,
    b: &View,
    dst: &View,
    n: u32,
    row: u32,
) -> Result<Dispatch, GpuError> {
    if row == 0 {
        return Err(GpuError::Validation("binary: rows of no elements".into()));
    }
    binary_strided(gpu, op, a, b, dst, n, n.div_ceil(row), row)
}

/// dst[i] = a[i] op b[(i / div) % nb].
#[allow(clippy::too_many_arguments)]
pub(crate) fn binary_strided(
    gpu: &Gpu,
    op: BinaryOp,
    a: &View,
    b: &View,
    dst: &View,
    n: u32,
    nb: u32,
    div: u32,
) -> Result<Dispatch, GpuError> {
    if nb == 0 || div == 0 {
        // The shader repeats b with `i % nb`; the kernels run without division guards.
        return Err(GpuError::Validation("binary: b has no elements".into()));
    }
    let pipeline = gpu.pipeline(KernelKey::Binary(Kernel(op)))?;
    let params = BinaryUniform {
        n,
        nb,
        div,
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

/// The CPU reference of [`binary_rows`].
pub fn binary_rows_ref(op: BinaryOp, a: &[f32], b: &[f32], row: usize) -> Vec<f32> {
    a.iter()
        .enumerate()
        .map(|(i, &v)| op.apply(v, b[i / row]))
        .collect()
}

uniform_struct! {
    /// binary: `n` outputs; output i takes `b[(i / div) % nb]`.
    BinaryUniform {
        n: u32,
        nb: u32,
        div: u32,
        _pad0: u32,
    }
}

kernel_files! {
    BINARY = "kernels/binary.wgsl";
}

/// The elementwise kernel of one op: an invocation per output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel(pub BinaryOp);

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        BinaryOp::ALL.iter().map(|&op| Kernel(op)).collect()
    }
    fn body(&self) -> Result<String, String> {
        Ok(compose(&[BINARY], &[("OP", self.0.expr().to_string())]))
    }
    fn uniform_wgsl(&self) -> &'static str {
        BinaryUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        256
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "binary_{:?}", self.0)
    }
}

/// The graph's `Op::Binary`: reads [a, b], writes [dst]: dst[i] = a[i] op b[(i / div) % nb]
pub struct BinaryNode {
    pub op: BinaryOp,
    pub n: u32,
    pub nb: u32,
    pub div: u32,
}

impl GraphOp for BinaryNode {
    fn kind(&self) -> String {
        let Self { op, .. } = self;
        format!("{op:?}").to_lowercase()
    }

    fn cost(&self) -> OpCost {
        let Self { n, nb, .. } = self;
        OpCost::new((2 * *n as u64 + *nb as u64) * F32_BYTES, *n as u64)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { op, n, nb, div } = self;
        dispatches.push(binary_strided(
            gpu, *op, &r[0], &r[1], &w[0], *n, *nb, *div,
        )?);
        Ok(())
    }
}
