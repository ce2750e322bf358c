//! The cells of a recurrent memory (Mamba, Mamba-2, LFM2's convolution layers), as
//! llama.cpp's `llama_memory_recurrent` keeps them.
//!
//! A cell holds a sequence's whole state, not one token: its `pos` is the position of the
//! last token folded into the state and its sequence set says which sequences are at that
//! state. Sequences share a cell after `seq_cp` (or a token given to several sequences)
//! until one of them moves on: then it takes an empty cell whose state starts from the
//! shared one (`src`), copy on write. Per sequence, `tail` is the cell holding its latest
//! state. A state cannot be cut back from its end: it holds no earlier positions.
//!
//! One difference from llama.cpp, by design: llama.cpp keeps a ubatch's cells contiguous
//! (swapping cells and deferring the state copies that follows), because its graph views
//! one range of rows; here the graph gathers each sequence's state by its cell index and
//! stores it back by index, so cells never move. Which sequences share which states, the
//! positions and what is refused are the same.

use super::cells::{seq_ids, Cell, KvCells, KvError, SeqId};

/// Where one sequence set of a ubatch reads its state from and writes it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RsSlot {
    /// The cell whose state this ubatch starts from; None: a new sequence (zeros).
    pub src: Option<usize>,
    /// The cell the state ends in.
    pub dst: usize,
}

#[derive(Clone, Debug)]
pub struct RsCells {
    /// Position (of the last token folded in) and sequence set of each cell.
    cells: KvCells,
    /// Per cell: the cell its state was last carried on from (itself, or the shared
    /// state it was copied from; None: it started from zeros). For displays.
    src: Vec<Option<usize>>,
    /// Per sequence id: the cell holding the sequence's latest state.
    tail: Vec<Option<usize>>,
    head: usize,
}

/// Why a sequence operation on a recurrent memory is refused.
pub const PARTIAL_RM: &str =
    "a recurrent state holds only the end of its sequence, so positions cannot be removed from its end while earlier ones stay (llama.cpp refuses it too); remove the whole sequence and decode it again";

impl RsCells {
    /// One cell per sequence, as llama.cpp sizes it.
    pub fn new(n_seq_max: u32) -> Self {
        let n = n_seq_max.max(1) as usize;
        RsCells {
            cells: KvCells::new(n),
            src: vec![None; n],
            tail: vec![None; n],
            head: 0,
        }
    }

    /// The cells as a [`KvCells`]: one per state, its position the state's last one.
    pub fn as_kv(&self) -> &KvCells {
        &self.cells
    }
    pub fn size(&self) -> usize {
        self.cells.size()
    }
    pub fn used(&self) -> usize {
        self.cells.used()
    }
    /// The cell holding sequence `seq`'s latest state.
    pub fn tail(&self, seq: SeqId) -> Option<usize> {
        self.tail.get(seq as usize).copied().flatten()
    }
    /// The cell cell `i`'s state was last carried on from.
    pub fn src(&self, i: usize) -> Option<usize> {
        self.src[i]
    }
    pub fn cell(&self, i: usize) -> Cell {
        self.cells.cells()[i]
    }

    pub fn clear(&mut self) {
        self.cells.clear();
        self.src.fill(None);
        self.tail.fill(None);
        self.head = 0;
    }

    /// Cell `i` with a new position and sequence set (empty: freed).
    fn set(&mut self, i: usize, pos: i32, seq: u64) {
        let cell = Cell {
            pos: if seq == 0 { -1 } else { pos },
            seq,
            ..Default::default()
        };
        self.cells.set_cell(i, cell);
        if seq == 0 {
            self.src[i] = None;
        }
    }

    /// Takes `seq` out of cell `i`, freeing it when no sequence is left.
    fn drop_seq(&mut self, i: usize, seq: SeqId) {
        let c = self.cell(i);
        self.set(i, c.pos, c.seq & !(1u64 << seq));
    }

