//! Cells: position, pending shift (delta) and the set of sequences each cell belongs to.
//!
//! Beside the cells, [`KvCells`] keeps the bounds every decode step asks for (the used
//! bound for `n_kv`, each sequence's first and last position), so those are O(1) instead of
//! a scan of all n_ctx cells. Storing tokens into empty cells (the decode path) only widens
//! the bounds, O(1) per token. Anything that shrinks them changes an already-used cell,
//! and only the sequence operations and compaction do that: they already walk every cell,
//! so they end with one more walk that recomputes the bounds exactly.
//!
//! Why not ordered index sets (llama.cpp keeps a set of used cells and a position multiset
//! per sequence)? The context clones the cells before every batch to restore them if the
//! batch fails; with tree-based indexes that clone went from a 2 MiB memcpy (110 µs at
//! 131072 cells) to rebuilding the trees (7.8 ms), more than the scans it saved. Plain
//! bounds clone as a few hundred bytes.

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
    /// A sequence operation (context shift, Self-Extend) changed the position since the
    /// token was stored; only displays read it (the desktop app marks moved cells).
    pub moved: bool,
    /// Under M-RoPE, the time the token after this one takes (an image's tokens share a
    /// time and the next token skips past the image's larger side, so it is not pos + 1);
    /// 0: none recorded, pos + 1.
    pub rope_next: i32,
}

impl Cell {
    pub fn is_empty(&self) -> bool {
        self.seq == 0
    }
    /// False for ids the set cannot hold (>= MAX_SEQ) rather than a shift overflow.
    pub fn has_seq(&self, s: SeqId) -> bool {
        KvCells::seq_bit(s).is_ok_and(|b| self.seq & b != 0)
    }
}

/// The sequence ids 0..n as a set; n >= MAX_SEQ gives every id (a plain shift by 64
/// would overflow, and `-np 64` is allowed).
pub fn seqs_below(n: u32) -> u64 {
    if n >= MAX_SEQ {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the KV cache is full: no room for {needed} more token(s) ({used} of {size} cells used); use a larger context (-c) or enable context shift")]
    NoSlot {
        needed: usize,
        used: usize,
        size: usize,
    },
    #[error("invalid sequence id {0}: this build tracks sequence ids 0..{MAX_SEQ}")]
    BadSeq(SeqId),
    #[error("seq_div by {0}: the divisor must be positive")]
    BadDivisor(i32),
    #[error("invalid store into the KV cache: {0}")]
    BadStore(String),
    #[error("sequence {seq} needs positions {from}..{to} in the sliding-window cache, which the rolling buffer has already dropped (they were outside every window it expected); use --swa-full to keep a full-size cache for the sliding-window layers")]
    WindowLost { seq: SeqId, from: i32, to: i32 },
}

#[derive(Clone, Debug)]
pub struct KvCells {
    /// Read freely within the module; change a cell's `pos` or `seq` only through
    /// [`KvCells::set_cell`] (a `delta` may be changed in place: no index covers it).
    pub(super) cells: Vec<Cell>,
    /// Where the next search for free cells starts.
    pub(super) head: usize,
    pub(super) used: usize,
    /// Some cell has a delta that the K-shift has not applied yet.
    pub(super) has_shift: bool,
    /// One past the last non-empty cell.
    used_hi: usize,
    /// Per sequence id, the (smallest, largest) position of its cells.
    seq_bounds: [Option<(i32, i32)>; MAX_SEQ as usize],
    /// A used cell changed since the bounds were last exact: they may be too wide.
    stale: bool,
}

/// The ids in a sequence set, lowest first.
pub(super) fn seq_ids(mut set: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (set != 0).then(|| {
            let s = set.trailing_zeros() as usize;
            set &= set - 1;
            s
        })
    })
}

/// `b` widened to take `pos`.
fn widen(b: Option<(i32, i32)>, pos: i32) -> Option<(i32, i32)> {
    Some(b.map_or((pos, pos), |(lo, hi)| (lo.min(pos), hi.max(pos))))
}

