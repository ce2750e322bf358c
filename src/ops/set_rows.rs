//! set_rows: copy new K/V rows into their cache cells.

use super::kernels::{kernel_files, Family};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{kv_reading, set_rows_source};
use super::uniforms::SetRowsUniform;
use super::{record, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};
use crate::kv::KvType;

/// dst row idx[r] = src row r, for r < n_rows, rows of row_len values; dst is a cache of
/// type `ty` (packed types quantize a 32-value block per invocation: row_len a multiple
/// of 32, and of 64 for the block types).
pub fn set_rows(
    gpu: &Gpu,
    src: &View,
    idx: &View,
    dst: &View,
    row_len: u32,
    n_rows: u32,
    ty: KvType,
) -> Result<Dispatch, GpuError> {
    ty.check_shape(32, row_len)
        .map_err(|e| GpuError::Validation(format!("set_rows: {e}")))?;
    let pipeline = gpu.pipeline(KernelKey::SetRows(Kernel::Store { ty }))?;
    let per_group = if ty.is_packed() { 32 * 64 } else { 64 };
    let params = SetRowsUniform {
        row_len,
        n_rows,
        ..Default::default()
    };
    record(
        gpu,
        "set_rows",
        pipeline,
        bytemuck::bytes_of(&params),
        &[src, idx, dst],
        [row_len.div_ceil(per_group), n_rows, 1],
    )
}

pub fn set_rows_ref(dst: &mut [f32], src: &[f32], idx: &[u32], row_len: usize) {
    for (r, &i) in idx.iter().enumerate() {
        dst[i as usize * row_len..(i as usize + 1) * row_len]
            .copy_from_slice(&src[r * row_len..(r + 1) * row_len]);
    }
}

/// Values of a cache of type `ty` back as f32: `count` vec4s from vec4 `first` of `src`
/// (logical [head_dim, n_head_kv, cells] order) into `dst`.
pub fn kv_read(
    gpu: &Gpu,
    src: &View,
    dst: &View,
    first: u32,
    count: u32,
    ty: KvType,
) -> Result<Dispatch, GpuError> {
    let params = SetRowsUniform {
        row_len: first,
        n_rows: count,
        ..Default::default()
    };
    let (x, y) = super::split_groups(count.div_ceil(64));
    record(
        gpu,
        "kv_read",
        gpu.pipeline(KernelKey::SetRows(Kernel::Read { ty }))?,
        bytemuck::bytes_of(&params),
        &[src, dst],
        [x, y, 1],
    )
}

kernel_files! {
    KV_READ = "kernels/kv_read.wgsl";
}

/// Cache rows written from f32 rows, or read back as f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Copy of f32 rows into cache rows of type `ty` (quantizing a block at a time for
    /// the packed types).
    Store { ty: KvType },
    /// Cache rows of type `ty` read back as f32 (the K-shift of a packed K cache).
    Read { ty: KvType },
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        let types = KvType::ALL.into_iter();
        types
            .flat_map(|ty| [Kernel::Store { ty }, Kernel::Read { ty }])
            .collect()
    }
    fn body(&self) -> Result<String, String> {
        Ok(match *self {
            Kernel::Store { ty } => set_rows_source(ty),
            Kernel::Read { ty } => kv_reading(KV_READ, Some(ty), None, &[]),
        })
    }
    fn uniform_wgsl(&self) -> &'static str {
        SetRowsUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        64
    }
    fn features(&self) -> wgpu::Features {
        let (Kernel::Store { ty } | Kernel::Read { ty }) = *self;
        match ty {
            KvType::F16 => wgpu::Features::SHADER_F16,
            _ => wgpu::Features::empty(),
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kernel::Store { ty } => write!(f, "set_rows_{ty}"),
            Kernel::Read { ty } => write!(f, "kv_read_{ty}"),
        }
    }
}

/// The graph's `Op::StoreRows`: reads [src, idx], writes [dst]: f32 rows of src to rows idx
/// of dst
pub struct StoreRowsNode {
    pub row_len: u32,
    pub n_rows: u32,
}

impl GraphOp for StoreRowsNode {
    fn kind(&self) -> String {
        "store_rows".into()
    }

    fn cost(&self) -> OpCost {
        let Self { row_len, n_rows } = self;
        OpCost::new(2 * *row_len as u64 * *n_rows as u64 * F32_BYTES, 0)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { row_len, n_rows } = self;
        dispatches.push(set_rows(
            gpu,
            &r[0],
            &r[1],
            &w[0],
            *row_len,
            *n_rows,
            crate::kv::KvType::F32,
        )?);
        Ok(())
    }
}
