//! set_rows: copy new K/V rows into their cache cells.

use super::uniforms::SetRowsUniform;
use super::{record, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// dst row idx[r] = src row r, for r < n_rows, rows of row_len values; dst holds f16
/// when `dst_f16` (the KV cache on adapters with shader-f16), else f32.
pub fn set_rows(
    gpu: &Gpu,
    src: &View,
    idx: &View,
    dst: &View,
    row_len: u32,
    n_rows: u32,
    dst_f16: bool,
) -> Result<Dispatch, GpuError> {
    let pipeline = gpu.pipeline(KernelKey::SetRows { f16: dst_f16 })?;
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
        [row_len.div_ceil(64), n_rows, 1],
    )
}

pub fn set_rows_ref(dst: &mut [f32], src: &[f32], idx: &[u32], row_len: usize) {
    for (r, &i) in idx.iter().enumerate() {
        dst[i as usize * row_len..(i as usize + 1) * row_len]
            .copy_from_slice(&src[r * row_len..(r + 1) * row_len]);
    }
}
