//! A picture of the KV cache for displays (the desktop app's cell map, a server's
//! status page): each store's cells with their positions and sequences, the `n_kv`
//! bound the next decode reads up to, and the memory the store holds. Host data only:
//! taking one copies the cell metadata, never K or V.

use super::Engine;
use crate::kv::{CacheKind, Cell, KvCells, N_KV_PAD};

/// One K/V store as a display sees it.
#[derive(Clone, Debug)]
pub struct StoreMap {
    /// "full cache" or "sliding-window buffer".
    pub name: &'static str,
    pub cells: Vec<Cell>,
    /// Cells the next decode's attention reads (the used bound padded as llama.cpp pads
    /// it), so a display can draw where the work stops.
    pub n_kv: usize,
    pub used: usize,
    /// K and V bytes of this store over all the layers that use it.
    pub bytes: u64,
}

impl StoreMap {
    fn of(name: &'static str, cells: &KvCells, bytes: u64) -> Self {
        StoreMap {
            name,
            cells: cells.cells().to_vec(),
            n_kv: cells.n_kv(N_KV_PAD),
            used: cells.used(),
            bytes,
        }
    }

    /// Cells a context shift or Self-Extend moved to a new position.
    pub fn moved(&self) -> usize {
        self.cells
            .iter()
            .filter(|c| !c.is_empty() && c.moved)
            .count()
    }
}

/// Every store of the engine's cache: the full one first, then the rolling buffer of
/// the sliding-window layers where the model has one.
#[derive(Clone, Debug)]
pub struct CacheMap {
    pub stores: Vec<StoreMap>,
    /// Sequences the cache serves (`-np`).
    pub n_seq: u32,
    /// What K and V hold, and whether attention is flash attention (`-ctk/-ctv/-fa`).
    pub types: crate::kv::KvChoice,
}

impl Engine {
    /// The current cells of every store (see [`CacheMap`]).
    pub fn cache_map(&self) -> CacheMap {
        let ctx = self.context();
        let mut stores = vec![StoreMap::of(
            "full cache",
            ctx.cells(),
            ctx.kv_bytes(CacheKind::Full),
        )];
        if let Some(w) = ctx.window_cells() {
            stores.push(StoreMap::of(
                "sliding-window buffer",
                &w.cells,
                ctx.kv_bytes(CacheKind::Window),
            ));
        }
        CacheMap {
            stores,
            n_seq: ctx.params.n_seq_max,
            types: ctx.kv_choice(),
        }
    }
}
