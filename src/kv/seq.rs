//! Sequence operations with llama.cpp's semantics: remove, copy, keep, shift and divide
//! positions. Bounds are half-open [p0, p1); a negative bound means "from the start" (p0)
//! or "to the end" (p1); `None` as a sequence means every sequence.
//! Position changes accumulate in each cell's `delta` for the K-shift to apply.
//! A sequence id the cell sets cannot hold is an error, never a shift overflow.

use super::{Cell, KvCells, KvError, SeqId};

fn range(p0: i32, p1: i32) -> (i32, i32) {
    (p0.max(0), if p1 < 0 { i32::MAX } else { p1 })
}

impl KvCells {
    fn in_range(c: &Cell, p0: i32, p1: i32) -> bool {
        !c.is_empty() && c.pos >= p0 && c.pos < p1
    }

    fn free(&mut self, i: usize) {
        self.set_cell(i, Cell::default());
    }

    /// Removes `seq` (or every sequence) from cells with positions in [p0, p1).
    pub fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), KvError> {
        let bit = seq.map(Self::seq_bit).transpose()?;
        let (p0, p1) = range(p0, p1);
        let mut new_head = self.size();
        for i in 0..self.size() {
            let c = self.cells[i];
            if !Self::in_range(&c, p0, p1) {
                continue;
            }
            match bit {
                Some(b) if c.seq & b != 0 => {
                    let rest = Cell {
                        seq: c.seq & !b,
                        ..c
                    };
                    if rest.is_empty() {
                        self.free(i);
                    } else {
                        self.set_cell(i, rest);
                    }
                }
                Some(_) => continue,
                None => self.free(i),
            }
            if self.cells[i].is_empty() && new_head == self.size() {
                new_head = i;
            }
        }
        // A freed slot before the head is where the next search should start.
        if new_head != self.size() && new_head < self.head {
            self.head = new_head;
        }
        self.settle();
        Ok(())
    }

    /// Adds `dst` to every cell of `src` with a position in [p0, p1).
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), KvError> {
        let (sb, db) = (Self::seq_bit(src)?, Self::seq_bit(dst)?);
        if src == dst {
            return Ok(());
        }
        let (p0, p1) = range(p0, p1);
        for i in 0..self.size() {
            let c = self.cells[i];
            if Self::in_range(&c, p0, p1) && c.seq & sb != 0 && c.seq & db == 0 {
                self.set_cell(
                    i,
                    Cell {
                        seq: c.seq | db,
                        ..c
                    },
                );
            }
        }
        self.settle();
        Ok(())
    }

    /// Drops every sequence but `seq`; cells without it are freed.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), KvError> {
        let bit = Self::seq_bit(seq)?;
        let mut new_head = self.size();
        for i in 0..self.size() {
            let c = self.cells[i];
            if c.is_empty() {
                continue;
            }
            if c.seq & bit != 0 {
                if c.seq != bit {
                    self.set_cell(i, Cell { seq: bit, ..c });
                }
            } else {
                self.free(i);
                if new_head == self.size() {
                    new_head = i;
                }
            }
        }
        if new_head != self.size() && new_head < self.head {
            self.head = new_head;
        }
        self.settle();
        Ok(())
    }

    /// Adds `delta` to the positions of `seq` in [p0, p1). Cells pushed below 0 are freed.
    pub fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), KvError> {
        Self::seq_bit(seq)?;
        let (p0, p1) = range(p0, p1);
        if delta == 0 || p0 == p1 {
            return Ok(());
        }
        let mut new_head = self.size();
        for i in 0..self.size() {
            let c = self.cells[i];
            if !(Self::in_range(&c, p0, p1) && c.has_seq(seq)) {
                continue;
            }
            self.has_shift = true;
            let moved = Cell {
                pos: c.pos + delta,
                delta: c.delta + delta,
                moved: true,
                ..c
            };
            if moved.pos < 0 {
                self.free(i);
                if new_head == self.size() {
                    new_head = i;
                }
            } else {
                self.set_cell(i, moved);
            }
        }
        // As llama.cpp: start the next search at a freed slot, else from the beginning.
        self.head = if new_head != self.size() { new_head } else { 0 };
        self.settle();
        Ok(())
    }

    /// Integer-divides the positions of `seq` in [p0, p1) by `d` (Self-Extend's grouping).
    pub fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), KvError> {
        Self::seq_bit(seq)?;
        if d < 1 {
            return Err(KvError::BadDivisor(d));
        }
        let (p0, p1) = range(p0, p1);
        if d == 1 || p0 == p1 {
            return Ok(());
        }
        for i in 0..self.size() {
            let c = self.cells[i];
            if Self::in_range(&c, p0, p1) && c.has_seq(seq) {
                self.has_shift = true;
                let pos = c.pos / d;
                // Today's llama.cpp accumulates old - new here (the seeds' older code had
                // new - old). Its results are the reference, so the K-shift after a
                // division rotates keys as it does; smollm2_kv's Self-Extend replay pins it.
                let delta = c.delta + (c.pos - pos);
                self.set_cell(
                    i,
                    Cell {
                        pos,
                        delta,
                        moved: c.moved || pos != c.pos,
                        ..c
                    },
                );
            }
        }
        self.settle();
        Ok(())
    }

    pub fn has_shift(&self) -> bool {
        self.has_shift
    }

    /// The pending delta of every cell (0 for empty ones), for the K-shift; resets them.
    pub fn take_shifts(&mut self) -> Option<Vec<i32>> {
        if !self.has_shift {
            return None;
        }
        self.has_shift = false;
        Some(
            self.cells
                .iter_mut()
                .map(|c| {
                    let d = if c.is_empty() { 0 } else { c.delta };
                    c.delta = 0;
                    d
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache holding positions 0..n of sequence 0 in cells 0..n.
    fn filled(size: usize, n: i32) -> KvCells {
        let mut kv = KvCells::new(size);
        let slots: Vec<usize> = (0..n as usize).collect();
        kv.store(&slots, &(0..n).collect::<Vec<_>>(), &vec![1; n as usize])
            .unwrap();
        kv
    }

    fn positions(kv: &KvCells) -> Vec<i32> {
        kv.cells()
            .iter()
            .map(|c| if c.is_empty() { -1 } else { c.pos })
            .collect()
    }

    #[test]
    fn context_shift_as_llama_completion_does_it() {
        // n_ctx 16, n_keep 2, n_past 15: discard (15 - 2) / 2 = 6 after the kept ones.
        let mut kv = filled(16, 15);
        kv.seq_rm(Some(0), 2, 8).unwrap();
        assert_eq!(kv.used(), 9);
        kv.seq_add(0, 8, 15, -6).unwrap();
        assert_eq!(
            positions(&kv),
            [0, 1, -1, -1, -1, -1, -1, -1, 2, 3, 4, 5, 6, 7, 8, -1]
        );
        assert_eq!(kv.seq_pos_max(0), 8);
        assert!(kv.has_shift());
        let d = kv.take_shifts().unwrap();
        assert_eq!(
            &d[..],
            &[0, 0, 0, 0, 0, 0, 0, 0, -6, -6, -6, -6, -6, -6, -6, 0]
        );
        assert!(!kv.has_shift() && kv.take_shifts().is_none());
        // The next slot search starts at the first freed cell.
        assert_eq!(kv.find_slot(6).unwrap(), vec![2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn negative_bounds_mean_whole_range_and_none_means_all_sequences() {
        let mut kv = filled(8, 6);
        kv.seq_cp(0, 3, -1, -1).unwrap();
        assert!(kv.cells()[..6].iter().all(|c| c.has_seq(0) && c.has_seq(3)));
        kv.seq_rm(Some(0), 4, -1).unwrap();
        assert_eq!(kv.used(), 6, "cells 4, 5 still hold sequence 3");
        assert_eq!(kv.seq_pos_max(0), 3);
        assert_eq!(kv.seq_pos_max(3), 5);
        kv.seq_rm(None, -1, 2).unwrap();
        assert_eq!(kv.used(), 4);
        assert_eq!(kv.seq_pos_min(3), 2);
        kv.seq_keep(0).unwrap();
        assert_eq!(kv.used(), 2, "only cells 2, 3 had sequence 0");
        assert!(kv.cells()[2].seq == 1 && kv.cells()[3].seq == 1);
        kv.seq_rm(Some(0), -1, -1).unwrap();
        assert_eq!(kv.used(), 0);
        assert_eq!(kv.seq_pos_max(0), -1);
    }

    #[test]
    fn shifting_below_zero_frees_cells() {
        let mut kv = filled(8, 4);
        kv.seq_add(0, 0, 2, -1).unwrap();
        assert_eq!(positions(&kv)[..4], [-1, 0, 2, 3]);
        assert_eq!(kv.used(), 3);
    }

    #[test]
    fn shifted_cells_are_marked_moved_until_rewritten() {
        let mut kv = KvCells::new(8);
        kv.store(&[0, 1, 2, 3], &[0, 1, 2, 3], &[1; 4]).unwrap();
        kv.seq_rm(Some(0), 1, 2).unwrap();
        kv.seq_add(0, 2, -1, -1).unwrap();
        let moved: Vec<bool> = kv.cells().iter().map(|c| c.moved).collect();
        assert_eq!(moved[..4], [false, false, true, true]);
        // Division moves only the cells whose position changes.
        kv.seq_div(0, 0, -1, 2).unwrap();
        assert!(!kv.cells()[0].moved, "0 / 2 stays at 0");
        // A stored token starts unmoved.
        kv.store(&[1], &[9], &[1]).unwrap();
        assert!(!kv.cells()[1].moved);
    }

    #[test]
    fn self_extend_division_accumulates_deltas() {
        let mut kv = filled(16, 10);
        kv.seq_div(0, 0, 8, 4).unwrap();
        assert_eq!(positions(&kv)[..10], [0, 0, 0, 0, 1, 1, 1, 1, 8, 9]);
        kv.seq_add(0, 8, 10, -6).unwrap();
        let d = kv.take_shifts().unwrap();
        // Division adds old - new (llama.cpp's current sign); the add adds its delta.
        assert_eq!(&d[..10], &[0, 1, 2, 3, 3, 4, 5, 6, -6, -6]);
        // No-ops: d == 1, delta == 0, empty range.
        kv.seq_div(0, 0, 8, 1).unwrap();
        kv.seq_add(0, 0, 8, 0).unwrap();
        kv.seq_add(0, 3, 3, 5).unwrap();
        assert!(!kv.has_shift());
    }

    /// Ids the 64-bit sets cannot hold are refused (they used to overflow a shift).
    #[test]
    fn bad_sequence_ids_are_errors_not_panics() {
        let mut kv = filled(8, 4);
        let bad = KvError::BadSeq(64);
        assert_eq!(kv.seq_rm(Some(64), -1, -1), Err(bad.clone()));
        assert_eq!(kv.seq_cp(0, 64, -1, -1), Err(bad.clone()));
        assert_eq!(kv.seq_cp(64, 0, -1, -1), Err(bad.clone()));
        assert_eq!(kv.seq_cp(64, 64, -1, -1), Err(bad.clone()));
        assert_eq!(kv.seq_keep(64), Err(bad.clone()));
        assert_eq!(kv.seq_add(64, -1, -1, 1), Err(bad.clone()));
        assert_eq!(kv.seq_div(64, -1, -1, 2), Err(bad));
        assert_eq!(kv.seq_div(0, -1, -1, 0), Err(KvError::BadDivisor(0)));
        assert_eq!(kv.seq_pos_max(u32::MAX), -1);
        assert_eq!(kv.seq_pos_min(64), -1);
        assert_eq!(kv.used(), 4, "nothing changed");
        assert!(!kv.has_shift());
        // Id 63, the last one, works.
        kv.seq_cp(0, 63, -1, -1).unwrap();
        kv.seq_keep(63).unwrap();
        assert_eq!(kv.seq_pos_max(63), 3);
        assert_eq!(kv.cells()[0].seq, 1 << 63);
    }
}
