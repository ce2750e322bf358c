//! The recurrent memory (llama.cpp's `llama_memory_recurrent`): one state per sequence
//! for each recurrent layer, in GPU buffers of one row per cell, with the cells on the
//! host ([`RsCells`]).
//!
//! Each recurrent layer has a conv state buffer (the last inputs of its short
//! convolution) and, for Mamba and Mamba-2, an SSM state buffer, `[state values, cells +
//! 1]` f32 each: the extra row stays zero, for sequences that start from nothing. A
//! ubatch's graph gathers each sequence's state from the row its cell says ([`RsSlot`]'s
//! `src`), computes, and stores the new state to its cell's row (`dst`): gathering first
//! lets a state that two sequences shared be read by one while the other overwrites it.

use super::MemoryError;
use super::MemoryShape;
use super::Reader;
use super::{Checkpoint, KvLayer, Memory, RsLayer, StateLoad, StoreMap};
use crate::graph::{GraphInput, InputData, UbatchView};
use crate::kv::{CacheKind, KvCells, KvChoice, KvType, RsCells, RsSlot, SeqId};
use crate::ops::View;
use std::sync::Arc;

mod state;

/// One recurrent layer's state buffers.
struct LayerStates {
    conv: View,
    ssm: Option<View>,
}

pub struct RecurrentMemory {
    pub(super) shape: Arc<MemoryShape>,
    pub(super) cells: RsCells,
    /// Per model layer: its states, if the layer is recurrent.
    layers: Vec<Option<LayerStates>>,
    /// Where each sequence set of the last ubatch placed reads and writes its state.
    slots: Vec<RsSlot>,
}

impl RecurrentMemory {
    /// States for `n_seq_max` sequences in every recurrent layer of the model.
    pub fn new(shape: &Arc<MemoryShape>, n_seq_max: u32) -> Result<Self, MemoryError> {
        let hp = &**shape;
        let cells = RsCells::new(n_seq_max);
        let rows = cells.size() as u64 + 1;
        let (r, s) = (hp.n_embd_r as u64, hp.n_embd_s as u64);
        let recurrent: Vec<usize> = (0..hp.n_layer())
            .filter(|&il| hp.is_recurrent(il))
            .collect();
        let max_binding = shape.max_binding_of(&recurrent);
        for (what, n) in [("conv", r), ("SSM", s)] {
            if n * rows * 4 > max_binding {
                return Err(MemoryError::TooLarge(format!(
                    "-np {n_seq_max}: one layer's recurrent {what} states would be {} MiB, over this adapter's storage binding limit of {} MiB; use fewer sequences",
                    (n * rows * 4) >> 20,
                    max_binding >> 20
                )));
            }
        }
        let mut layers = Vec::new();
        for il in 0..hp.n_layer() {
            if !hp.is_recurrent(il) {
                layers.push(None);
                continue;
            }
            // Zeroed at creation: the last row is the zero state.
            let gpu = shape.gpu_of(il);
            let conv = View::whole(&gpu.storage(&format!("rs_conv{il}"), r * rows * 4)?);
            let ssm = if s > 0 {
                Some(View::whole(
                    &gpu.storage(&format!("rs_ssm{il}"), s * rows * 4)?,
                ))
            } else {
                None
            };
            layers.push(Some(LayerStates { conv, ssm }));
        }
        let mem = RecurrentMemory {
            shape: shape.clone(),
            cells,
            layers,
            slots: Vec::new(),
        };
        log::info!(
            "recurrent states: {} cells, {:.1} MiB",
            mem.cells.size(),
            mem.bytes() as f64 / (1 << 20) as f64
        );
        Ok(mem)
    }

    /// State bytes over every layer and cell.
    pub fn bytes(&self) -> u64 {
        self.layer_bytes() * self.layers.iter().flatten().count() as u64
    }

    /// State bytes of one recurrent layer over every cell.
    fn layer_bytes(&self) -> u64 {
        4 * (self.shape.n_embd_r + self.shape.n_embd_s) as u64 * self.cells.size() as u64
    }

    pub(super) fn map(&self) -> StoreMap {
        let recurrent =
            (self.layers.iter().enumerate()).filter_map(|(il, l)| l.as_ref().map(|_| il));
        let by_device = self.shape.bytes_by_device(recurrent, self.layer_bytes());
        let mut m = StoreMap::of("recurrent states", self.cells.as_kv(), by_device);
        m.n_kv = self.cells.size();
        m.sources = (0..self.cells.size()).map(|i| self.cells.src(i)).collect();
        m.tails = (0..self.cells.size() as SeqId)
            .filter_map(|s| Some((s, self.cells.tail(s)?)))
            .collect();
        m
    }

