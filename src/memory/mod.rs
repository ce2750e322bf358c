//! The model's memory of past tokens, behind one interface (llama.cpp's `llama_memory_i`).
//!
//! The context above (`context::Context`) keeps the batch checks, the ubatch loop and the
//! graph cache; everything about *where* past tokens live goes through [`Memory`]: the
//! sequence operations, placing each ubatch, the pending K-shift and defragmentation, the
//! graph inputs that depend on the stored cells (slots, masks), the part of the graph key
//! that changes with them, the per-layer handles architecture files read and write, state
//! files and the maps displays draw.
//!
//! Two memories implement it today: [`KvCache`], one store of cells with every layer's K
//! and V rows (also what sliding-window layers use with `--swa-full`), and [`SwaKvCache`],
//! the pair of a full store for the global layers and a rolling buffer for the
//! sliding-window layers (llama.cpp's iSWA cache). Recurrent and hybrid memories take the
//! same interface.
//!
//! The host-only bookkeeping (cells, masks, the window policy) stays in [`crate::kv`];
//! this module joins it to the GPU buffers.

mod hybrid;
mod kv_cache;
mod kv_shift;
mod kv_state;
mod params;
mod recurrent;
mod shape;
mod state_file;
mod swa;

pub use hybrid::HybridMemory;
pub use kv_cache::KvCache;
pub use kv_state::HostKvStore;
pub(crate) use kv_state::{read as read_kv_state, KvStore};
pub use params::{MemoryError, MemoryParams};
pub use recurrent::{split_equal, RecurrentMemory};
pub use shape::{LayerMemory, MemoryShape};
pub use state_file::StateError;
pub(crate) use state_file::{convert, Reader};
pub use swa::SwaKvCache;

/// The highest position a state file may give a cell: far past any context, and low
/// enough that position arithmetic (`pos + 1`, shifts by a context's length) cannot
/// overflow an `i32`.
pub(crate) const MAX_SAVED_POS: i32 = 1 << 30;

use crate::batch::Batch;
use crate::graph::{GraphInput, InputData, UbatchView};
use crate::kv::{CacheKind, Cell, KvCells, KvChoice, KvType, RsCells, SeqId, N_KV_PAD};
use crate::ops::View;
use std::ops::Range;
use std::sync::Arc;

/// Where one layer's K and V rows live: the views attention reads and rope_store writes,
/// and the store (whose slots, mask and `n_kv` the layer uses).
#[derive(Clone, Copy, Debug)]
pub struct KvLayer<'a> {
    pub k: &'a View,
    pub v: &'a View,
    pub store: CacheKind,
}

/// Where one recurrent layer's states live: the conv and (Mamba) SSM state buffers,
/// `[state values, rows]` f32 each, with one row per cell and a last row of zeros that a
/// new sequence starts from.
#[derive(Clone, Copy, Debug)]
pub struct RsLayer<'a> {
    pub conv: &'a View,
    pub ssm: Option<&'a View>,
    pub rows: u32,
}

/// The cells of every store, taken before a batch so a failed one leaves the memory as
/// it was (as llama.cpp restores its cells).
pub struct Checkpoint {
    kv: Vec<KvCells>,
    rs: Option<RsCells>,
}

/// The model's memory of past tokens (see the module docs). Sequence ids are checked by
/// the context against its `-np` before they get here.
pub trait Memory: Send + Sync {
    /// The cells of the main store (the one every sequence operation and batch check
    /// reads positions from).
    fn cells(&self) -> &KvCells;
    /// What the cache holds and how attention reads it (`-ctk`, `-ctv`, `-fa` decided).
    fn choice(&self) -> KvChoice;
    /// Every store as displays show it, the main one first.
    fn maps(&self) -> Vec<StoreMap>;
    /// Whether positions can be moved (context shift, Self-Extend) by re-rotating keys.
    fn can_shift(&self) -> bool;
    /// Whether `seq` can be decoded on from position `p` (after cutting it back there).
    fn can_resume(&self, seq: SeqId, p: i32) -> bool;

