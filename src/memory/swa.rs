//! The sliding-window pair (llama.cpp's iSWA cache): a full store for the global layers
//! and a rolling buffer of the window for the sliding-window layers. Every sequence
//! operation applies to both; the buffer evicts what no window can see again
//! ([`RollingWindow`]) and refuses what it cannot rebuild.

use super::MemoryShape;
use super::Reader;
use super::{describe, mib, Checkpoint, KvCache, KvLayer, Memory, StateLoad, StoreMap};
use super::{MemoryError, MemoryParams};
use crate::graph::{GraphInput, InputData, UbatchView};
use crate::kv::{CacheKind, KvCells, KvChoice, RollingWindow, SeqId, MAX_SEQ};
use std::sync::Arc;

pub struct SwaKvCache {
    full: KvCache,
    swa: KvCache,
    policy: RollingWindow,
}

impl SwaKvCache {
    /// The global layers over `n_ctx` cells, the sliding-window ones over a buffer sized
    /// for `-np` windows, the kept prefix and one ubatch of `n_ubatch` tokens.
    pub fn new(
        shape: &Arc<MemoryShape>,
        params: &MemoryParams,
        choice: KvChoice,
        window: u32,
        n_ubatch: u32,
    ) -> Result<SwaKvCache, MemoryError> {
        let hp = &**shape;
        let keep = params.swa_keep;
        let size = RollingWindow::capacity(window, keep, params.n_seq_max, n_ubatch, params.n_ctx);
        let (local, global): (Vec<usize>, Vec<usize>) =
            (0..hp.n_layer()).partition(|&il| hp.is_swa(il));
        let thold = params.defrag_thold;
        let full = KvCache::new(
            shape,
            choice,
            global,
            params.n_ctx as usize,
            CacheKind::Full,
            thold,
        )?;
        let swa = KvCache::new(shape, choice, local, size, CacheKind::Window, thold)?;
        log::info!(
            "context: {} cells, KV cache {:.1} MiB ({}): global layers {:.1} MiB over {} cells, sliding-window layers {:.1} MiB in a rolling buffer of {size} cells (window {window}, kept prefix {keep}); ubatch {n_ubatch}",
            params.n_ctx,
            mib(full.bytes() + swa.bytes()),
            describe(choice),
            mib(full.bytes()),
            params.n_ctx,
            mib(swa.bytes()),
        );
        Ok(SwaKvCache {
            full,
            swa,
            policy: RollingWindow::new(window, keep),
        })
    }

    fn both(&mut self) -> [&mut KvCells; 2] {
        [&mut self.full.cells, &mut self.swa.cells]
    }
}

/// The first position of each sequence in a ubatch (a token may be in several).
fn first_positions(pos: &[i32], seq: &[u64]) -> Vec<(SeqId, i32)> {
    let mut first: Vec<(SeqId, i32)> = Vec::new();
    for (&p, &set) in pos.iter().zip(seq) {
        for s in (0..MAX_SEQ).filter(|&s| set & (1u64 << s) != 0) {
            match first.iter_mut().find(|f| f.0 == s) {
                Some(f) => f.1 = f.1.min(p),
                None => first.push((s, p)),
            }
        }
    }
    first
}

impl Memory for SwaKvCache {
    fn cells(&self) -> &KvCells {
        &self.full.cells
    }
    fn choice(&self) -> KvChoice {
        self.full.choice
    }
    fn maps(&self) -> Vec<StoreMap> {
        vec![self.full.map(), self.swa.map()]
    }
    fn can_shift(&self) -> bool {
        true
    }
    fn can_resume(&self, seq: SeqId, p: i32) -> bool {
        (self.policy)
            .check(&self.swa.cells, &self.full.cells, seq, p)
            .is_ok()
    }
    fn clear(&mut self) {
        self.both().into_iter().for_each(|c| c.clear());
    }
    fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), MemoryError> {
        for c in self.both() {
            c.seq_rm(seq, p0, p1)?;
        }
        Ok(())
    }
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), MemoryError> {
        for c in self.both() {
            c.seq_cp(src, dst, p0, p1)?;
        }
        Ok(())
    }
    fn seq_keep(&mut self, seq: SeqId) -> Result<(), MemoryError> {
        for c in self.both() {
            c.seq_keep(seq)?;
        }
        Ok(())
    }
    fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), MemoryError> {
        for c in self.both() {
            c.seq_add(seq, p0, p1, delta)?;
        }
        Ok(())
    }
    /// Refused: dividing positions makes a window span more tokens than the buffer kept.
    fn seq_div(&mut self, _seq: SeqId, _p0: i32, _p1: i32, _d: i32) -> Result<(), MemoryError> {
        Err(MemoryError::SelfExtendNeedsSwaFull)
    }
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            kv: vec![self.full.cells.clone(), self.swa.cells.clone()],
            rs: None,
        }
    }
    fn rollback(&mut self, c: Checkpoint) {
        let mut taken = c.kv.into_iter();
        if let (Some(full), Some(swa)) = (taken.next(), taken.next()) {
            (self.full.cells, self.swa.cells) = (full, swa);
        }
    }
    fn place(&mut self, ub: &UbatchView) -> Result<(), MemoryError> {
        self.full.place_tokens(ub)?;
        let first = first_positions(ub.pos, ub.seq);
        let n = ub.tokens.len();
        (self.policy).prepare(&mut self.swa.cells, &self.full.cells, &first, n)?;
        self.swa.place_tokens(ub)
    }
    fn fill(&self, input: &GraphInput, ub: &UbatchView) -> Option<InputData> {
        let kind = match input {
            GraphInput::KvSlots(kind) => *kind,
            GraphInput::KqMask(mask) => mask.cache(),
            _ => return None,
        };
        match kind {
            CacheKind::Full => self.full.fill_kv(input, ub),
            CacheKind::Window => self.swa.fill_kv(input, ub),
        }
    }
    fn n_kv(&self, kind: CacheKind) -> u32 {
        match kind {
            CacheKind::Full => self.full.n_kv_padded(),
            CacheKind::Window => self.swa.n_kv_padded(),
        }
    }
    fn layer(&self, il: usize) -> Option<KvLayer<'_>> {
        self.full.layer_of(il).or_else(|| self.swa.layer_of(il))
    }
    /// Both stores shift; only the full one is compacted (the buffer is small and
    /// reuses its cells as it rolls).
    fn update(&mut self, defrag: bool) -> Result<(), MemoryError> {
        self.swa.apply_shifts()?;
        self.full.update(defrag)
    }
    fn defrag(&mut self) -> Result<usize, MemoryError> {
        self.full.defrag()
    }
    #[cfg(not(target_arch = "wasm32"))]
    fn state_write(&self, out: &mut Vec<u8>, seq: Option<SeqId>) -> Result<usize, MemoryError> {
        super::kv_state::write(out, &[&self.full, &self.swa], seq)
    }
    fn state_read(&mut self, r: &mut Reader, load: &StateLoad) -> Result<usize, MemoryError> {
        super::kv_state::read(
            r,
            &mut [
                &mut self.full as &mut dyn super::kv_state::KvStore,
                &mut self.swa,
            ],
            load,
        )
    }
}
