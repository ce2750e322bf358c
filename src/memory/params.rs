//! What the memory is asked to hold and its own errors: the context's settings it needs
//! (the context turns its `ContextParams` into these) and what can go wrong in it (the
//! context turns each into its own error of the same name).

use super::StateError;
use crate::gpu::GpuError;
use crate::kv::{KvConfig, KvError};

/// The settings a memory is made for.
#[derive(Clone, Copy, Debug)]
pub struct MemoryParams {
    /// Cache cells (-c).
    pub n_ctx: u32,
    /// Most tokens one graph computes (-ub, at most -b).
    pub n_ubatch: u32,
    /// Distinct sequences (-np); ids are 0..n_seq_max.
    pub n_seq_max: u32,
    /// Compact a store when this share of its cells below the used bound are holes
    /// (--defrag-thold; <= 0: never).
    pub defrag_thold: f32,
    /// Sliding-window layers keep a full-size store (--swa-full) instead of a rolling
    /// buffer of their window.
    pub swa_full: bool,
    /// Positions below this stay in the rolling buffer (a context shift's kept prefix).
    pub swa_keep: u32,
    /// What the K/V stores hold and whether attention is flash attention.
    pub kv: KvConfig,
}

/// What the memory refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("invalid batch: {0}")]
    BadBatch(String),
    #[error("{0}")]
    TooLarge(String),
    /// A cache type or flash attention setting this model or adapter cannot serve.
    #[error("{0}")]
    Cache(String),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("Self-Extend (--grp-attn-n) divides positions, so a sliding window would span more tokens than the rolling buffer of this model's sliding-window layers keeps; use --swa-full")]
    SelfExtendNeedsSwaFull,
}
