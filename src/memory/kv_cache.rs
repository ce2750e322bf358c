//! One K/V store: its cells on the host, and the K and V rows of the layers it holds in
//! GPU buffers (one per layer each, `[row bytes, cells]`, bound whole by attention).

use super::MemoryError;
use super::MemoryShape;
use super::Reader;
use super::{Checkpoint, KvLayer, Memory, StateLoad, StoreMap};
use crate::graph::{CacheState, GraphInput, InputData, UbatchView};
use crate::kv::{CacheKind, KvCells, KvChoice, KvType, SeqId, N_KV_PAD};
use crate::ops::View;
use std::sync::Arc;

pub struct KvCache {
    pub(super) shape: Arc<MemoryShape>,
    pub(super) cells: KvCells,
    /// The store this is: its display name and the slots/mask inputs it fills.
    pub(super) kind: CacheKind,
    /// The model layer of each K/V pair held, and the pair of each model layer.
    pub(super) layers: Vec<usize>,
    index: Vec<Option<usize>>,
    pub(super) k: Vec<View>,
    pub(super) v: Vec<View>,
    pub(super) choice: KvChoice,
    /// The cells of the last ubatch placed, one per token.
    slots: Vec<usize>,
    defrag_thold: f32,
}

impl KvCache {
    /// A store of `n_cells` cells for the model layers `layers`, holding `choice`'s types.
    pub fn new(
        shape: &Arc<MemoryShape>,
        choice: KvChoice,
        layers: Vec<usize>,
        n_cells: usize,
        kind: CacheKind,
        defrag_thold: f32,
    ) -> Result<KvCache, MemoryError> {
        let n_embd = shape.n_embd_kv() as u64;
        let max_binding = shape.max_binding_of(&layers);
        let (row_k, row_v) = (
            choice.type_k.row_bytes(n_embd),
            choice.type_v.row_bytes(n_embd),
        );
        let row = row_k.max(row_v);
        if !layers.is_empty() && row * n_cells as u64 > max_binding {
            let max_ctx = max_binding / row;
            return Err(MemoryError::TooLarge(format!(
                "-c {n_cells}: one layer's K or V cache would be {} MiB, over this adapter's storage binding limit of {} MiB; use -c {max_ctx} or less (or a smaller cache type, -ctk/-ctv)",
                (row * n_cells as u64) >> 20,
                max_binding >> 20
            )));
        }
        let mut index = vec![None; shape.n_layer()];
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (i, &il) in layers.iter().enumerate() {
            index[il] = Some(i);
            let gpu = shape.gpu_of(il);
            k.push(View::whole(
                &gpu.storage(&format!("k_cache{il}"), row_k * n_cells as u64)?,
            ));
            v.push(View::whole(
                &gpu.storage(&format!("v_cache{il}"), row_v * n_cells as u64)?,
            ));
        }
        Ok(KvCache {
            shape: shape.clone(),
            cells: KvCells::new(n_cells),
            kind,
            layers,
            index,
            k,
            v,
            choice,
            slots: Vec::new(),
            defrag_thold,
        })
    }

    /// Bytes of one cell's row in one layer, for a cache of type `ty` (K or V).
    pub(super) fn row_bytes(&self, ty: KvType) -> u64 {
        ty.row_bytes(self.shape.n_embd_kv() as u64)
    }

    /// K and V bytes over all the layers held.
    pub fn bytes(&self) -> u64 {
        self.layer_bytes() * self.layers.len() as u64
    }

    /// K and V bytes of one layer held.
    fn layer_bytes(&self) -> u64 {
        let per_cell = self.row_bytes(self.choice.type_k) + self.row_bytes(self.choice.type_v);
        per_cell * self.cells.size() as u64
    }

    /// The K and V views of every layer held, K then V per layer, with their types.
    pub(super) fn tensors(&self) -> Vec<(&View, KvType)> {
        (self.layer_tensors().into_iter())
            .map(|(_, t, ty)| (t, ty))
            .collect()
    }

    /// [`KvCache::tensors`] with the model layer of each (its device holds it).
    pub(super) fn layer_tensors(&self) -> Vec<(usize, &View, KvType)> {
        let (tk, tv) = (self.choice.type_k, self.choice.type_v);
        (self.layers.iter().zip(self.k.iter().zip(&self.v)))
            .flat_map(|(&il, (k, v))| [(il, k, tk), (il, v, tv)])
            .collect()
    }

