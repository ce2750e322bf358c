//! A weight matrix on the GPU, in its block layout, split into row chunks that each fit
//! one storage binding (a 170 MiB embedding does not fit lavapipe's 128 MiB).

use crate::gguf::GgmlType;
use crate::gpu::{Gpu, GpuError};
use crate::quant;
use std::sync::Arc;

/// The gate and up projections of a gated feed-forward: a layout the model chooses when
/// it uploads the weights and the graph and the tuner both run.
#[derive(Clone)]
pub enum GateUp {
    /// One weight of interleaved (gate, up) rows: one matmul with the GLU in its
    /// epilogue.
    Interleaved(Arc<Weight>),
    /// Two weights (their types differ): two matmuls and a GLU.
    Split { gate: Arc<Weight>, up: Arc<Weight> },
}

/// A layer's feed-forward weights: one gated feed-forward, or a mixture of experts.
pub enum Ffn {
    Dense {
        gate_up: GateUp,
        down: Arc<Weight>,
    },
    /// Boxed: a mixture's weights are ten times a dense feed-forward's handles.
    Experts(Box<Experts>),
}

/// A mixture-of-experts feed-forward: the router, and each projection's experts stacked
/// ([`Weight::upload_experts`]): gate and up [n_embd -> n_ff] each, down [n_ff -> n_embd].
pub struct Experts {
    pub routing: super::moe::MoeRouting,
    pub gate_inp: Arc<Weight>,
    pub gate: Arc<Weight>,
    pub up: Arc<Weight>,
    pub down: Arc<Weight>,
    /// Qwen2-MoE's shared expert, which every token passes through beside its chosen ones.
    pub shared: Option<SharedExpert>,
    /// gpt-oss's biases of the router and of each expert's projections.
    pub bias: Option<ExpertBiases>,
}

/// Biases of a mixture of experts (gpt-oss): the router's [n_expert], and each
/// projection's per expert ([rows, n_expert], an expert's bias row after another's).
pub struct ExpertBiases {
    pub gate_inp: super::View,
    pub gate: super::View,
    pub up: super::View,
    pub down: super::View,
}

/// A dense feed-forward every token takes, its output gated per token by
/// sigmoid(gate_inp · x) (one row: one gate value per token).
pub struct SharedExpert {
    pub gate_inp: Arc<Weight>,
    pub gate_up: GateUp,
    pub down: Arc<Weight>,
}

impl Experts {
    /// Expert 0's projections as a dense feed-forward (sharing the stacked buffers): what
    /// the tuner times a mixture-of-experts layer's feed-forward shape on.
    pub fn first(&self) -> (GateUp, Arc<Weight>) {
        let n = self.routing.n_expert;
        // Whole experts per chunk: expert 0's rows are the first chunk's first.
        let one = |w: &Weight| {
            let first = w.first_rows(w.n_rows / n, format!("{}[expert 0]", w.name));
            Arc::new(first.expect("an expert's rows in the first chunk"))
        };
        let gate_up = GateUp::Split {
            gate: one(&self.gate),
            up: one(&self.up),
        };
        (gate_up, one(&self.down))
    }
}

impl Ffn {
    /// The dense feed-forward a tuner times for this one (see [`Experts::first`]).
    pub fn dense(&self) -> (GateUp, Arc<Weight>) {
        match self {
            Ffn::Dense { gate_up, down } => (gate_up.clone(), down.clone()),
            Ffn::Experts(e) => e.first(),
        }
    }
}

pub struct WeightChunk {
    pub row_begin: u32,
    pub n_rows: u32,
    pub buf: wgpu::Buffer,
}

pub struct Weight {
    pub name: String,
    pub ty: GgmlType,
    /// Elements per row (ne0).
    pub n_cols: u32,
    pub n_rows: u32,
    /// 32-bit words per row in the GPU layout.
    pub row_words: u32,
    pub chunks: Vec<WeightChunk>,
}

/// Bytes of a file row of `n_cols` elements of `ty`.
fn row_bytes(name: &str, ty: GgmlType, n_cols: usize) -> Result<usize, GpuError> {
    ty.row_bytes(n_cols as u64)
        .map(|b| b as usize)
        .ok_or_else(|| {
            GpuError::Validation(format!(
                "{name}: rows of {n_cols} elements are not whole {ty} blocks"
            ))
        })
}

impl Weight {
    /// The first `rows` rows (at most the first chunk's) as a weight of their own, sharing
    /// the buffer, named `name`; None for a weight without rows.
    pub fn first_rows(&self, rows: u32, name: String) -> Option<Weight> {
        let first = self.chunks.first()?;
        let rows = rows.min(first.n_rows);
        Some(Weight {
            name,
            ty: self.ty,
            n_cols: self.n_cols,
            n_rows: rows,
            row_words: self.row_words,
            chunks: vec![WeightChunk {
                row_begin: 0,
                n_rows: rows,
                buf: first.buf.clone(),
            }],
        })
    }

