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
    /// The devices the model runs on, in the placement's order (one for a model on one
    /// device): each store's `device_bytes` indexes this list.
    pub devices: Vec<DevicePart>,
}

/// One device's part of a model split by layers (`--device A,B -sm layer`).
#[derive(Clone, Debug, PartialEq)]
pub struct DevicePart {
    /// The adapter's name and backend, as `wgllm devices` lists them.
    pub name: String,
    pub backend: String,
    /// Whether it holds the embeddings, the output head and GPU sampling (`-mg`).
    pub main: bool,
    /// Its layers, as (first, count) runs.
    pub layers: Vec<(usize, usize)>,
    /// Bytes of every buffer made on it so far: weights, cache and step buffers.
    pub allocated: u64,
}

impl DevicePart {
    /// "0-14" or "0-3,8-11" (empty: "none").
    pub fn layers_text(&self) -> String {
        if self.layers.is_empty() {
            return "none".into();
        }
        crate::gpu::runs_text(&self.layers)
    }
}

impl CacheMap {
    /// The cache bytes device `d` holds over every store.
    pub fn device_cache_bytes(&self, d: usize) -> u64 {
        (self.stores.iter())
            .filter_map(|s| s.device_bytes.get(d))
            .sum()
    }
}

impl Engine {
    /// The current cells of every store (see [`CacheMap`]).
    pub fn cache_map(&self) -> CacheMap {
        let ctx = self.context();
        CacheMap {
            stores: ctx.memory().maps(),
            n_seq: ctx.params.n_seq_max,
            types: ctx.kv_choice(),
            devices: self.device_parts(),
        }
    }

    /// Each device of the model's placement with its layers (see [`DevicePart`]).
    pub fn device_parts(&self) -> Vec<DevicePart> {
        let p = &self.model.placement;
        (p.gpus().iter().enumerate())
            .map(|(d, g)| DevicePart {
                name: g.info.name.clone(),
                backend: g.info.backend.clone(),
                main: d == p.main_index(),
                layers: p.layer_runs(d),
                allocated: g.allocated_bytes(),
            })
            .collect()
    }
}
