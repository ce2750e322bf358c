//! The hybrid memory (llama.cpp's `llama_memory_hybrid`): the attention layers' K/V in a
//! [`KvCache`], the recurrent layers' states in a [`RecurrentMemory`], and one set of
//! sequence operations applied to both, so that every front end sees one cache.
//!
//! A removal goes to the recurrent states first: they refuse what they cannot do (cutting
//! a state back from its end), and then the K/V cells are left as they were. Batches are
//! split as the recurrent memory needs (the equal split), which the K/V cache takes as
//! any other ubatch.

use super::recurrent::RecurrentMemory;
use super::MemoryError;
use super::Reader;
use super::{Checkpoint, KvCache, KvLayer, Memory, RsLayer, StateLoad, StoreMap};
use crate::graph::{GraphInput, InputData, UbatchView};
use crate::kv::{CacheKind, KvCells, KvChoice, SeqId};

pub struct HybridMemory {
    attn: KvCache,
    recr: RecurrentMemory,
}

impl HybridMemory {
    pub fn new(attn: KvCache, recr: RecurrentMemory) -> Self {
        HybridMemory { attn, recr }
    }
}

impl Memory for HybridMemory {
    fn cells(&self) -> &KvCells {
        &self.attn.cells
    }
    fn choice(&self) -> KvChoice {
        self.attn.choice
    }
    fn maps(&self) -> Vec<StoreMap> {
        vec![self.attn.map(), self.recr.map()]
    }
    fn can_shift(&self) -> bool {
        true
    }
    fn can_resume(&self, seq: SeqId, p: i32) -> bool {
        self.recr.can_resume(seq, p)
    }
    fn clear(&mut self) {
        self.attn.clear();
        self.recr.clear();
    }
    fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), MemoryError> {
        self.recr.seq_rm(seq, p0, p1)?;
        self.attn.seq_rm(seq, p0, p1)
    }
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), MemoryError> {
        self.recr.seq_cp(src, dst, p0, p1)?;
        self.attn.seq_cp(src, dst, p0, p1)
    }
    fn seq_keep(&mut self, seq: SeqId) -> Result<(), MemoryError> {
        self.recr.seq_keep(seq)?;
        self.attn.seq_keep(seq)
    }
    fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), MemoryError> {
        self.recr.seq_add(seq, p0, p1, delta)?;
        self.attn.seq_add(seq, p0, p1, delta)
    }
    fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), MemoryError> {
        self.recr.seq_div(seq, p0, p1, d)?;
        self.attn.seq_div(seq, p0, p1, d)
    }
    fn equal_split(&self) -> bool {
        true
    }
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            kv: vec![self.attn.cells.clone()],
            rs: Some(self.recr.cells.clone()),
        }
    }
    fn rollback(&mut self, c: Checkpoint) {
        if let Some(cells) = c.kv.into_iter().next() {
            self.attn.cells = cells;
        }
        if let Some(rs) = c.rs {
            self.recr.cells = rs;
        }
    }
    fn place(&mut self, ub: &UbatchView) -> Result<(), MemoryError> {
        self.recr.place(ub)?;
        self.attn.place(ub)
    }
    fn fill(&self, input: &GraphInput, ub: &UbatchView) -> Option<InputData> {
        match input {
            GraphInput::RsSrc | GraphInput::RsDst => self.recr.fill(input, ub),
            _ => self.attn.fill(input, ub),
        }
    }
    fn n_kv(&self, kind: CacheKind) -> u32 {
        self.attn.n_kv(kind)
    }
    fn layer(&self, il: usize) -> Option<KvLayer<'_>> {
        self.attn.layer(il)
    }
    fn rs_layer(&self, il: usize) -> Option<RsLayer<'_>> {
        self.recr.rs_layer(il)
    }
    fn n_rs(&self) -> u32 {
        self.recr.n_rs()
    }
    fn update(&mut self, defrag: bool) -> Result<(), MemoryError> {
        self.attn.update(defrag)
    }
    fn defrag(&mut self) -> Result<usize, MemoryError> {
        self.attn.defrag()
    }
    #[cfg(not(target_arch = "wasm32"))]
    fn state_write(&self, out: &mut Vec<u8>, seq: Option<SeqId>) -> Result<usize, MemoryError> {
        let n = self.attn.state_write(out, seq)?;
        self.recr.state_write(out, seq)?;
        Ok(n)
    }
    /// The K/V part loads first; if the states after it are refused, the whole memory is
    /// cleared (the K/V rows it replaced are gone), never left half loaded.
    fn state_read(&mut self, r: &mut Reader, load: &StateLoad) -> Result<usize, MemoryError> {
        let attn_load = StateLoad {
            more: true,
            ..*load
        };
        let n = self.attn.state_read(r, &attn_load)?;
        if let Err(e) = self.recr.state_read(r, load) {
            self.clear();
            return Err(e);
        }
        Ok(n)
    }
}