impl KvCells {
    pub fn new(size: usize) -> Self {
        Self {
            cells: vec![Cell::default(); size],
            head: 0,
            used: 0,
            has_shift: false,
            used_hi: 0,
            seq_bounds: [None; MAX_SEQ as usize],
            stale: false,
        }
    }

    /// Replaces cell `i` and keeps the used count. A cell filled from empty widens the
    /// bounds at once; a change to a used cell marks them stale, for [`Self::settle`].
    /// Every mutation of `pos` or `seq` goes through here and ends with `settle`.
    pub(super) fn set_cell(&mut self, i: usize, new: Cell) {
        let old = std::mem::replace(&mut self.cells[i], new);
        if !old.is_empty() {
            self.stale = true;
            self.used -= 1;
        }
        if !new.is_empty() {
            self.used += 1;
            self.used_hi = self.used_hi.max(i + 1);
            for s in seq_ids(new.seq) {
                self.seq_bounds[s] = widen(self.seq_bounds[s], new.pos);
            }
        }
    }

    /// Makes the bounds exact again after used cells changed: one walk over the cells,
    /// which the operations that change used cells already pay for.
    pub(super) fn settle(&mut self) {
        if !self.stale {
            return;
        }
        self.stale = false;
        self.used_hi = self
            .cells
            .iter()
            .rposition(|c| !c.is_empty())
            .map_or(0, |i| i + 1);
        self.seq_bounds = [None; MAX_SEQ as usize];
        for c in &self.cells[..self.used_hi] {
            if !c.is_empty() {
                for s in seq_ids(c.seq) {
                    self.seq_bounds[s] = widen(self.seq_bounds[s], c.pos);
                }
            }
        }
    }

    /// Smallest position stored for `seq`, or -1 (also for an id no cell can hold).
    pub fn seq_pos_min(&self, seq: SeqId) -> i32 {
        self.seq_bounds
            .get(seq as usize)
            .copied()
            .flatten()
            .map_or(-1, |b| b.0)
    }

    /// Largest position stored for `seq`, or -1.
    pub fn seq_pos_max(&self, seq: SeqId) -> i32 {
        self.seq_bounds
            .get(seq as usize)
            .copied()
            .flatten()
            .map_or(-1, |b| b.1)
    }

    /// The M-RoPE time of the token that would follow `seq`'s last (see
    /// [`Cell::rope_next`]); -1 where `seq` holds no cell. A scan of the used cells.
    pub fn seq_rope_next(&self, seq: SeqId) -> i32 {
        let last = self.seq_pos_max(seq);
        if last < 0 {
            return -1;
        }
        let held = self.cells[..self.used_hi.min(self.cells.len())]
            .iter()
            .find(|c| c.pos == last && c.has_seq(seq));
        match held {
            Some(c) if c.rope_next > 0 => c.rope_next,
            _ => last + 1,
        }
    }

