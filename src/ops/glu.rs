//! Gated linear units: SwiGLU (SiLU gate, llama) and GeGLU (tanh-GELU gate, gemma).

use super::uniforms::GluUniform;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    Silu,
    Gelu,
}

impl Activation {
    /// Every activation, for enumerating the kernel variants.
    pub const ALL: &'static [Activation] = &[Activation::Silu, Activation::Gelu];

    pub(crate) fn wgsl(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::Gelu => "gelu",
        }
    }
    pub fn apply(self, v: f32) -> f32 {
        let v = v as f64;
        (match self {
            Activation::Silu => v / (1.0 + (-v).exp()),
            Activation::Gelu => {
                0.5 * v * (1.0 + (0.7978845608028654 * v * (1.0 + 0.044715 * v * v)).tanh())
            }
        }) as f32
    }
}

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
    let pipeline = gpu.pipeline(KernelKey::Glu(act))?;
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
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| act.apply(g) * u)
        .collect()
}