    /// Empties every store.
    fn clear(&mut self);
    /// Removes `seq` (None: all sequences) from positions [p0, p1) (negative: open).
    fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), MemoryError>;
    /// Makes `dst` share the cells of `src` in [p0, p1) (no K/V copy).
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), MemoryError>;
    /// Drops every sequence but `seq`.
    fn seq_keep(&mut self, seq: SeqId) -> Result<(), MemoryError>;
    /// Adds `delta` to the positions of `seq` in [p0, p1); the K-shift follows.
    fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), MemoryError>;
    /// Divides the positions of `seq` in [p0, p1) by `d`; the K-shift follows.
    fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), MemoryError>;
    /// The lowest position of `seq` held (-1: none).
    fn seq_pos_min(&self, seq: SeqId) -> i32 {
        self.cells().seq_pos_min(seq)
    }
    /// The highest position of `seq` held (-1: none).
    fn seq_pos_max(&self, seq: SeqId) -> i32 {
        self.cells().seq_pos_max(seq)
    }
    /// The M-RoPE time of the token after `seq`'s last in the main store (-1: none).
    fn seq_rope_next(&self, seq: SeqId) -> i32 {
        self.cells().seq_rope_next(seq)
    }
    /// Cells in use in the main store.
    fn used(&self) -> usize {
        self.cells().used()
    }

    /// Whether ubatches must take equally many tokens from each of their sequence sets
    /// (a memory with recurrent states: [`split_equal`]).
    fn equal_split(&self) -> bool {
        false
    }
    /// How a checked batch is cut into ubatches, as the batch indices of each ubatch's
    /// tokens: consecutive runs of at most `n_ubatch` tokens and `n_out_max` logit rows
    /// (llama.cpp's simple split, which a KV cache can take in any order), or the equal
    /// split where [`Memory::equal_split`] says so.
    fn split(
        &self,
        batch: &Batch,
        n_ubatch: usize,
        n_out_max: usize,
    ) -> Result<Vec<Vec<usize>>, MemoryError> {
        if self.equal_split() {
            return split_equal(&batch.seq, &batch.logits, n_ubatch, n_out_max);
        }
        Ok(split_simple(&batch.logits, n_ubatch, n_out_max)
            .into_iter()
            .map(|r| r.collect())
            .collect())
    }
    /// The cells of every store, to give back to [`Memory::rollback`].
    fn checkpoint(&self) -> Checkpoint;
    /// Restores the cells taken by [`Memory::checkpoint`]. K/V rows written since may
    /// stay, harmlessly, in cells that are empty again.
    fn rollback(&mut self, c: Checkpoint);
    /// Finds cells for a ubatch and stores its tokens' positions and sequences there; the
    /// graph then writes their K/V rows to the slots [`Memory::fill`] gives.
    fn place(&mut self, ub: &UbatchView) -> Result<(), MemoryError>;
    /// The contents of a graph input that depends on the stored cells (slots, masks) for
    /// the ubatch just placed; None for an input this memory does not provide.
    fn fill(&self, input: &GraphInput, ub: &UbatchView) -> Option<InputData>;
    /// Cells attention reads in store `kind` (a multiple of [`N_KV_PAD`]), for the graph
    /// shape and key: a graph is replayed while these stay the same.
    fn n_kv(&self, kind: CacheKind) -> u32;
    /// Layer `il`'s K/V views, if this memory holds that layer.
    fn layer(&self, il: usize) -> Option<KvLayer<'_>>;
    /// Layer `il`'s recurrent state buffers, if this memory holds that layer.
    fn rs_layer(&self, _il: usize) -> Option<RsLayer<'_>> {
        None
    }
    /// Sequence sets of the ubatch just placed in the recurrent states (0: none), for
    /// the graph shape and key.
    fn n_rs(&self) -> u32 {
        0
    }
    /// Whether positions are bounded by cells (attention's context window): false for a
    /// recurrent memory alone, whose sequences go on without a context shift.
    fn bounded(&self) -> bool {
        true
    }

    /// Applies pending K-shifts (from seq_add / seq_div) and, with `defrag`, compacts
    /// the cache when its holes pass `--defrag-thold`.
    fn update(&mut self, defrag: bool) -> Result<(), MemoryError>;
    /// Moves every used cell of the main store to the front (K/V rows with it); returns
    /// the number of cells moved.
    fn defrag(&mut self) -> Result<usize, MemoryError>;

    /// Appends this memory's part of a state file: the K/V types, the stores, and per
    /// store its cells (or only `seq`'s, saved as sequence 0) and their K/V rows. Returns
    /// the cells saved from the main store. Pending shifts must have been applied.
    #[cfg(not(target_arch = "wasm32"))]
    fn state_write(&self, out: &mut Vec<u8>, seq: Option<SeqId>) -> Result<usize, MemoryError>;
    /// Reads what [`Memory::state_write`] wrote, as `load` says; checks all of it before
    /// changing anything. Returns the cells loaded into the main store.
    fn state_read(&mut self, r: &mut Reader, load: &StateLoad) -> Result<usize, MemoryError>;
}