    /// Records each stored token's next M-RoPE time (cells `slots`, just stored).
    pub fn set_rope_next(&mut self, slots: &[usize], next: &[i32]) {
        for (&i, &n) in slots.iter().zip(next) {
            if let Some(c) = self.cells.get_mut(i) {
                c.rope_next = n;
            }
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
        self.used_hi = 0;
        self.seq_bounds = [None; MAX_SEQ as usize];
        self.stale = false;
    }

    /// One past the last non-empty cell.
    pub fn used_max_p1(&self) -> usize {
        self.used_hi
    }

    /// Cells attention must read: the used bound rounded up to `pad`, capped at the size.
    pub fn n_kv(&self, pad: usize) -> usize {
        self.used_max_p1()
            .max(1)
            .div_ceil(pad)
            .saturating_mul(pad)
            .min(self.size())
    }

    /// Finds `n` empty cells for a ubatch as today's llama.cpp does (its default,
    /// non-contiguous search): from `head`, or from 0 when more than 2n cells before the
    /// head are free (fill the front first), taking every empty cell on the way and
    /// wrapping at the end. Fails only after testing every cell, so a fragmented cache
    /// takes a ubatch larger than any of its holes. Returns the cell of each token.
    pub fn find_slot(&self, n: usize) -> Result<Vec<usize>, KvError> {
        let size = self.size();
        let no_slot = KvError::NoSlot {
            needed: n,
            used: self.used,
            size,
        };
        if n > size {
            return Err(no_slot);
        }
        let mut head = self.head;
        if head > self.used + 2 * n {
            head = 0;
        }
        let mut slots = Vec::with_capacity(n);
        for k in 0..size {
            if slots.len() == n {
                break;
            }
            let i = (head + k) % size;
            if self.cells[i].is_empty() {
                slots.push(i);
            }
        }
        if slots.len() == n {
            Ok(slots)
        } else {
            Err(no_slot)
        }
    }

    /// Stores token t with `positions[t]` and `seqs[t]` (one set each) in cell
    /// `slots[t]`; the next search starts after the last of them. Checked first and
    /// all-or-nothing, so a bad call cannot corrupt the used count.
    pub fn store(
        &mut self,
        slots: &[usize],
        positions: &[i32],
        seqs: &[u64],
    ) -> Result<(), KvError> {
        let n = slots.len();
        if positions.len() != n || seqs.len() != n {
            return Err(KvError::BadStore(format!(
                "{n} cell(s) for {} position(s) and {} sequence set(s)",
                positions.len(),
                seqs.len()
            )));
        }
        if let Some(&i) = slots.iter().find(|&&i| i >= self.size()) {
            return Err(KvError::BadStore(format!(
                "cell {i} is outside the cache ({} cells)",
                self.size()
            )));
        }
        if seqs.contains(&0) {
            return Err(KvError::BadStore("a token belongs to no sequence".into()));
        }
        for ((&i, &p), &s) in slots.iter().zip(positions).zip(seqs) {
            let cell = Cell {
                pos: p,
                delta: 0,
                seq: s,
                moved: false,
                rope_next: 0,
            };
            self.set_cell(i, cell);
        }
        // Only when a slot was already used (find_slot never returns one).
        self.settle();
        if let Some(&last) = slots.last() {
            self.head = (last + 1) % self.size();
        }
        Ok(())
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

    /// Stores positions `p0..p0 + n` of sequence 0 wherever find_slot puts them.
    fn put(kv: &mut KvCells, p0: i32, n: usize) -> Vec<usize> {
        let slots = kv.find_slot(n).unwrap();
        let pos: Vec<i32> = (p0..p0 + n as i32).collect();
        kv.store(&slots, &pos, &vec![1; n]).unwrap();
        slots
    }

    fn range(a: usize, b: usize) -> Vec<usize> {
        (a..b).collect()
    }

    #[test]
    fn slots_fill_from_the_front_and_pad_n_kv() {
        let mut kv = KvCells::new(600);
        assert_eq!(kv.n_kv(256), 256);
        assert_eq!(put(&mut kv, 0, 10), range(0, 10));
        assert_eq!(kv.used(), 10);
        assert_eq!(kv.find_slot(5).unwrap(), range(10, 15));
        put(&mut kv, 10, 290);
        assert_eq!(kv.n_kv(256), 512);
        put(&mut kv, 300, 290);
        assert_eq!(kv.n_kv(256), 600, "capped at the cache size");
        assert_eq!(kv.seq_pos_max(0), 589);
        assert_eq!(kv.seq_pos_max(1), -1);
    }

    #[test]
    fn a_full_cache_says_so() {
        let mut kv = KvCells::new(8);
        put(&mut kv, 0, 6);
        assert_eq!(kv.find_slot(2).unwrap(), vec![6, 7]);
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
        put(&mut kv, 6, 2);
        let e = kv.find_slot(1).unwrap_err();
        assert!(e.to_string().contains("KV cache is full"), "{e}");
        assert!(KvCells::seq_bit(64).is_err());
    }

    #[test]
    fn search_wraps_to_the_front() {
        let mut kv = KvCells::new(8);
        kv.store(&[4, 5, 6, 7], &[0, 1, 2, 3], &[1; 4]).unwrap();
        assert_eq!(kv.head, 0, "the head wraps after the last cell");
        assert_eq!(kv.find_slot(4).unwrap(), range(0, 4));
        assert!(kv.find_slot(5).is_err());
        // From a head in the middle, the search wraps and takes the front cells last.
        let mut kv = KvCells::new(8);
        kv.store(&[2, 3], &[0, 1], &[1; 2]).unwrap();
        assert_eq!(kv.head, 4);
        assert_eq!(kv.find_slot(5).unwrap(), vec![4, 5, 6, 7, 0]);
    }

    /// Holes of 2 cells between used ones: a ubatch of 5 fits across them, in order from
    /// the head, as long as enough cells are free in all.
    #[test]
    fn a_fragmented_cache_takes_a_ubatch_larger_than_any_hole() {
        let mut kv = KvCells::new(12);
        put(&mut kv, 0, 12);
        for p in [1, 2, 5, 6, 9, 10] {
            kv.seq_rm(Some(0), p, p + 1).unwrap();
        }
        assert_eq!(kv.used(), 6);
        assert_eq!(kv.largest_empty_run().1, 2);
        let slots = kv.find_slot(5).unwrap();
        assert_eq!(slots, vec![1, 2, 5, 6, 9]);
        kv.store(&slots, &[12, 13, 14, 15, 16], &[2; 5]).unwrap();
        assert_eq!(kv.used(), 11);
        assert_eq!(kv.head, 10, "after the last cell used");
        assert_eq!(kv.find_slot(1).unwrap(), vec![10]);
        assert!(kv.find_slot(2).is_err());
        assert_eq!(kv.seq_pos_max(1), 16);
    }

    /// llama.cpp restarts the search from cell 0 when more than 2n cells are free before
    /// the head, and otherwise keeps going from the head.
    #[test]
    fn the_head_resets_when_many_cells_before_it_are_free() {
        let mut kv = KvCells::new(32);
        put(&mut kv, 0, 20);
        kv.seq_rm(Some(0), 0, 15).unwrap(); // used 5 (cells 15..20); head stays 0
        kv.head = 20;
        // head 20 > used 5 + 2 * 4: search from 0.
        assert_eq!(kv.find_slot(4).unwrap(), range(0, 4));
        // head 20 <= used 5 + 2 * 8: search from the head.
        assert_eq!(kv.find_slot(8).unwrap(), range(20, 28));
        // head 20 <= 5 + 2 * 13, and only 12 cells after it: the rest wraps to the front.
        let mut want = range(20, 32);
        want.push(0);
        assert_eq!(kv.find_slot(13).unwrap(), want);
    }

    #[test]
    fn bad_stores_are_refused_untouched() {
        let mut kv = KvCells::new(4);
        assert!(kv.store(&[0, 4], &[0, 1], &[1, 1]).is_err());
        assert!(kv.store(&[0, 1], &[0], &[1, 1]).is_err());
        assert!(kv.store(&[0], &[0], &[0]).is_err());
        assert_eq!(kv.used(), 0);
        assert!(kv.cells().iter().all(|c| c.is_empty()));
    }

    /// The kept bounds equal a full scan of the cells after any sequence of operations,
    /// including clones restored over the cache (as after a failed batch).
    mod bounds_match_a_scan {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Put(usize, i32, u64),
            StoreAt(Vec<usize>, i32, u64),
            Rm(Option<SeqId>, i32, i32),
            Cp(SeqId, SeqId, i32, i32),
            Keep(SeqId),
            Add(SeqId, i32, i32, i32),
            Div(SeqId, i32, i32, i32),
            Clear,
            Compact,
            TakeShifts,
            Snapshot,
            Restore,
        }

        fn seq() -> impl Strategy<Value = SeqId> {
            prop_oneof![4 => 0u32..4, 1 => Just(63u32)]
        }
        fn set() -> impl Strategy<Value = u64> {
            prop_oneof![3 => (0u32..4).prop_map(|s| 1u64 << s), 1 => 1u64..16, 1 => Just(1u64 << 63 | 1)]
        }
        fn bound() -> impl Strategy<Value = i32> {
            -1i32..40
        }
        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (1usize..12, 0i32..30, set()).prop_map(|(n, p, s)| Op::Put(n, p, s)),
                2 => (prop::collection::vec(0usize..64, 1..5), 0i32..30, set())
                    .prop_map(|(v, p, s)| Op::StoreAt(v, p, s)),
                3 => (prop::option::of(seq()), bound(), bound()).prop_map(|(s, a, b)| Op::Rm(s, a, b)),
                2 => (seq(), seq(), bound(), bound()).prop_map(|(s, d, a, b)| Op::Cp(s, d, a, b)),
                1 => seq().prop_map(Op::Keep),
                2 => (seq(), bound(), bound(), -12i32..12).prop_map(|(s, a, b, d)| Op::Add(s, a, b, d)),
                1 => (seq(), bound(), bound(), 1i32..4).prop_map(|(s, a, b, d)| Op::Div(s, a, b, d)),
                1 => Just(Op::Clear),
                1 => Just(Op::Compact),
                1 => Just(Op::TakeShifts),
                1 => Just(Op::Snapshot),
                1 => Just(Op::Restore),
            ]
        }

