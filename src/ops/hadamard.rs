//! hadamard: every chunk of n values times the orthonormal Walsh-Hadamard matrix, in
//! place. llama.cpp rotates Q, K and V heads this way when the cache is quantized (an
//! outlier spreads over the block instead of setting its scale); the matrix is its own
//! inverse, so the same op rotates attention's output back and brackets the K-shift's
//! RoPE. rope_store applies it to heads itself (`rot_k`, `rot_v`).

use super::kernels::{by_shape, kernel_files, shape_suffix, Family, SHAPES};
use super::uniforms::SetRowsUniform;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError, KernelShape};

/// Largest chunk the kernels hold (a private array, or workgroup memory).
pub const MAX_HADAMARD: u32 = 256;

/// Rotates `count` chunks of `n` f32 values of `x` (n a power of two, 2..=256).
pub fn hadamard(gpu: &Gpu, x: &View, n: u32, count: u32) -> Result<Dispatch, GpuError> {
    if !n.is_power_of_two() || !(2..=MAX_HADAMARD).contains(&n) {
        return Err(GpuError::Validation(format!(
            "hadamard: chunks of {n} values (a power of two up to {MAX_HADAMARD})"
        )));
    }
    let params = SetRowsUniform {
        row_len: n,
        n_rows: count,
        ..Default::default()
    };
    // GPUs take a workgroup per chunk (`hadamard_wg.wgsl`); CPU-shaped (`hadamard_rows.wgsl`) adapters an
    // invocation per chunk, with no barriers.
    let shape = gpu.kernels;
    let wg = shape == KernelShape::Gpu;
    let (gx, gy) = split_groups(if wg { count } else { count.div_ceil(64) });
    record(
        gpu,
        "hadamard",
        gpu.pipeline(KernelKey::Hadamard(Kernel { shape }))?,
        bytemuck::bytes_of(&params),
        &[x],
        [gx, gy, 1],
    )
}

/// CPU reference: every whole chunk of `n` values of `x` times H_n / sqrt(n), with the
/// matrix written out as llama.cpp builds it (entries ±1/sqrt(n)).
pub fn hadamard_ref(x: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    let h = 1.0 / (n as f32).sqrt();
    for chunk in x.chunks_exact_mut(n) {
        let src = chunk.to_vec();
        for (i, out) in chunk.iter_mut().enumerate() {
            *out = (0..n)
                .map(|j| if (i & j).count_ones() % 2 == 0 { h } else { -h } * src[j])
                .sum();
        }
    }
}

kernel_files! {
    HADAMARD_ROWS = "kernels/hadamard_rows.wgsl";
    HADAMARD_WG = "kernels/hadamard_wg.wgsl";
}

/// The transform in place: a workgroup per chunk (GPU-shaped) or an invocation per chunk
/// (CPU-shaped: no barriers).
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
        Ok(by_shape(self.shape, HADAMARD_ROWS, HADAMARD_WG).to_string())
    }
    fn uniform_wgsl(&self) -> &'static str {
        SetRowsUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        64
    }
    fn cpu_shaped(&self) -> bool {
        self.shape == KernelShape::Cpu
    }
    /// `hadamard_wg.wgsl` writes all n values of its chunk, the only ones it reads.
    fn writes_workgroup_memory_first(&self) -> bool {
        self.shape == KernelShape::Gpu
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hadamard{}", shape_suffix(self.shape))
    }
}