    pub(super) fn map(&self) -> StoreMap {
        let name = match self.kind {
            CacheKind::Full => "full cache",
            CacheKind::Window => "sliding-window buffer",
        };
        let by_device =
            (self.shape).bytes_by_device(self.layers.iter().copied(), self.layer_bytes());
        StoreMap::of(name, &self.cells, by_device)
    }

    pub(super) fn n_kv_padded(&self) -> u32 {
        self.cells.n_kv(N_KV_PAD) as u32
    }

    /// Stores a ubatch in free cells and keeps them as the slots its rows go to.
    pub(super) fn place_tokens(&mut self, ub: &UbatchView) -> Result<(), MemoryError> {
        let slots = self.cells.find_slot(ub.tokens.len())?;
        self.cells.store(&slots, ub.pos, ub.seq)?;
        if !ub.mrope.is_empty() {
            let next: Vec<i32> = ub.mrope.iter().map(|m| m.next).collect();
            self.cells.set_rope_next(&slots, &next);
        }
        self.slots = slots;
        Ok(())
    }

    /// The slot and mask inputs over this store's cells (any kind: a lone store serves
    /// the sliding-window layers' inputs too).
    pub(super) fn fill_kv(&self, input: &GraphInput, ub: &UbatchView) -> Option<InputData> {
        let state = CacheState {
            cells: &self.cells,
            slots: &self.slots,
            n_kv: self.n_kv_padded() as usize,
        };
        state.fill(input, ub)
    }

    pub(super) fn layer_of(&self, il: usize) -> Option<KvLayer<'_>> {
        let i = (*self.index.get(il)?)?;
        Some(KvLayer {
            k: &self.k[i],
            v: &self.v[i],
            store: self.kind,
        })
    }

    /// Re-rotates the keys of cells a sequence operation moved, if any.
    pub(super) fn apply_shifts(&mut self) -> Result<(), MemoryError> {
        if let Some(deltas) = self.cells.take_shifts() {
            self.shift_keys(&deltas)?;
        }
        Ok(())
    }
}

impl Memory for KvCache {
    fn cells(&self) -> &KvCells {
        &self.cells
    }
    fn choice(&self) -> KvChoice {
        self.choice
    }
    fn maps(&self) -> Vec<StoreMap> {
        vec![self.map()]
    }
    fn can_shift(&self) -> bool {
        true
    }
    fn can_resume(&self, _seq: SeqId, _p: i32) -> bool {
        true
    }
    fn clear(&mut self) {
        self.cells.clear();
    }
    fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), MemoryError> {
        Ok(self.cells.seq_rm(seq, p0, p1)?)
    }
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), MemoryError> {
        Ok(self.cells.seq_cp(src, dst, p0, p1)?)
    }
    fn seq_keep(&mut self, seq: SeqId) -> Result<(), MemoryError> {
        Ok(self.cells.seq_keep(seq)?)
    }
    fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), MemoryError> {
        Ok(self.cells.seq_add(seq, p0, p1, delta)?)
    }
    fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), MemoryError> {
        Ok(self.cells.seq_div(seq, p0, p1, d)?)
    }
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            kv: vec![self.cells.clone()],
            rs: None,
        }
    }
    fn rollback(&mut self, c: Checkpoint) {
        if let Some(cells) = c.kv.into_iter().next() {
            self.cells = cells;
        }
    }
    fn place(&mut self, ub: &UbatchView) -> Result<(), MemoryError> {
        self.place_tokens(ub)
    }
    fn fill(&self, input: &GraphInput, ub: &UbatchView) -> Option<InputData> {
        self.fill_kv(input, ub)
    }
    fn n_kv(&self, _kind: CacheKind) -> u32 {
        self.n_kv_padded()
    }
    fn layer(&self, il: usize) -> Option<KvLayer<'_>> {
        self.layer_of(il)
    }
    fn update(&mut self, defrag: bool) -> Result<(), MemoryError> {
        self.apply_shifts()?;
        if defrag && self.defrag_thold > 0.0 && self.cells.fragmentation() > self.defrag_thold {
            let moved = self.compact()?;
            log::debug!("defragmented the KV cache: {moved} cells moved");
        }
        Ok(())
    }
    fn defrag(&mut self) -> Result<usize, MemoryError> {
        self.compact()
    }
    #[cfg(not(target_arch = "wasm32"))]
    fn state_write(&self, out: &mut Vec<u8>, seq: Option<SeqId>) -> Result<usize, MemoryError> {
        super::kv_state::write(out, &[self], seq)
    }
    fn state_read(&mut self, r: &mut Reader, load: &StateLoad) -> Result<usize, MemoryError> {
        super::kv_state::read(r, &mut [self as &mut dyn super::kv_state::KvStore], load)
    }
}
