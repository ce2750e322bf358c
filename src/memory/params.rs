//! What the memory is asked to hold and its own errors: the context's settings it needs
//! (the context turns its `ContextParams` into these) and what can go wrong in it (the
//! context carries it whole, as `ContextError::Memory`).

use super::StateError;
use crate::gpu::GpuError;
use crate::kv::{KvConfig, KvError};

/// The settings a memory is made for: the context's (`context::ContextParams`, whose
/// fields of the same names say what each is), with `n_ubatch` at most the batch.
#[derive(Clone, Copy, Debug)]
pub struct MemoryParams {
    pub n_ctx: u32,
    pub n_ubatch: u32,
    pub n_seq_max: u32,
    pub defrag_thold: f32,
    pub swa_full: bool,
    pub swa_keep: u32,
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