    /// Removes `seq` (None: every sequence) from [p0, p1) (negative: open). A state whose
    /// end lies in the range goes whole; one whose end lies after a range that starts
    /// inside it cannot be cut back (see [`PARTIAL_RM`]).
    pub fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), KvError> {
        let p0 = p0.max(0);
        let p1 = if p1 < 0 { i32::MAX } else { p1 };
        match seq {
            Some(s) => {
                KvCells::seq_bit(s)?;
                if let Some(t) = self.tail(s) {
                    let pos = self.cell(t).pos;
                    if 0 < p0 && p0 <= pos && p1 > pos {
                        return Err(KvError::BadStore(PARTIAL_RM.into()));
                    }
                    if p0 <= pos && pos < p1 {
                        self.tail[s as usize] = None;
                    }
                }
            }
            None => {
                if p0 != p1 && (p0 != 0 || p1 != i32::MAX) {
                    return Err(KvError::BadStore(
                        "removing a range of positions from every sequence of a recurrent memory: only all positions (or none) can be removed".into(),
                    ));
                }
            }
        }
        for i in 0..self.size() {
            let c = self.cell(i);
            if c.is_empty() || c.pos < p0 || c.pos >= p1 {
                continue;
            }
            match seq {
                None => self.set(i, c.pos, 0),
                Some(s) if c.has_seq(s) => self.drop_seq(i, s),
                Some(_) => {}
            }
        }
        if seq.is_none() && p0 == 0 && p1 == i32::MAX {
            self.tail.fill(None);
        }
        self.cells.settle();
        Ok(())
    }

    /// Makes `dst` share `src`'s state (whatever the range: a state is whole); `dst`'s own
    /// state, if any, is dropped.
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId) -> Result<(), KvError> {
        KvCells::seq_bit(src)?;
        KvCells::seq_bit(dst)?;
        if src == dst || src as usize >= self.size() || dst as usize >= self.size() {
            return Ok(());
        }
        if let Some(t) = self.tail(dst) {
            self.drop_seq(t, dst);
            self.tail[dst as usize] = None;
        }
        if let Some(t) = self.tail(src) {
            let c = self.cell(t);
            self.set(t, c.pos, c.seq | 1u64 << dst);
            self.tail[dst as usize] = Some(t);
        }
        self.cells.settle();
        Ok(())
    }

    /// Drops every sequence but `seq`.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), KvError> {
        let bit = KvCells::seq_bit(seq)?;
        for i in 0..self.size() {
            let c = self.cell(i);
            if c.seq & bit == 0 {
                self.set(i, c.pos, 0);
            } else {
                self.set(i, c.pos, bit);
            }
        }
        for (s, t) in self.tail.iter_mut().enumerate() {
            if s as SeqId != seq {
                *t = None;
            }
        }
        self.cells.settle();
        Ok(())
    }

    /// Moves the position of `seq`'s state when it lies in [p0, p1): `f` gives the new one
    /// (a state has no earlier positions to move). Every sequence sharing the state moves
    /// with it, as in llama.cpp.
    fn move_pos(
        &mut self,
        seq: SeqId,
        p0: i32,
        p1: i32,
        f: impl Fn(i32) -> i32,
    ) -> Result<(), KvError> {
        KvCells::seq_bit(seq)?;
        let p0 = p0.max(0);
        let p1 = if p1 < 0 { i32::MAX } else { p1 };
        if let Some(t) = self.tail(seq).filter(|_| p0 < p1) {
            let c = self.cell(t);
            if c.has_seq(seq) && p0 <= c.pos && c.pos < p1 {
                let cell = Cell {
                    pos: f(c.pos),
                    moved: true,
                    ..c
                };
                self.cells.set_cell(t, cell);
            }
        }
        self.cells.settle();
        Ok(())
    }

    pub fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), KvError> {
        if delta == 0 {
            return Ok(());
        }
        self.move_pos(seq, p0, p1, |p| p + delta)
    }

    pub fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), KvError> {
        if d <= 0 {
            return Err(KvError::BadDivisor(d));
        }
        if d == 1 {
            return Ok(());
        }
        self.move_pos(seq, p0, p1, |p| p / d)
    }

    /// Puts saved states (position, sequence set) into empty cells, as a state file
    /// loads them; a sequence that already has a state is refused. Returns their cells.
    pub fn restore(&mut self, saved: &[(i32, u64)]) -> Result<Vec<usize>, KvError> {
        let mut out = Vec::with_capacity(saved.len());
        for &(pos, set) in saved {
            if seq_ids(set).any(|s| s >= self.size() || self.tail(s as SeqId).is_some()) {
                return Err(KvError::BadStore(format!(
                    "saved state of sequence set {set:#x}: a sequence outside this memory, or one that already has a state"
                )));
            }
            let i = self.next_empty(0).ok_or(KvError::NoSlot {
                needed: 1,
                used: self.used(),
                size: self.size(),
            })?;
            self.set(i, pos, set);
            for s in seq_ids(set) {
                self.tail[s] = Some(i);
            }
            out.push(i);
        }
        self.cells.settle();
        Ok(out)
    }

    /// The next empty cell from the head, wrapping.
    fn next_empty(&self, from: usize) -> Option<usize> {
        let n = self.size();
        (0..n)
            .map(|k| (from + k) % n)
            .find(|&i| self.cell(i).is_empty())
    }

    /// Places a ubatch's sequence sets: `(set, last position)` for each, in ubatch order.
    /// The first sequence of a set (its lowest id) carries the state; the others join it,
    /// dropping their own. A sequence alone in its cell updates it in place; one that
    /// shares its cell, or has none, takes an empty cell, starting from the shared state
    /// (or zeros). Returns where each set reads and writes its state.
    pub fn place(&mut self, sets: &[(u64, i32)]) -> Result<Vec<RsSlot>, KvError> {
        let mut out = Vec::with_capacity(sets.len());
        if self.head > self.used() + 2 * sets.len() {
            self.head = 0;
        }
        for &(set, last_pos) in sets {
            let first = set.trailing_zeros();
            if set == 0
                || first as usize >= self.size()
                || (64 - set.leading_zeros()) as usize > self.size()
            {
                return Err(KvError::BadStore(format!(
                    "sequence set {set:#x} is outside this recurrent memory's {} sequence(s)",
                    self.size()
                )));
            }
            // Sequences joining the first one's state give up their own.
            for s in seq_ids(set).skip(1) {
                if let Some(t) = self.tail[s] {
                    self.drop_seq(t, s as SeqId);
                    self.tail[s] = None;
                }
            }
            let own = self
                .tail(first)
                .filter(|&t| self.cell(t).seq == 1u64 << first);
            let slot = match own {
                Some(t) => RsSlot {
                    src: Some(t),
                    dst: t,
                },
                None => {
                    let e = self.next_empty(self.head).ok_or(KvError::NoSlot {
                        needed: 1,
                        used: self.used(),
                        size: self.size(),
                    })?;
                    let src = self.tail(first);
                    if let Some(t) = src {
                        self.drop_seq(t, first);
                    }
                    self.head = (e + 1) % self.size();
                    RsSlot { src, dst: e }
                }
            };
            self.set(slot.dst, last_pos, set);
            self.src[slot.dst] = slot.src;
            for s in seq_ids(set) {
                self.tail[s] = Some(slot.dst);
            }
            out.push(slot);
        }
        self.cells.settle();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bit(s: u32) -> u64 {
        1u64 << s
    }

    #[test]
    fn a_sequence_keeps_its_cell_and_moves_on() {
        let mut rs = RsCells::new(4);
        let slots = rs.place(&[(bit(0), 9)]).unwrap();
        assert_eq!(slots, vec![RsSlot { src: None, dst: 0 }]);
        assert_eq!(
            (rs.as_kv().seq_pos_min(0), rs.as_kv().seq_pos_max(0)),
            (9, 9)
        );
        let slots = rs.place(&[(bit(0), 10)]).unwrap();
        assert_eq!(
            slots,
            vec![RsSlot {
                src: Some(0),
                dst: 0
            }]
        );
        assert_eq!(rs.used(), 1);
    }

    #[test]
    fn copies_share_a_state_until_one_moves_on() {
        let mut rs = RsCells::new(3);
        rs.place(&[(bit(0), 4)]).unwrap();
        rs.seq_cp(0, 1).unwrap();
        assert_eq!(rs.used(), 1);
        assert_eq!(rs.tail(1), Some(0));
        assert_eq!(rs.as_kv().seq_pos_max(1), 4);
        // Sequence 1 moves on: a new cell starting from the shared state.
        let slots = rs.place(&[(bit(1), 5)]).unwrap();
        assert_eq!(
            slots,
            vec![RsSlot {
                src: Some(0),
                dst: 1
            }]
        );
        assert_eq!(rs.cell(0).seq, bit(0));
        assert_eq!(rs.cell(1).seq, bit(1));
        // Sequence 0 owns its cell again: in place.
        let slots = rs.place(&[(bit(0), 5), (bit(1), 6)]).unwrap();
        assert_eq!(
            slots,
            vec![
                RsSlot {
                    src: Some(0),
                    dst: 0
                },
                RsSlot {
                    src: Some(1),
                    dst: 1
                }
            ]
        );
        // A copy over a sequence that has a state drops that state.
        rs.seq_cp(0, 1).unwrap();
        assert_eq!(rs.used(), 1);
        assert_eq!(rs.as_kv().seq_pos_max(1), 5);
    }

    #[test]
    fn only_whole_states_can_be_removed() {
        let mut rs = RsCells::new(2);
        rs.place(&[(bit(0), 7)]).unwrap();
        // Cutting back from the end while earlier positions stay: refused.
        let e = rs.seq_rm(Some(0), 3, -1).unwrap_err();
        assert!(e.to_string().contains("recurrent state"), "{e}");
        assert_eq!(rs.as_kv().seq_pos_max(0), 7);
        // A range before the state's end (a context shift's discard) changes nothing.
        rs.seq_rm(Some(0), 1, 4).unwrap();
        assert_eq!(rs.used(), 1);
        rs.seq_add(0, 4, 8, -3).unwrap();
        assert_eq!(rs.as_kv().seq_pos_max(0), 4);
        rs.seq_div(0, 0, 8, 2).unwrap();
        assert_eq!(rs.as_kv().seq_pos_max(0), 2);
        // From 0: the whole state.
        rs.seq_rm(Some(0), 0, -1).unwrap();
        assert_eq!((rs.used(), rs.tail(0)), (0, None));
        rs.place(&[(bit(0), 0)]).unwrap();
        assert!(rs.seq_rm(None, 2, 5).is_err());
        rs.seq_rm(None, -1, -1).unwrap();
        assert_eq!(rs.used(), 0);
    }

    #[test]
    fn a_token_of_several_sequences_gives_them_one_state() {
        let mut rs = RsCells::new(3);
        rs.place(&[(bit(2), 3)]).unwrap();
        let slots = rs.place(&[(bit(0) | bit(1) | bit(2), 0)]).unwrap();
        // Sequence 2's own state is dropped; 0 carries the new one from zeros.
        assert_eq!(slots, vec![RsSlot { src: None, dst: 1 }]);
        assert_eq!(rs.used(), 1);
        assert_eq!(
            (rs.tail(0), rs.tail(1), rs.tail(2)),
            (Some(1), Some(1), Some(1))
        );
        rs.seq_keep(1).unwrap();
        assert_eq!(rs.cell(1).seq, bit(1));
        assert_eq!((rs.tail(0), rs.tail(2)), (None, None));
    }
}