    /// Uploads `data` (GGUF bytes of a [n_cols, n_rows] tensor), re-laid out for the GPU.
    pub fn upload(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        n_cols: usize,
        n_rows: usize,
        data: &[u8],
    ) -> Result<Weight, GpuError> {
        Self::upload_chunked(gpu, name, ty, n_cols, n_rows, data, 1)
    }

    /// The experts of a mixture-of-experts tensor ([n_cols, rows, n_expert] in GGUF, each
    /// expert's rows after the last's) as one weight of n_expert x rows rows, chunked at
    /// whole experts so that each expert's matrix lies in one binding.
    pub fn upload_experts(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        n_cols: usize,
        rows: usize,
        n_expert: usize,
        data: &[u8],
    ) -> Result<Weight, GpuError> {
        Self::upload_chunked(gpu, name, ty, n_cols, rows * n_expert, data, rows.max(1))
    }

    /// Several same-typed [n_cols, rows] tensors (GGUF bytes each) as one weight: stacked
    /// (all rows of the first, then the second...: Q, K and V in one matmul), or with
    /// `interleave` row by row (gate 0, up 0, gate 1, ...: the pairs the fused GLU
    /// epilogue reads; the parts then have the same rows, and chunks hold whole pairs).
    pub fn upload_fused(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        n_cols: usize,
        parts: &[&[u8]],
        interleave: bool,
    ) -> Result<Weight, GpuError> {
        let row_bytes = row_bytes(name, ty, n_cols)?;
        let rows: Vec<usize> = parts.iter().map(|p| p.len() / row_bytes).collect();
        let n_rows: usize = rows.iter().sum();
        if interleave && rows.iter().any(|&r| r != rows[0]) {
            return Err(GpuError::Validation(format!(
                "{name}: interleaved parts differ in rows ({rows:?})"
            )));
        }
        let mut data = Vec::with_capacity(n_rows * row_bytes);
        if interleave {
            for r in 0..rows[0] {
                for p in parts {
                    data.extend_from_slice(&p[r * row_bytes..(r + 1) * row_bytes]);
                }
            }
        } else {
            for (p, &r) in parts.iter().zip(&rows) {
                data.extend_from_slice(&p[..r * row_bytes]);
            }
        }
        let multiple = if interleave { parts.len() } else { 1 };
        Self::upload_chunked(gpu, name, ty, n_cols, n_rows, &data, multiple)
    }

    /// [`Self::upload`] with chunks of a multiple of `row_multiple` rows.
    fn upload_chunked(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        n_cols: usize,
        n_rows: usize,
        data: &[u8],
        row_multiple: usize,
    ) -> Result<Weight, GpuError> {
        let fmt = quant::format(ty).ok_or_else(|| {
            GpuError::Validation(format!(
                "{name}: no GPU kernels for type {ty} (supported: {})",
                quant::supported_names()
            ))
        })?;
        let row_words = fmt.gpu_row_words(n_cols);
        if row_words == 0 {
            return Err(GpuError::Validation(format!(
                "{name}: a [{n_cols}, {n_rows}] matrix has empty rows"
            )));
        }
        let row_bytes = row_bytes(name, ty, n_cols)?;
        if data.len() < n_rows * row_bytes {
            return Err(GpuError::Validation(format!(
                "{name}: {} bytes of data for {n_rows} rows of {row_bytes}",
                data.len()
            )));
        }
        let fit = (gpu.max_binding / 4) as usize / row_words;
        let rows_per_chunk = (fit / row_multiple * row_multiple)
            .max(row_multiple)
            .min(n_rows.max(1));
        let mut chunks = Vec::new();
        let mut words = Vec::new();
        for row_begin in (0..n_rows).step_by(rows_per_chunk) {
            let rows = rows_per_chunk.min(n_rows - row_begin);
            words.clear();
            words.reserve(rows * row_words);
            let src = &data[row_begin * row_bytes..(row_begin + rows) * row_bytes];
            fmt.repack_rows(src, n_cols, &mut words);
            let label = format!("{name}[{row_begin}..]");
            let buf = gpu.upload(&label, bytemuck::cast_slice(&words))?;
            chunks.push(WeightChunk {
                row_begin: row_begin as u32,
                n_rows: rows as u32,
                buf,
            });
        }
        Ok(Weight {
            name: name.to_string(),
            ty,
            n_cols: n_cols as u32,
            n_rows: n_rows as u32,
            row_words: row_words as u32,
            chunks,
        })
    }

    /// Refuses rows that are not whole blocks of 32 (what the matmul kernels step by;
    /// `op` names the kernel in the message).
    pub fn check_blocks_of_32(&self, op: &str) -> Result<(), GpuError> {
        if !self.n_cols.is_multiple_of(32) {
            return Err(GpuError::Validation(format!(
                "{op} {}: row length {} is not a multiple of 32",
                self.name, self.n_cols
            )));
        }
        Ok(())
    }

    pub fn gpu_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buf.size()).sum()
    }
}
