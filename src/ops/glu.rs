//! Gated linear units: SwiGLU (SiLU gate, llama), GeGLU (tanh-GELU gate, gemma) and
//! gpt-oss's clamped SwiGLU.

use super::kernels::{kernel_files, Family};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{compose, ACT};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    Silu,
    Gelu,
    /// gpt-oss's SwiGLU: the gate clamped from above at 7 through x sigmoid(1.702 x), times
    /// the up value clamped to [-7, 7] plus 1 (llama.cpp's swiglu_oai). It is never fused
    /// into a matmul (gpt-oss's experts add biases first).
    SwigluOai,
}

impl Activation {
    /// Every activation, for enumerating the GLU kernel's variants.
    pub const ALL: &'static [Activation] =
        &[Activation::Silu, Activation::Gelu, Activation::SwigluOai];

    /// The activations the matmul kernels' GLU epilogue has variants for.
    pub const FUSED: &'static [Activation] = &[Activation::Silu, Activation::Gelu];

    /// Whether a matmul can apply this activation in its epilogue.
    pub fn fusable(self) -> bool {
        Self::FUSED.contains(&self)
    }

    pub(crate) fn wgsl(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::Gelu => "gelu",
            Activation::SwigluOai => "swiglu_oai",
        }
    }

    /// The gate's activation alone (the clamped SwiGLU's clamp included).
    pub fn apply(self, v: f32) -> f32 {
        let v = v as f64;
        (match self {
            Activation::Silu => v / (1.0 + (-v).exp()),
            Activation::Gelu => {
                0.5 * v * (1.0 + (0.7978845608028654 * v * (1.0 + 0.044715 * v * v)).tanh())
            }
            Activation::SwigluOai => {
                let x = v.min(OAI_LIMIT as f64);
                x / (1.0 + (-OAI_ALPHA as f64 * x).exp())
            }
        }) as f32
    }

    /// One gated unit: act(gate) times up (the clamped SwiGLU's up clamped and plus 1).
    pub fn glu(self, gate: f32, up: f32) -> f32 {
        match self {
            Activation::SwigluOai => self.apply(gate) * (up.clamp(-OAI_LIMIT, OAI_LIMIT) + 1.0),
            _ => self.apply(gate) * up,
        }
    }
}

/// gpt-oss's SwiGLU constants (fixed in llama.cpp's graph).
const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;

/// dst[i] = act(gate[i]) * up[i] for i < n.
pub fn glu(
    gpu: &Gpu,
    act: Activation,
    gate: &View,
    up: &View,
    dst: &View,
    n: u32,
) -> Result<Dispatch, GpuError> {
    record_glu(gpu, act, [gate, up], dst, n, false)
}

/// dst[i] = act(pairs[2i]) * pairs[2i + 1] for i < n: the interleaved (gate, up) output of
/// a fused gate/up projection.
pub fn glu_pairs(
    gpu: &Gpu,
    act: Activation,
    pairs: &View,
    dst: &View,
    n: u32,
) -> Result<Dispatch, GpuError> {
    record_glu(gpu, act, [pairs, pairs], dst, n, true)
}

fn record_glu(
    gpu: &Gpu,
    act: Activation,
    [gate, up]: [&View; 2],
    dst: &View,
    n: u32,
    pairs: bool,
) -> Result<Dispatch, GpuError> {
    let pipeline = gpu.pipeline(KernelKey::Glu(Kernel(act)))?;
    let params = GluUniform {
        n,
        pairs: pairs as u32,
        ..Default::default()
    };
    let (gx, gy) = split_groups(n.div_ceil(256));
    record(
        gpu,
        "glu",
        pipeline,
        bytemuck::bytes_of(&params),
        &[gate, up, dst],
        [gx, gy, 1],
    )
}

pub fn glu_ref(act: Activation, gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter().zip(up).map(|(&g, &u)| act.glu(g, u)).collect()
}

uniform_struct! {
    /// glu: `n` outputs; gate and up interleaved in one tensor when `pairs` is 1.
    GluUniform {
        n: u32,
        pairs: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

kernel_files! {
    GLU = "kernels/glu.wgsl";
}

/// The GLU kernel of one activation: an invocation per output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel(pub Activation);

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        Activation::ALL.iter().map(|&act| Kernel(act)).collect()
    }
    fn body(&self) -> Result<String, String> {
        Ok(compose(&[ACT, GLU], &[("ACT", self.0.wgsl().to_string())]))
    }
    fn uniform_wgsl(&self) -> &'static str {
        GluUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        256
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "glu_{:?}", self.0)
    }
}

/// The graph's `Op::Glu`: reads [gate, up], writes [dst]; with `pairs`, reads [pairs,
/// pairs]: one tensor of interleaved (gate, up) rows
pub struct GluNode {
    pub act: Activation,
    pub n: u32,
    pub pairs: bool,
}

impl GraphOp for GluNode {
    fn kind(&self) -> String {
        "glu".into()
    }

    fn cost(&self) -> OpCost {
        // act(gate) * up: the activation is a few operations (exp, divide, multiply).
        let Self { n, .. } = self;
        OpCost::new(3 * *n as u64 * F32_BYTES, 5 * *n as u64)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { act, n, pairs } = self;
        dispatches.push(match pairs {
            true => glu_pairs(gpu, *act, &r[0], &w[0], *n)?,
            false => glu(gpu, *act, &r[0], &r[1], &w[0], *n)?,
        });
        Ok(())
    }
}