    /// Stores a ubatch's sequence sets (each a run of equally many tokens: the equal
    /// split) and keeps where their states go.
    pub(super) fn place_sets(&mut self, ub: &UbatchView) -> Result<(), MemoryError> {
        let sets = sequence_sets(ub.seq, ub.pos)?;
        self.slots = self.cells.place(&sets)?;
        Ok(())
    }

    /// The state rows of the last ubatch's sets (the zero row for a new sequence).
    pub(super) fn fill_rs(&self, input: &GraphInput) -> Option<InputData> {
        let zero = self.cells.size() as u32;
        Some(InputData::U32(match input {
            GraphInput::RsSrc => (self.slots.iter())
                .map(|s| s.src.map_or(zero, |c| c as u32))
                .collect(),
            GraphInput::RsDst => self.slots.iter().map(|s| s.dst as u32).collect(),
            _ => return None,
        }))
    }

    pub(super) fn rs_layer_of(&self, il: usize) -> Option<RsLayer<'_>> {
        let l = self.layers.get(il)?.as_ref()?;
        Some(RsLayer {
            conv: &l.conv,
            ssm: l.ssm.as_ref(),
            rows: self.cells.size() as u32 + 1,
        })
    }

    pub(super) fn n_sets(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Whether `seq` can go on from `p`: a state holds only its end, so from there, or
    /// from nothing.
    pub(super) fn resumable(&self, seq: SeqId, p: i32) -> bool {
        p == 0 || self.cells.as_kv().seq_pos_max(seq) + 1 == p
    }

    /// Every state buffer (conv then SSM, layer by layer) with its row bytes: the order
    /// of a state file's rows.
    /// Each recurrent layer's state buffers with their row bytes and the layer (whose
    /// device holds them).
    pub(super) fn state_buffers(&self) -> Vec<(View, u64, usize)> {
        let hp = &*self.shape;
        let (r, s) = (4 * hp.n_embd_r as u64, 4 * hp.n_embd_s as u64);
        let mut out = Vec::new();
        for (il, l) in self.layers.iter().enumerate() {
            let Some(l) = l else { continue };
            out.push((l.conv.clone(), r, il));
            if let Some(ssm) = &l.ssm {
                out.push((ssm.clone(), s, il));
            }
        }
        out
    }

    pub(super) fn rs_checkpoint(&self) -> RsCells {
        self.cells.clone()
    }
}

/// The sequence sets of an equally split ubatch: (set, last position) per run of tokens
/// with one set, each run as long as the first.
pub(super) fn sequence_sets(seq: &[u64], pos: &[i32]) -> Result<Vec<(u64, i32)>, MemoryError> {
    let mut sets: Vec<(u64, i32)> = Vec::new();
    let mut run = 0;
    let mut n_t = None;
    for (i, &s) in seq.iter().enumerate() {
        if i > 0 && s != seq[i - 1] {
            if *n_t.get_or_insert(run) != run {
                return Err(unequal());
            }
            run = 0;
        }
        if run == 0 {
            sets.push((s, pos[i]));
        }
        sets.last_mut().expect("pushed").1 = pos[i];
        run += 1;
    }
    if n_t.is_some_and(|n| n != run) {
        return Err(unequal());
    }
    Ok(sets)
}

fn unequal() -> MemoryError {
    MemoryError::BadBatch(
        "a recurrent memory takes ubatches of equally many tokens per sequence (its equal split)"
            .into(),
    )
}

/// llama.cpp's equal split: each ubatch takes some sequence sets (tokens that belong to
/// the same sequences) and the same number of tokens from each, at most `n_ubatch` tokens
/// and `n_out_max` logit rows in all. A token of several sequences makes them one set;
/// then their other tokens must belong to that same set.
pub fn split_equal(
    seq: &[u64],
    logits: &[bool],
    n_ubatch: usize,
    n_out_max: usize,
) -> Result<Vec<Vec<usize>>, MemoryError> {
    let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, &s) in seq.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| *g & s != 0) {
            Some((g, idx)) if *g == s => idx.push(i),
            Some((g, _)) => {
                return Err(MemoryError::BadBatch(format!(
                    "a recurrent model's batch has tokens of sequence set {g:#x} and of {s:#x}, which overlap: a state is shared by whole sequences, so a token given to several sequences must have all their tokens in this batch"
                )))
            }
            None => groups.push((s, vec![i])),
        }
    }
    let mut next = vec![0usize; groups.len()];
    let mut out = Vec::new();
    loop {
        let mut take: Vec<usize> = (0..groups.len())
            .filter(|&g| next[g] < groups[g].1.len())
            .take(n_ubatch.max(1))
            .collect();
        if take.is_empty() {
            break;
        }
        let left = |g: usize| groups[g].1.len() - next[g];
        let mut n_t = take.iter().map(|&g| left(g)).min().unwrap_or(1);
        n_t = n_t.min(n_ubatch.max(1) / take.len()).max(1);
        loop {
            let outs: usize = (take.iter())
                .map(|&g| {
                    let idx = &groups[g].1[next[g]..next[g] + n_t];
                    idx.iter().filter(|&&i| logits[i]).count()
                })
                .sum();
            if outs <= n_out_max.max(1) {
                break;
            }
            if n_t > 1 {
                n_t -= 1;
            } else {
                take.pop();
            }
        }
        let mut ub = Vec::with_capacity(n_t * take.len());
        for &g in &take {
            ub.extend_from_slice(&groups[g].1[next[g]..next[g] + n_t]);
            next[g] += n_t;
        }
        out.push(ub);
    }
    Ok(out)
}

