//! Mean pooling's sums on the GPU: runs of consecutive rows (a sequence's token states in
//! a ubatch) each summed into one row, so that an embedding reads back a row per
//! sequence instead of one per token.

use super::kernels::{kernel_files, one_kernel};
use super::uniforms::SetRowsUniform;
use super::{record, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// dst row g = the sum of `src` rows starts[g] .. starts[g + 1] (rows of `row_len`
/// values; `starts` holds n_runs + 1 ascending u32 row indices).
pub fn pool_rows(
    gpu: &Gpu,
    src: &View,
    starts: &View,
    dst: &View,
    row_len: u32,
    n_runs: u32,
) -> Result<Dispatch, GpuError> {
    if n_runs > 65535 {
        return Err(GpuError::Validation(format!(
            "pooling {n_runs} runs at once: at most 65535"
        )));
    }
    let pipeline = gpu.pipeline(KernelKey::PoolRows(Kernel))?;
    let params = SetRowsUniform {
        row_len,
        n_rows: n_runs,
        ..Default::default()
    };
    record(
        gpu,
        "pool_rows",
        pipeline,
        bytemuck::bytes_of(&params),
        &[src, starts, dst],
        [row_len.div_ceil(64), n_runs, 1],
    )
}

/// The CPU reference of [`pool_rows`].
pub fn pool_rows_ref(src: &[f32], starts: &[u32], row_len: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for w in starts.windows(2) {
        let mut s = vec![0f32; row_len];
        for r in w[0] as usize..w[1] as usize {
            for (a, &x) in s.iter_mut().zip(&src[r * row_len..(r + 1) * row_len]) {
                *a += x;
            }
        }
        out.extend(s);
    }
    out
}

kernel_files! {
    POOL_ROWS = "kernels/pool_rows.wgsl";
}

one_kernel!("pool_rows", POOL_ROWS, SetRowsUniform, 64);
