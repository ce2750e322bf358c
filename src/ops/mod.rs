//! Tensor ops: each is a WGSL shader in `shaders/kernels/`, a Rust function that records its
//! dispatch(es), and a plain CPU reference the tests compare against.
//!
//! Ops do not run anything: they return [`Dispatch`]es, which the graph executor replays
//! inside one compute pass. Parameters go in a small uniform buffer per dispatch, made once
//! when the graph is built; what changes per step lives in input buffers.

pub mod add_rms_norm;
pub mod add_scaled;
pub mod attention;
pub mod binary;
pub mod get_rows;
pub mod glu;
pub mod hadamard;
pub mod kernels;
pub mod layer_norm;
pub mod matmul;
pub mod matmul_q8;
pub mod moe;
pub mod node;
pub mod patches;
pub mod pixel_shuffle;
pub mod pool;
pub mod pool_grid;
pub mod rms_norm;
pub mod rope;
pub mod rope_store;
pub mod sample;
pub mod set_rows;
pub mod shaders;
pub mod softmax;
pub mod ssm;
pub mod tuning;
pub mod uniforms;
pub mod weight;

use crate::gpu::{Gpu, GpuError};
use std::sync::Arc;

kernels::families! {
    RmsNorm(rms_norm::Kernel),
    LayerNorm(layer_norm::Kernel),
    /// Sums of runs of rows (mean pooling).
    PoolRows(pool::Kernel),
    /// A LoRA adapter's scaled correction added into a matmul's output rows.
    AddScaled(add_scaled::Kernel),
    Binary(binary::Kernel),
    Glu(glu::Kernel),
    Rope(rope::Kernel),
    RopeStore(rope_store::Kernel),
    SetRows(set_rows::Kernel),
    /// Chunks of values times the Walsh-Hadamard matrix, in place (llama.cpp's attention
    /// rotation of a quantized cache).
    Hadamard(hadamard::Kernel),
    Softmax(softmax::Kernel),
    Attention(attention::Kernel),
    GetRows(get_rows::Kernel),
    Matmul(matmul::Kernel),
    MatmulQ8(matmul_q8::Kernel),
    Moe(moe::Kernel),
    Ssm(ssm::Kernel),
    Sample(sample::Kernel),
    /// An image cut into patch rows (a vision tower's patch embedding).
    Patches(patches::Kernel),
    /// Square cells of a token grid averaged (a vision projector's pooling).
    PoolGrid(pool_grid::Kernel),
    /// Square cells of a token grid folded into single rows (a vision projector's pixel
    /// shuffle).
    PixelShuffle(pixel_shuffle::Kernel),
}
pub use node::{GraphOp, OpCost};
pub use tuning::{KernelTuning, TuningError};
pub use weight::{ExpertBiases, Experts, Ffn, GateUp, SharedExpert, Weight};

/// A byte range of a GPU buffer, as an op sees an input or output.
#[derive(Clone, Debug)]
pub struct View {
    pub buf: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl View {
    pub fn whole(buf: &wgpu::Buffer) -> View {
        View {
            buf: buf.clone(),
            offset: 0,
            size: buf.size(),
        }
    }
}

/// One recorded compute dispatch.
pub struct Dispatch {
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub groups: [u32; 3],
    pub label: &'static str,
    /// The storage buffers bound (bindings 1..), each with whether the kernel may write
    /// it: what decides where wgpu puts barriers ([`barriers`]).
    pub bound: Vec<(wgpu::Buffer, bool)>,
}

/// How many of `dispatches`, run in order in one pass, wgpu records a barrier before: by
/// its rule, one wherever a bound buffer was last used writable (whatever the ranges), or
/// is bound writable after being read. Buffers first seen in the run count as settled.
// wgpu hashes a buffer by its identity, which its interior mutability never changes.
#[allow(clippy::mutable_key_type)]
pub fn barriers(dispatches: &[Dispatch]) -> usize {
    use std::collections::HashMap;
    let mut last: HashMap<&wgpu::Buffer, bool> = HashMap::new();
    let mut n = 0;
    for d in dispatches {
        // Each buffer once, writable if any of its bindings is.
        let mut now: HashMap<&wgpu::Buffer, bool> = HashMap::new();
        for (buf, writes) in &d.bound {
            *now.entry(buf).or_insert(false) |= *writes;
        }
        let needs = now
            .iter()
            .any(|(buf, &w)| last.get(buf).is_some_and(|&was| was || w));
        n += needs as usize;
        last.extend(now);
    }
    n
}

/// The per-dimension dispatch limit every adapter supports.
pub const MAX_GROUPS: u32 = 65535;

/// Splits `n` workgroups over x and y (shaders rebuild the index as y * 65535 + x).
pub fn split_groups(n: u32) -> (u32, u32) {
    if n <= MAX_GROUPS {
        (n.max(1), 1)
    } else {
        (MAX_GROUPS, n.div_ceil(MAX_GROUPS))
    }
}

/// Records a dispatch: binding 0 is a uniform holding `params` (the kernel's struct from
/// [`uniforms`], as bytes), bindings 1.. the views.
pub fn record(
    gpu: &Gpu,
    label: &'static str,
    pipeline: Arc<wgpu::ComputePipeline>,
    params: &[u8],
    views: &[&View],
    groups: [u32; 3],
) -> Result<Dispatch, GpuError> {
    let uniform = gpu.uniform(label, params);
    let layout = pipeline.get_bind_group_layout(0);
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: uniform.as_entire_binding(),
    }];
    for (i, v) in views.iter().enumerate() {
        if v.size > gpu.max_binding {
            return Err(GpuError::Validation(format!(
                "{label}: binding {} is {} bytes, over the adapter's storage binding limit {}",
                i + 1,
                v.size,
                gpu.max_binding
            )));
        }
        entries.push(wgpu::BindGroupEntry {
            binding: i as u32 + 1,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &v.buf,
                offset: v.offset,
                size: wgpu::BufferSize::new(v.size),
            }),
        });
    }
    let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &layout,
        entries: &entries,
    });
    let writes = gpu.binding_writes(&pipeline);
    let bound = views
        .iter()
        .enumerate()
        .map(|(i, v)| (v.buf.clone(), writes.get(i + 1).copied().unwrap_or(true)))
        .collect();
    Ok(Dispatch {
        pipeline,
        bind_group,
        groups,
        label,
        bound,
    })
}

/// Runs dispatches in one compute pass and one submit (for tests and one-off work).
pub fn run_now(gpu: &Gpu, dispatches: &[Dispatch]) -> Result<(), GpuError> {
    run_repeated(gpu, dispatches, 1)
}

/// Runs the dispatches `reps` times over in one compute pass and one submit, and waits
/// (the tuner times kernels this way, so that one submit's cost is spread over many).
pub fn run_repeated(gpu: &Gpu, dispatches: &[Dispatch], reps: u32) -> Result<(), GpuError> {
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        for _ in 0..reps {
            for d in dispatches {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
        }
    }
    gpu.queue.submit([enc.finish()]);
    gpu.flush()
}

/// Normalized mean squared error, as llama.cpp's test-backend-ops reports it.
pub fn nmse(reference: &[f32], actual: &[f32]) -> f64 {
    assert_eq!(reference.len(), actual.len(), "nmse: length mismatch");
    let mut err = 0.0f64;
    let mut norm = 0.0f64;
    for (&r, &a) in reference.iter().zip(actual) {
        err += (r as f64 - a as f64).powi(2);
        norm += (r as f64).powi(2);
    }
    if norm == 0.0 {
        err
    } else {
        err / norm
    }
}