/// How a state file's memory part is loaded.
#[derive(Clone, Copy, Debug)]
pub struct StateLoad {
    /// None: the whole memory, replaced; Some(s): the saved sequence into sequence s.
    pub dst: Option<SeqId>,
    /// The K/V types where an older format put them before the tokens (already read).
    pub types: Option<(KvType, KvType)>,
    /// The context's `-np`: saved cells of other sequences are refused.
    pub n_seq_max: u32,
    /// Another memory's part follows this one's (the hybrid's K/V cache before its
    /// recurrent states), so bytes left over are not an error here.
    pub more: bool,
    /// Each K/V cell's next M-RoPE time follows its sequence set (version 6 on).
    pub rope_next: bool,
}

/// Consecutive runs of at most `n_ubatch` tokens, each ending early where its logit rows
/// would pass `n_out_max`.
pub fn split_simple(logits: &[bool], n_ubatch: usize, n_out_max: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < logits.len() {
        let (mut end, mut n_out) = (i, 0);
        while end < logits.len() && end - i < n_ubatch {
            if logits[end] {
                if n_out == n_out_max {
                    break;
                }
                n_out += 1;
            }
            end += 1;
        }
        out.push(i..end);
        i = end;
    }
    out
}

/// The contents of graph input `input` for a ubatch the memory has just placed: the
/// memory fills what depends on its cells (slots, masks), the ubatch the rest.
pub fn fill_input(
    mem: &dyn Memory,
    input: &GraphInput,
    ub: &UbatchView,
) -> Result<InputData, crate::gpu::GpuError> {
    // A non-causal ubatch (an image's tokens) unmasks its sequences' later cells too.
    let input = match *input {
        GraphInput::KqMask(kind) if ub.non_causal => &GraphInput::KqMask(crate::kv::MaskKind {
            non_causal: true,
            ..kind
        }),
        _ => input,
    };
    match input.fill_from_ubatch(ub) {
        Some(data) => Ok(data),
        None => mem.fill(input, ub).ok_or_else(|| {
            crate::gpu::GpuError::Validation(format!(
                "the model's graph reads input {input:?}, which its memory does not provide"
            ))
        }),
    }
}

/// The memory a model needs for these parameters: a rolling buffer beside the full store
/// where it has sliding-window layers (unless `--swa-full`), else one store for all.
pub fn create(
    shape: &Arc<MemoryShape>,
    params: &MemoryParams,
) -> Result<Box<dyn Memory>, MemoryError> {
    let hp = &**shape;
    if !hp.has_attention() {
        if params.kv.type_k.is_some() || params.kv.type_v.is_some() {
            return Err(MemoryError::Cache(
                "-ctk/-ctv: this model has no attention layers, so no K/V cache to type; its recurrent states are f32".into(),
            ));
        }
        return Ok(Box::new(RecurrentMemory::new(shape, params.n_seq_max)?));
    }
    let gpus: Vec<&crate::gpu::Gpu> = shape.placement.gpus().iter().map(|g| &**g).collect();
    let choice =
        kv_choice(&params.kv, &gpus, hp.head_dim, hp.n_embd_kv()).map_err(MemoryError::Cache)?;
    let ub = params.n_ubatch;
    if hp.has_recurrent() {
        let attn: Vec<usize> = (0..hp.n_layer())
            .filter(|&il| !hp.is_recurrent(il))
            .collect();
        let kv = KvCache::new(
            shape,
            choice,
            attn,
            params.n_ctx as usize,
            CacheKind::Full,
            params.defrag_thold,
        )?;
        log::info!(
            "context: {} cells, KV cache {:.1} MiB ({}) for the attention layers, ubatch {ub}",
            params.n_ctx,
            mib(kv.bytes()),
            describe(choice)
        );
        let recr = RecurrentMemory::new(shape, params.n_seq_max)?;
        return Ok(Box::new(HybridMemory::new(kv, recr)));
    }
    let mem: Box<dyn Memory> = match hp.swa_window {
        Some(window) if !params.swa_full => {
            Box::new(SwaKvCache::new(shape, params, choice, window, ub)?)
        }
        _ => {
            let all: Vec<usize> = (0..hp.n_layer()).collect();
            let c = KvCache::new(
                shape,
                choice,
                all,
                params.n_ctx as usize,
                CacheKind::Full,
                params.defrag_thold,
            )?;
            log::info!(
                "context: {} cells, KV cache {:.1} MiB ({}){}, ubatch {ub}",
                params.n_ctx,
                mib(c.bytes()),
                describe(choice),
                if hp.swa_window.is_some() {
                    ", full size for the sliding-window layers too (--swa-full)"
                } else {
                    ""
                }
            );
            Box::new(c)
        }
    };
    Ok(mem)
}

