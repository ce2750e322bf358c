//! set_rows: copy new K/V rows into their cache cells.

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
    let pipeline = gpu.pipeline(KernelKey::SetRows { ty })?;
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
        gpu.pipeline(KernelKey::KvRead { ty })?,
        bytemuck::bytes_of(&params),
        &[src, dst],
        [x, y, 1],
    )
}