        fn check(kv: &KvCells) -> Result<(), TestCaseError> {
            let cells = kv.cells();
            let used = cells.iter().filter(|c| !c.is_empty()).count();
            prop_assert_eq!(kv.used(), used);
            let hi = cells
                .iter()
                .rposition(|c| !c.is_empty())
                .map_or(0, |i| i + 1);
            prop_assert_eq!(kv.used_max_p1(), hi);
            for pad in [1, 8, 256] {
                let want = hi.max(1).div_ceil(pad).saturating_mul(pad).min(kv.size());
                prop_assert_eq!(kv.n_kv(pad), want);
            }
            for s in 0..MAX_SEQ + 1 {
                let pos = cells.iter().filter(|c| c.has_seq(s)).map(|c| c.pos);
                prop_assert_eq!(
                    kv.seq_pos_min(s),
                    pos.clone().min().unwrap_or(-1),
                    "min {}",
                    s
                );
                prop_assert_eq!(kv.seq_pos_max(s), pos.max().unwrap_or(-1), "max {}", s);
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn after_random_operations(size in 1usize..48, ops in prop::collection::vec(op(), 1..40)) {
                let mut kv = KvCells::new(size);
                let mut saved: Option<KvCells> = None;
                for op in ops {
                    match op {
                        Op::Put(n, p, s) => {
                            if let Ok(slots) = kv.find_slot(n) {
                                let pos: Vec<i32> = (p..p + n as i32).collect();
                                kv.store(&slots, &pos, &vec![s; n]).unwrap();
                            }
                        }
                        Op::StoreAt(v, p, s) => {
                            let slots: Vec<usize> = v.iter().map(|i| i % size).collect();
                            let pos: Vec<i32> = (p..p + slots.len() as i32).collect();
                            kv.store(&slots, &pos, &vec![s; slots.len()]).unwrap();
                        }
                        Op::Rm(s, a, b) => kv.seq_rm(s, a, b).unwrap(),
                        Op::Cp(s, d, a, b) => kv.seq_cp(s, d, a, b).unwrap(),
                        Op::Keep(s) => kv.seq_keep(s).unwrap(),
                        Op::Add(s, a, b, d) => kv.seq_add(s, a, b, d).unwrap(),
                        Op::Div(s, a, b, d) => kv.seq_div(s, a, b, d).unwrap(),
                        Op::Clear => kv.clear(),
                        Op::Compact => {
                            kv.compact();
                        }
                        Op::TakeShifts => {
                            kv.take_shifts();
                        }
                        Op::Snapshot => saved = Some(kv.clone()),
                        Op::Restore => {
                            if let Some(s) = &saved {
                                kv = s.clone();
                            }
                        }
                    }
                    check(&kv)?;
                }
            }
        }
    }

    #[test]
    fn sequence_id_sets_cover_every_id_up_to_64() {
        assert_eq!(seqs_below(0), 0);
        assert_eq!(seqs_below(1), 1);
        assert_eq!(seqs_below(63), u64::MAX >> 1);
        assert_eq!(seqs_below(64), u64::MAX);
        assert_eq!(seqs_below(1000), u64::MAX);
        let c = Cell {
            seq: 1 << 63,
            ..Cell::default()
        };
        assert!(c.has_seq(63));
        assert!(!c.has_seq(64) && !c.has_seq(u32::MAX), "no panic, no match");
    }
}
