//! A picture of the KV cache for displays (the desktop app's cell map, a server's
//! status page): each store's cells with their positions and sequences, the `n_kv`
//! bound the next decode reads up to, and the memory the store holds. Host data only:
//! taking one copies the cell metadata, never K or V.

use super::Engine;
pub use crate::memory::StoreMap;

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
        CacheMap {
            stores: ctx.memory().maps(),
            n_seq: ctx.params.n_seq_max,
            types: ctx.kv_choice(),
        }
    }
}
