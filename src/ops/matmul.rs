//! matmul: dst[t][r] = dot(W[r], x[t]) with W read in its quantized block layout.

use super::{record, shaders, split_groups, Dispatch, View, Weight};
use crate::gguf::{quant, GgmlType};
use crate::gpu::{Gpu, GpuError};

/// Tokens per invocation: matrix-vector for one token, small tiles for batches.
pub fn tokens_per_invocation(n_tok: u32) -> u32 {
    match n_tok {
        1 => 1,
        2..=4 => 4,
        _ => 8,
    }
}

/// x is [w.n_cols, n_tok] f32, dst is [w.n_rows, n_tok] f32. One dispatch per chunk.
pub fn matmul(gpu: &Gpu, w: &Weight, x: &View, n_tok: u32, dst: &View) -> Result<Vec<Dispatch>, GpuError> {
    let ty = w.ty;
    if w.n_cols % 32 != 0 {
        return Err(GpuError::Validation(format!(
            "matmul {}: row length {} is not a multiple of 32",
            w.name, w.n_cols
        )));
    }
    let tb = tokens_per_invocation(n_tok);
    let pipeline = gpu.pipeline(&format!("matmul_{ty}_{tb}"), || {
        shaders::compose(
            &[shaders::quant_snippet(ty).unwrap(), shaders::MATMUL],
            &[("TB", tb.to_string())],
        )
    })?;
    w.chunks
        .iter()
        .map(|c| {
            let (gx, gy) = split_groups(c.n_rows.div_ceil(64));
            let params = [w.n_cols, c.n_rows, n_tok, w.row_words, c.row_begin, w.n_rows, gx, 0];
            record(
                gpu,
                "matmul",
                pipeline.clone(),
                bytemuck::cast_slice(&params),
                &[&View::whole(&c.buf), x, dst],
                [gx, gy, n_tok.div_ceil(tb)],
            )
        })
        .collect()
}

/// CPU reference: dequantize each row, then f64-accumulated dot products.
pub fn matmul_ref(ty: GgmlType, data: &[u8], n_cols: usize, n_rows: usize, x: &[f32], n_tok: usize) -> Vec<f32> {
    let row_bytes = ty.row_bytes(n_cols as u64).unwrap() as usize;
    let mut row = vec![0.0f32; n_cols];
    let mut out = vec![0.0; n_rows * n_tok];
    for r in 0..n_rows {
        quant::dequantize_row(ty, &data[r * row_bytes..(r + 1) * row_bytes], &mut row);
        for t in 0..n_tok {
            let xs = &x[t * n_cols..(t + 1) * n_cols];
            let s: f64 = row.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
            out[t * n_rows + r] = s as f32;
        }
    }
    out
}
