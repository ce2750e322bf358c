//! What the memory knows of a model: its layers' kinds and row sizes, and the device.
//! The model describes itself (`model::Model::memory_shape`); the stores are sized and
//! shifted from this alone, so the memory sits below the model.

use crate::gpu::{Gpu, Placement};
use crate::ops::rope::RopeParams;
use std::sync::Arc;

/// One layer as the memory sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LayerMemory {
    /// A layer that attends: its keys' RoPE (the K-shift rotates with it), and whether
    /// it sees a sliding window (its rows then live in the rolling buffer).
    Attention { rope: RopeParams, swa: bool },
    /// A layer that keeps a recurrent state.
    Recurrent,
}

/// A model's shape for its memory.
#[derive(Clone)]
pub struct MemoryShape {
    /// The main device (what the cache types and attention kernels are chosen for).
    pub gpu: Arc<Gpu>,
    /// Each layer's device: its rows live there.
    pub placement: Arc<Placement>,
    /// Each layer, in order.
    pub layers: Vec<LayerMemory>,
    /// An attention layer's K (and V) row: `n_head_kv` heads of `head_dim`.
    pub n_head_kv: u32,
    pub head_dim: u32,
    /// A recurrent layer's state per sequence: convolution values (llama.cpp's
    /// n_embd_r) and scan values (n_embd_s), f32 each.
    pub n_embd_r: u32,
    pub n_embd_s: u32,
    /// The sliding window of the sliding-window layers, if the model has any.
    pub swa_window: Option<u32>,
}

impl MemoryShape {
    /// The device layer `il`'s rows live on.
    pub fn gpu_of(&self, il: usize) -> &Arc<Gpu> {
        self.placement.layer(il)
    }

    /// Bytes on each device (in the placement's order) of a store holding `per_layer`
    /// bytes for each of `layers`: what a display shows as each device's part.
    pub fn bytes_by_device(
        &self,
        layers: impl IntoIterator<Item = usize>,
        per_layer: u64,
    ) -> Vec<u64> {
        let mut out = vec![0; self.placement.gpus().len()];
        for il in layers {
            out[self.placement.layer_device(il)] += per_layer;
        }
        out
    }

    /// The smallest storage binding of the devices holding `layers`.
    pub fn max_binding_of(&self, layers: &[usize]) -> u64 {
        (layers.iter())
            .map(|&il| self.gpu_of(il).max_binding)
            .min()
            .unwrap_or(self.gpu.max_binding)
    }

    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    pub fn n_embd_kv(&self) -> u32 {
        self.n_head_kv * self.head_dim
    }

    pub fn is_recurrent(&self, il: usize) -> bool {
        self.layers.get(il) == Some(&LayerMemory::Recurrent)
    }

    pub fn has_recurrent(&self) -> bool {
        (0..self.n_layer()).any(|il| self.is_recurrent(il))
    }

    pub fn has_attention(&self) -> bool {
        (0..self.n_layer()).any(|il| !self.is_recurrent(il))
    }

    pub fn is_swa(&self, il: usize) -> bool {
        matches!(
            self.layers.get(il),
            Some(LayerMemory::Attention { swa: true, .. })
        )
    }

    /// The RoPE of layer `il`'s keys; None for a recurrent layer.
    pub fn layer_rope(&self, il: usize) -> Option<RopeParams> {
        match self.layers.get(il)? {
            LayerMemory::Attention { rope, .. } => Some(*rope),
            LayerMemory::Recurrent => None,
        }
    }
}
