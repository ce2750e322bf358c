//! Sampling on the GPU: two dispatches turn rows of logits into tokens.
//!
//! `sample_topk_wg.wgsl` splits each row into segments; a workgroup per segment adds the
//! session's logit bias, applies its repetition penalties (from per-token counts of its
//! recent tokens, kept on the GPU) and keeps the segment's k largest as (key, id).
//! `sample_chain_wg.wgsl` takes the row's k largest of those, sorts them (larger logit
//! first, equal logits by id) and runs llama.cpp's chain on them — top-p, min-p,
//! temperature and the draw, with the uniform number the host drew from the session's
//! own random stream — then writes (token, probability), the final candidates with
//! their probabilities where the row asks (post-sampling `n_probs`), and records the
//! token in the penalty history. On GPUs a selection is a radix select over
//! order-preserving keys (four 8-bit digits) by a workgroup; on CPU-shaped adapters
//! (lavapipe, SwiftShader), where every barrier switches all of a workgroup's
//! invocations, each segment and each row is one invocation (`sample_*_rows.wgsl`): a heap keeps each segment's best, sorted
//! best first, and the row's pass merges the sorted segments. Both shapes take the same
//! candidates, ties at the k-th largest key by token id, so the pick does not depend on
//! the shape.
//!
//! The CPU reference of the whole chain is the CPU sampler itself
//! ([`crate::sample::Sampler`]); [`top_k_ref`] is the reference of the selection.

use super::kernels::{by_shape, kernel_files, shape_suffix, Family, SHAPES};
use super::shaders::compose;
use super::uniforms::{uniform_struct, SampleRow};
use super::{record, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError, KernelShape};

/// The largest top-k the GPU chain takes (its sort runs in one workgroup).
pub const MAX_K: u32 = 256;
/// Logits per first-pass workgroup, at most (its keys are held in workgroup memory):
/// a row of up to [`MAX_VOCAB`] is split into at most [`MAX_SEG`] segments.
pub const SEG_LEN: u32 = 4096;
pub const MAX_SEG: u32 = 256;
pub const MAX_VOCAB: u32 = SEG_LEN * MAX_SEG;

/// (logits per segment, segments) for a vocabulary.
pub fn segments(n_vocab: u32) -> (u32, u32) {
    let n_seg = n_vocab.div_ceil(SEG_LEN).clamp(1, MAX_SEG);
    (n_vocab.div_ceil(n_seg), n_seg)
}

/// Bytes of the probabilities buffer for `n_rows` rows.
pub fn probs_bytes(n_rows: u32) -> u64 {
    n_rows as u64 * MAX_K as u64 * 8
}

/// Bytes of the candidate buffer for `n_rows` rows of `n_vocab` logits.
pub fn cand_bytes(n_vocab: u32, n_rows: u32) -> u64 {
    n_rows as u64 * segments(n_vocab).1 as u64 * MAX_K as u64 * 8
}

/// The buffers the two passes bind.
pub struct SampleBuffers<'a> {
    /// Rows of `n_vocab` logits.
    pub logits: &'a View,
    /// [`SampleRow`]s, one per row to sample.
    pub rows: &'a View,
    /// Per slot, per token: occurrences in the slot's penalty history (u32).
    pub counts: &'a View,
    /// Per slot, per token: the logit bias (f32).
    pub bias: &'a View,
    /// First-pass candidates, [`cand_bytes`].
    pub cand: &'a View,
    /// Per slot: head, length, then `ring_max` tokens.
    pub ring: &'a View,
    /// Per row: (token, probability bits).
    pub result: &'a View,
    /// Per row, [`MAX_K`] places: the chain's final candidates asked for by the row's
    /// `n_probs`, best first, as (token, probability bits).
    pub probs: &'a View,
}

/// Records both passes for `n_rows` rows whose largest k is `k_stride` (<= [`MAX_K`]).
pub fn sample(
    gpu: &Gpu,
    b: &SampleBuffers,
    n_vocab: u32,
    n_rows: u32,
    k_stride: u32,
    ring_max: u32,
) -> Result<Vec<Dispatch>, GpuError> {
    let (seg_len, n_seg) = segments(n_vocab);
    let shape = gpu.kernels;
    let params = SampleUniform {
        n_vocab,
        seg_len,
        n_seg,
        k_stride: k_stride.clamp(1, MAX_K),
        ring_max,
        probs_stride: MAX_K,
        ..Default::default()
    };
    let topk = record(
        gpu,
        "sample_topk",
        gpu.pipeline(KernelKey::Sample(Kernel::Topk { shape }))?,
        bytemuck::bytes_of(&params),
        &[b.logits, b.rows, b.counts, b.bias, b.cand],
        [n_seg, n_rows, 1],
    )?;
    let chain = record(
        gpu,
        "sample_chain",
        gpu.pipeline(KernelKey::Sample(Kernel::Chain { shape }))?,
        bytemuck::bytes_of(&params),
        &[b.rows, b.cand, b.counts, b.ring, b.result, b.probs],
        [n_rows, 1, 1],
    )?;
    Ok(vec![topk, chain])
}

