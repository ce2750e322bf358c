//! get_rows: gather whole rows of a (quantized) matrix into f32 rows.

use super::kernels::{kernel_files, Family};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{compose, quant_source, weight_types, QUANT_READ};
use super::uniforms::uniform_struct;
use super::{record, Dispatch, KernelKey, View, Weight};
use crate::gguf::GgmlType;
use crate::gpu::{Gpu, GpuError};
use crate::quant;
use std::sync::Arc;

/// dst[t] = dequantized row ids[t] of `w`, for t < n_ids. One dispatch per weight chunk.
pub fn get_rows(
    gpu: &Gpu,
    w: &Weight,
    ids: &View,
    n_ids: u32,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    let ty = w.ty;
    let pipeline = gpu.pipeline(KernelKey::GetRows(Kernel { ty }))?;
    w.chunks
        .iter()
        .map(|c| {
            let params = GetRowsUniform {
                n: w.n_cols,
                row_words: w.row_words,
                row_begin: c.row_begin,
                row_count: c.n_rows,
                n_ids,
                ..Default::default()
            };
            record(
                gpu,
                "get_rows",
                pipeline.clone(),
                bytemuck::bytes_of(&params),
                &[&View::whole(&c.buf), ids, dst],
                [w.n_cols.div_ceil(64), n_ids, 1],
            )
        })
        .collect()
}

/// Selects rows of an f32 activation [n_cols, n_rows] (e.g. the tokens that need logits).
pub fn select_rows(
    gpu: &Gpu,
    src: &View,
    n_cols: u32,
    n_rows: u32,
    ids: &View,
    n_ids: u32,
    dst: &View,
) -> Result<Dispatch, GpuError> {
    let pipeline = gpu.pipeline(KernelKey::GetRows(Kernel { ty: GgmlType::F32 }))?;
    let params = GetRowsUniform {
        n: n_cols,
        row_words: n_cols,
        row_begin: 0,
        row_count: n_rows,
        n_ids,
        ..Default::default()
    };
    record(
        gpu,
        "select_rows",
        pipeline,
        bytemuck::bytes_of(&params),
        &[src, ids, dst],
        [n_cols.div_ceil(64), n_ids, 1],
    )
}

/// CPU reference on GGUF bytes of a [n_cols, n_rows] matrix of type `ty`.
pub fn get_rows_ref(ty: GgmlType, data: &[u8], n_cols: usize, ids: &[u32]) -> Vec<f32> {
    let row_bytes = ty.row_bytes(n_cols as u64).unwrap() as usize;
    let mut out = vec![0.0; ids.len() * n_cols];
    for (t, &r) in ids.iter().enumerate() {
        let src = &data[r as usize * row_bytes..(r as usize + 1) * row_bytes];
        quant::dequantize_row(ty, src, &mut out[t * n_cols..(t + 1) * n_cols]);
    }
    out
}

uniform_struct! {
    /// get_rows: gather rows of a (chunk of a) matrix.
    GetRowsUniform {
        /// Elements per row.
        n: u32,
        /// Words per row in the GPU layout.
        row_words: u32,
        row_begin: u32,
        row_count: u32,
        n_ids: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

kernel_files! {
    GET_ROWS = "kernels/get_rows.wgsl";
}

/// The gather of rows of weight type `ty`: an invocation per value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub ty: GgmlType,
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        weight_types().into_iter().map(|ty| Kernel { ty }).collect()
    }
    fn body(&self) -> Result<String, String> {
        Ok(compose(
            &[&quant_source(self.ty)?, QUANT_READ, GET_ROWS],
            &[],
        ))
    }
    fn uniform_wgsl(&self) -> &'static str {
        GetRowsUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        64
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "get_rows_{}", self.ty)
    }
}

/// The graph's `Op::GetRows`: reads [ids], writes [dst]
pub struct GetRowsNode {
    pub w: Arc<Weight>,
    pub n_ids: u32,
}

impl GraphOp for GetRowsNode {
    fn kind(&self) -> String {
        let Self { w, .. } = self;
        format!("get_rows {}", w.ty).to_lowercase()
    }

    fn cost(&self) -> OpCost {
        let Self { w, n_ids } = self;
        let (cols, rows, ids) = (w.n_cols as u64, w.n_rows.max(1) as u64, *n_ids as u64);
        let row_bytes = w.gpu_bytes() / rows;
        OpCost::new(ids * (row_bytes + cols * F32_BYTES + F32_BYTES), ids * cols)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { w: m, n_ids } = self;
        dispatches.extend(get_rows(gpu, m, &r[0], *n_ids, &w[0])?);
        Ok(())
    }
}

/// The graph's `Op::SelectRows`: reads [src, ids], writes [dst]: rows of an f32 activation
/// [n_cols, n_rows]
pub struct SelectRowsNode {
    pub n_cols: u32,
    pub n_rows: u32,
    pub n_ids: u32,
}

impl GraphOp for SelectRowsNode {
    fn kind(&self) -> String {
        "select_rows".into()
    }

    fn cost(&self) -> OpCost {
        let Self { n_cols, n_ids, .. } = self;
        let n = *n_cols as u64 * *n_ids as u64;
        OpCost::new(2 * n * F32_BYTES + *n_ids as u64 * F32_BYTES, 0)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self {
            n_cols,
            n_rows,
            n_ids,
        } = self;
        dispatches.push(select_rows(
            gpu, &r[0], *n_cols, *n_rows, &r[1], *n_ids, &w[0],
        )?);
        Ok(())
    }
}
