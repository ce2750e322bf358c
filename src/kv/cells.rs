//! Cells: position, pending shift (delta) and the set of sequences each cell belongs to.

/// A sequence id (0..64 in this build: the set is a 64-bit mask).
pub type SeqId = u32;

/// Maximum distinct sequences the cache can track.
pub const MAX_SEQ: u32 = 64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    /// Position of the token stored here; meaningless when `seq == 0`.
    pub pos: i32,
    /// Accumulated position shift not yet applied to K (the K-shift consumes it).
    pub delta: i32,
    /// Bit s set: the cell belongs to sequence s. Empty cell: 0.
    pub seq: u64,
}

impl Cell {
    pub fn is_empty(&self) -> bool {
        self.seq == 0
    }
    pub fn has_seq(&self, s: SeqId) -> bool {
        self.seq & (1u64 << s) != 0
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the KV cache is full: no room for {needed} more token(s) ({used} of {size} cells used); use a larger context (-c) or enable context shift")]
    NoSlot {
        needed: usize,
        used: usize,
        size: usize,
    },
    #[error("invalid sequence id {0}: this build tracks sequence ids 0..{MAX_SEQ}")]
    BadSeq(SeqId),
}

#[derive(Clone, Debug)]
pub struct KvCells {
    pub(super) cells: Vec<Cell>,
    /// Where the next search for free cells starts.
    pub(super) head: usize,
    pub(super) used: usize,
    /// Some cell has a delta that the K-shift has not applied yet.
    pub(super) has_shift: bool,
}

impl KvCells {
    pub fn new(size: usize) -> Self {
        Self {
            cells: vec![Cell::default(); size],
            head: 0,
            used: 0,
            has_shift: false,
        }
    }

    pub fn size(&self) -> usize {
        self.cells.len()
    }
    pub fn used(&self) -> usize {
        self.used
    }
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    pub fn clear(&mut self) {
        self.cells.fill(Cell::default());
        self.head = 0;
        self.used = 0;
        self.has_shift = false;
    }

    /// One past the last non-empty cell.
    pub fn used_max_p1(&self) -> usize {
        self.cells
            .iter()
            .rposition(|c| !c.is_empty())
            .map_or(0, |i| i + 1)
    }

    /// Cells attention must read: the used bound rounded up to `pad`, capped at the size.
    pub fn n_kv(&self, pad: usize) -> usize {
        self.used_max_p1()
            .max(1)
            .div_ceil(pad)
            .saturating_mul(pad)
            .min(self.size())
    }

    /// Finds `n` contiguous empty cells, searching from `head` and wrapping once, as
    /// llama.cpp does for a ubatch. Returns the first cell index.
    pub fn find_slot(&self, n: usize) -> Result<usize, KvError> {
        let size = self.size();
        let no_slot = KvError::NoSlot {
            needed: n,
            used: self.used,
            size,
        };
        if n > size {
            return Err(no_slot);
        }
        let mut head = if self.head + n > size { 0 } else { self.head };
        let mut tested = 0;
        while tested < size {
            if head + n > size {
                tested += size - head;
                head = 0;
                continue;
            }
            match self.cells[head..head + n]
                .iter()
                .position(|c| !c.is_empty())
            {
                None => return Ok(head),
                Some(i) => {
                    head += i + 1;
                    tested += i + 1;
                }
            }
        }
        Err(no_slot)
    }

    /// Stores tokens with `positions` and `seqs` (one set each) from cell `start` on.
    pub fn store(&mut self, start: usize, positions: &[i32], seqs: &[u64]) {
        for (i, (&p, &s)) in positions.iter().zip(seqs).enumerate() {
            let c = &mut self.cells[start + i];
            if c.is_empty() {
                self.used += 1;
            }
            *c = Cell {
                pos: p,
                delta: 0,
                seq: s,
            };
        }
        self.head = start + positions.len();
        if self.head >= self.size() {
            self.head = 0;
        }
    }

    /// Bit mask for one sequence id, checked.
    pub fn seq_bit(s: SeqId) -> Result<u64, KvError> {
        if s < MAX_SEQ {
            Ok(1u64 << s)
        } else {
            Err(KvError::BadSeq(s))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fill_from_the_front_and_pad_n_kv() {
        let mut kv = KvCells::new(600);
        assert_eq!(kv.n_kv(256), 256);
        let s = kv.find_slot(10).unwrap();
        assert_eq!(s, 0);
        kv.store(s, &(0..10).collect::<Vec<_>>(), &[1; 10]);
        assert_eq!(kv.used(), 10);
        assert_eq!(kv.find_slot(5).unwrap(), 10);
        kv.store(10, &(10..300).collect::<Vec<_>>(), &[1; 290]);
        assert_eq!(kv.n_kv(256), 512);
        kv.store(300, &(300..590).collect::<Vec<_>>(), &[1; 290]);
        assert_eq!(kv.n_kv(256), 600, "capped at the cache size");
        assert_eq!(kv.seq_pos_max(0), 589);
        assert_eq!(kv.seq_pos_max(1), -1);
    }

    #[test]
    fn a_full_cache_says_so() {
        let mut kv = KvCells::new(8);
        kv.store(0, &[0, 1, 2, 3, 4, 5], &[1; 6]);
        assert_eq!(kv.find_slot(2).unwrap(), 6);
        let e = kv.find_slot(3).unwrap_err();
        assert_eq!(
            e,
            KvError::NoSlot {
                needed: 3,
                used: 6,
                size: 8
            }
        );
        assert!(e.to_string().contains("KV cache is full"));
        assert!(kv.find_slot(9).is_err());
        assert!(KvCells::seq_bit(64).is_err());
    }

    #[test]
    fn search_wraps_to_the_front() {
        let mut kv = KvCells::new(8);
        kv.store(4, &[0, 1, 2, 3], &[1; 4]);
        // head is now 0 (wrapped): cells 0..4 are free.
        assert_eq!(kv.find_slot(4).unwrap(), 0);
        assert!(kv.find_slot(5).is_err());
    }
}
