//! KV cache cell bookkeeping: which cache cell holds which position of which sequences.
//!
//! Host-only by design (no GPU types): the K/V tensors live in GPU buffers indexed by cell,
//! and everything that decides *where* a token goes or *what* it may attend to is here,
//! where it can be unit-tested exhaustively.

mod cells;
mod config;
mod defrag;
mod mask;
mod rs_cells;
mod seq;
mod view;
mod window;

/// The cache's element types, re-exported where a cache is configured; each type's layout,
/// WGSL and CPU reference live in `crate::quant::cache`.
pub use crate::quant::cache::{bf16_bits, KvType, GROUP as KV_GROUP};
pub use cells::{seqs_below, Cell, KvCells, KvError, SeqId, MAX_SEQ};
pub use config::{FlashAttn, KvChoice, KvConfig};
pub use defrag::Move;
pub use mask::{build_mask, MaskKind, MASKED};
pub use rs_cells::{RsCells, RsSlot, PARTIAL_RM};
pub use view::seq_set_text;
pub use window::RollingWindow;

/// Attention reads cells [0, n_kv) with n_kv a multiple of this (as llama.cpp pads it),
/// so the graph keeps one shape over many steps and can be replayed.
pub const N_KV_PAD: usize = 256;

/// Which K/V store a layer's rows live in: the full cache (every cell of the context), or
/// the rolling buffer of the sliding-window layers. A context without a separate buffer
/// (`--swa-full`, or no sliding-window layers) serves both kinds from the full cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheKind {
    Full,
    Window,
}