impl Memory for RecurrentMemory {
    fn cells(&self) -> &KvCells {
        self.cells.as_kv()
    }
    fn choice(&self) -> KvChoice {
        no_kv_choice()
    }
    fn maps(&self) -> Vec<StoreMap> {
        vec![self.map()]
    }
    fn can_shift(&self) -> bool {
        true
    }
    fn can_resume(&self, seq: SeqId, p: i32) -> bool {
        self.resumable(seq, p)
    }
    fn clear(&mut self) {
        self.cells.clear();
    }
    fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), MemoryError> {
        Ok(self.cells.seq_rm(seq, p0, p1)?)
    }
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, _p0: i32, _p1: i32) -> Result<(), MemoryError> {
        Ok(self.cells.seq_cp(src, dst)?)
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
    fn equal_split(&self) -> bool {
        true
    }
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            kv: Vec::new(),
            rs: Some(self.rs_checkpoint()),
        }
    }
    fn rollback(&mut self, c: Checkpoint) {
        if let Some(rs) = c.rs {
            self.cells = rs;
        }
    }
    fn place(&mut self, ub: &UbatchView) -> Result<(), MemoryError> {
        self.place_sets(ub)
    }
    fn fill(&self, input: &GraphInput, _ub: &UbatchView) -> Option<InputData> {
        self.fill_rs(input)
    }
    fn n_kv(&self, _kind: CacheKind) -> u32 {
        0
    }
    fn layer(&self, _il: usize) -> Option<KvLayer<'_>> {
        None
    }
    fn rs_layer(&self, il: usize) -> Option<RsLayer<'_>> {
        self.rs_layer_of(il)
    }
    fn n_rs(&self) -> u32 {
        self.n_sets()
    }
    fn bounded(&self) -> bool {
        false
    }
    fn update(&mut self, _defrag: bool) -> Result<(), MemoryError> {
        Ok(())
    }
    fn defrag(&mut self) -> Result<usize, MemoryError> {
        Ok(0)
    }
    #[cfg(not(target_arch = "wasm32"))]
    fn state_write(&self, out: &mut Vec<u8>, seq: Option<SeqId>) -> Result<usize, MemoryError> {
        state::write(out, self, seq)
    }
    fn state_read(&mut self, r: &mut Reader, load: &StateLoad) -> Result<usize, MemoryError> {
        state::read(r, self, load)
    }
}

/// What a memory without a K/V cache reports as its cache types.
fn no_kv_choice() -> KvChoice {
    KvChoice {
        type_k: KvType::F32,
        type_v: KvType::F32,
        flash: false,
        rot_k: 0,
        rot_v: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_equal_split_takes_as_many_tokens_from_each_set() {
        // Sequence 0 a prompt of 5, sequences 1 and 2 one token each.
        let seq = [1, 1, 1, 1, 1, 2, 4];
        let logits = [false, false, false, false, true, true, true];
        let ubs = split_equal(&seq, &logits, 8, 8).unwrap();
        assert_eq!(ubs, vec![vec![0, 5, 6], vec![1, 2, 3, 4]]);
        // One sequence: runs of the ubatch size.
        let ubs = split_equal(&[1; 5], &[true; 5], 2, 8).unwrap();
        assert_eq!(ubs, vec![vec![0, 1], vec![2, 3], vec![4]]);
        // Logit rows bound the tokens per set.
        let ubs = split_equal(&[1, 1, 2, 2], &[true; 4], 4, 2).unwrap();
        assert_eq!(ubs, vec![vec![0, 2], vec![1, 3]]);
        // A token of sequences 0 and 1, then one of 0 alone: refused.
        assert!(split_equal(&[3, 1], &[true; 2], 4, 4).is_err());
        let sets = sequence_sets(&[1, 1, 2, 2], &[4, 5, 0, 1]).unwrap();
        assert_eq!(sets, vec![(1, 5), (2, 1)]);
        assert!(sequence_sets(&[1, 1, 2], &[0, 1, 0]).is_err());
    }
}