/// The cache the flags `kv` give a model with heads of `head_dim` and K/V rows of
/// `n_embd_kv` on `gpus` (a split model's cache types must suit every device holding
/// layers), or why there is none. `-fa auto` takes flash attention where the CPU-shaped
/// flash kernel holds the heads (lavapipe, SmolLM2, pp512: 89 t/s against 73 unfused at
/// depth 0; docs/benchmarking.md has the table at depth 4096); GPU-shaped kernels keep the unfused
/// path, faster on an H100 (`AttnShape::flash`).
pub fn kv_choice(
    kv: &crate::kv::KvConfig,
    gpus: &[&crate::gpu::Gpu],
    head_dim: u32,
    n_embd_kv: u32,
) -> Result<crate::kv::KvChoice, String> {
    let largest = crate::ops::attention::FLASH_ROWS_D4
        .iter()
        .max()
        .unwrap_or(&0);
    let flash_faster = gpus
        .iter()
        .all(|g| crate::ops::attention::cpu_flash_kernel(g))
        && head_dim <= 4 * largest;
    kv.resolve(
        gpus.iter().all(|g| g.has_f16),
        head_dim,
        n_embd_kv,
        flash_faster,
    )
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// "K q8_0, V q8_0, flash attention", for logs.
fn describe(c: KvChoice) -> String {
    let flash = if c.flash { ", flash attention" } else { "" };
    format!("K {}, V {}{flash}", c.type_k, c.type_v)
}

/// One store as a display sees it (the desktop app's cell map, a server's status page):
/// a copy of its cells, never K or V.
#[derive(Clone, Debug)]
pub struct StoreMap {
    /// "full cache" or "sliding-window buffer".
    pub name: &'static str,
    pub cells: Vec<Cell>,
    /// Cells the next decode's attention reads (the used bound padded as llama.cpp pads
    /// it), so a display can draw where the work stops.
    pub n_kv: usize,
    pub used: usize,
    /// K and V bytes of this store over all the layers that use it (state bytes for
    /// recurrent states).
    pub bytes: u64,
    /// The same bytes by device, indexed as the model's placement (one entry when the
    /// model runs on one device): each device holds its layers' part of every store.
    pub device_bytes: Vec<u64>,
    /// Recurrent states only (empty for K/V stores): per cell, the cell its state was
    /// last carried on from (itself, or the state it was copied from on its first write;
    /// None: it started from zeros)...
    pub sources: Vec<Option<usize>>,
    /// ...and per sequence with a state, the cell holding its latest one (its `tail`).
    pub tails: Vec<(SeqId, usize)>,
}

impl StoreMap {
    /// `device_bytes`: each device's part of the store's bytes (they sum to `bytes`).
    pub(crate) fn of(name: &'static str, cells: &KvCells, device_bytes: Vec<u64>) -> Self {
        StoreMap {
            name,
            cells: cells.cells().to_vec(),
            n_kv: cells.n_kv(N_KV_PAD),
            used: cells.used(),
            bytes: device_bytes.iter().sum(),
            device_bytes,
            sources: Vec::new(),
            tails: Vec::new(),
        }
    }

    /// Whether this store holds recurrent states (one per sequence, not one per token).
    pub fn is_recurrent(&self) -> bool {
        !self.sources.is_empty()
    }

    /// A recurrent store's states as text (`-dkvc`): per used cell its last position,
    /// sequences, and where its state came from.
    pub fn states_view(&self) -> String {
        let mut out = format!(
            "recurrent states: {} cells, {} used
",
            self.cells.len(),
            self.used
        );
        for (i, c) in self.cells.iter().enumerate().filter(|(_, c)| !c.is_empty()) {
            let from = match self.sources.get(i).copied().flatten() {
                Some(j) if j != i => format!(", copied from cell {j}"),
                Some(_) => String::new(),
                None => ", from zeros".into(),
            };
            out.push_str(&format!(
                "  state {i}: last pos {}, sequences {}{from}\n",
                c.pos,
                crate::kv::seq_set_text(c.seq)
            ));
        }
        out
    }

    /// Cells a context shift or Self-Extend moved to a new position.
    pub fn moved(&self) -> usize {
        self.cells
            .iter()
            .filter(|c| !c.is_empty() && c.moved)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::split_simple;

    #[test]
    fn the_simple_split_bounds_tokens_and_logit_rows() {
        let all = vec![true; 10];
        assert_eq!(split_simple(&all, 4, 8), vec![0..4, 4..8, 8..10]);
        assert_eq!(split_simple(&all, 8, 3), vec![0..3, 3..6, 6..9, 9..10]);
        let last = (0..10).map(|i| i == 9).collect::<Vec<_>>();
        assert_eq!(split_simple(&last, 16, 1), vec![0..10]);
        assert!(split_simple(&[], 4, 4).is_empty());
    }
}