/// The GPU's order-preserving key of a float (larger floats, larger keys; 0 only for a
/// NaN pattern, which the kernels treat as no candidate).
pub fn f32_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// CPU reference of the selection: the min(k, n) largest values as (id, value), larger
/// first, equal values by id.
pub fn top_k_ref(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = (values.iter().enumerate())
        .filter(|(_, &x)| f32_key(x) != 0)
        .map(|(i, &x)| (i as u32, x))
        .collect();
    v.sort_by(|a, b| f32_key(b.1).cmp(&f32_key(a.1)).then(a.0.cmp(&b.0)));
    v.truncate(k);
    v
}

/// A row's settings with the draw's uniform number split into the float pair the
/// kernel adds back together.
pub fn split_uniform(u: f64) -> (f32, f32) {
    let hi = u as f32;
    (hi, (u - hi as f64) as f32)
}

impl SampleRow {
    /// Sets the draw's uniform number.
    pub fn with_uniform(mut self, u: f64) -> Self {
        (self.u_hi, self.u_lo) = split_uniform(u);
        self
    }
}

uniform_struct! {
    /// sample_topk and sample_chain: rows of `n_vocab` logits, the first pass's segments
    /// and candidate slots, the stride of a slot's penalty ring.
    SampleUniform {
        n_vocab: u32,
        /// Logits per first-pass workgroup.
        seg_len: u32,
        n_seg: u32,
        /// Candidate slots per (row, segment): the largest k of the dispatch's rows.
        k_stride: u32,
        /// Entries per slot's ring (the ring buffer holds head, length, entries).
        ring_max: u32,
        /// (token, probability) places per row in the probabilities buffer.
        probs_stride: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

kernel_files! {
    SAMPLE_KEYS = "common/sample_keys.wgsl";
    SAMPLE_SELECT = "common/sample_select.wgsl";
    SAMPLE_HEAP = "common/sample_heap.wgsl";
    SAMPLE_LOGIT = "common/sample_logit.wgsl";
    SAMPLE_TOPK_WG = "kernels/sample_topk_wg.wgsl";
    SAMPLE_TOPK_ROWS = "kernels/sample_topk_rows.wgsl";
    SAMPLE_DRAW = "common/sample_draw.wgsl";
    SAMPLE_CHAIN_WG = "kernels/sample_chain_wg.wgsl";
    SAMPLE_CHAIN_ROWS = "kernels/sample_chain_rows.wgsl";
}

/// Sampling's two passes: a workgroup per segment or row with a radix select
/// (GPU-shaped), or one invocation with a heap (CPU-shaped, no barriers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Bias, penalties and each segment's top-k candidates.
    Topk { shape: KernelShape },
    /// The row's top-k, llama.cpp's chain and the draw.
    Chain { shape: KernelShape },
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        let topk = SHAPES.map(|shape| Kernel::Topk { shape });
        [topk, SHAPES.map(|shape| Kernel::Chain { shape })].concat()
    }
    fn body(&self) -> Result<String, String> {
        let (shape, shared, kernel_wg, kernel_rows) = match *self {
            Kernel::Topk { shape } => (shape, SAMPLE_LOGIT, SAMPLE_TOPK_WG, SAMPLE_TOPK_ROWS),
            Kernel::Chain { shape } => (shape, SAMPLE_DRAW, SAMPLE_CHAIN_WG, SAMPLE_CHAIN_ROWS),
        };
        let select = by_shape(shape, SAMPLE_HEAP, SAMPLE_SELECT);
        let kernel = by_shape(shape, kernel_rows, kernel_wg);
        let row = SampleRow::wgsl();
        Ok(compose(&[&row, SAMPLE_KEYS, shared, select, kernel], &[]))
    }
    fn uniform_wgsl(&self) -> &'static str {
        SampleUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        let (Kernel::Topk { shape } | Kernel::Chain { shape }) = *self;
        by_shape(shape, 1, 256)
    }
    fn cpu_shaped(&self) -> bool {
        let (Kernel::Topk { shape } | Kernel::Chain { shape }) = *self;
        shape == KernelShape::Cpu
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, shape) = match *self {
            Kernel::Topk { shape } => ("sample_topk", shape),
            Kernel::Chain { shape } => ("sample_chain", shape),
        };
        write!(f, "{name}{}", shape_suffix(shape))
    }
}
