//! The rolling buffer of the sliding-window layers: cells for what a window of `window`
//! positions can still see, instead of the whole context.
//!
//! # What the buffer keeps, and why that equals a full cache
//!
//! A query at position p of sequence s sees the cells of s with positions in
//! (p - window, p]. Positions of a sequence only grow while it is decoded, so before a
//! ubatch whose first token of s is at p, every cell of s below p - window + 1 is dead for
//! all later queries — with one exception: a context shift removes the positions
//! [keep, keep + n_discard) and moves the rest down by n_discard, which brings the kept
//! prefix [0, keep) back inside the window (and only that prefix: what was between it and
//! the discarded range is the discarded range). So the buffer evicts dead cells except
//! positions below `keep` (the pinned prefix), and holds per sequence at most
//! `keep + window - 1` old cells plus the ubatch: [`RollingWindow::capacity`].
//!
//! This is the policy only: the buffer's cells are a plain [`KvCells`] that the memory
//! (`crate::memory`) owns beside the full store's, and passes in.
//!
//! What cannot be rebuilt is refused rather than computed wrongly: a batch whose window
//! reaches cells already evicted (a `seq_rm` of more than the buffer's slack, then a
//! decode from there) is an error naming `--swa-full`, and so is Self-Extend
//! (`seq_div` makes a window span more positions than were kept).

use super::{KvCells, KvError, SeqId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollingWindow {
    /// Positions a query sees: (p - window, p].
    pub window: u32,
    /// Positions below this are never evicted (a context shift's kept prefix).
    pub keep: u32,
}

impl RollingWindow {
    /// Cells enough for `n_seq` sequences' windows and pinned prefixes plus one ubatch of
    /// `n_ubatch` tokens, capped by `n_ctx` (a buffer never needs more than the full cache).
    pub fn capacity(window: u32, keep: u32, n_seq: u32, n_ubatch: u32, n_ctx: u32) -> usize {
        let per_seq = window.saturating_sub(1) as u64 + keep as u64;
        (n_seq as u64 * per_seq + n_ubatch as u64).min(n_ctx as u64) as usize
    }

    pub fn new(window: u32, keep: u32) -> Self {
        Self { window, keep }
    }

    /// Positions of `seq` a query at `p` may see and the buffer may have evicted:
    /// [max(keep, p - window + 1), p).
    fn needed(&self, p: i32) -> (i32, i32) {
        ((p - self.window as i32 + 1).max(self.keep as i32), p)
    }

    /// Whether the buffer `buf` holds every cell of sequence `s` that `full` (the cells of
    /// the whole context) has in the window of a query at `p`; else which positions it lacks.
    pub fn check(&self, buf: &KvCells, full: &KvCells, s: SeqId, p: i32) -> Result<(), KvError> {
        let (lo, hi) = self.needed(p);
        if lo >= hi {
            return Ok(());
        }
        let count = |c: &KvCells| {
            (c.cells().iter())
                .filter(|c| c.has_seq(s) && c.pos >= lo && c.pos < hi)
                .count()
        };
        if count(buf) < count(full) {
            return Err(KvError::WindowLost {
                seq: s,
                from: lo,
                to: hi,
            });
        }
        Ok(())
    }

    /// Before storing a ubatch of `n` tokens whose first token of sequence s is at
    /// `first[s]`: checks that the buffer `buf` holds every cell of s that `full` (the cells of
    /// the whole context) has in the window of that token; then, only if fewer than `n`
    /// cells are free, evicts every cell no later query can see (for a sequence outside
    /// the ubatch, the next query is the one after its last position). Evicting late
    /// leaves slack for a sequence cut back and decoded again (regenerating a reply).
    /// Called on a copy that replaces the cells only when the ubatch succeeds.
    pub fn prepare(
        &self,
        buf: &mut KvCells,
        full: &KvCells,
        first: &[(SeqId, i32)],
        n: usize,
    ) -> Result<(), KvError> {
        for &(s, p) in first {
            self.check(buf, full, s, p)?;
        }
        if buf.size() - buf.used() >= n {
            return Ok(());
        }
        for s in 0..super::MAX_SEQ {
            let next = match first.iter().find(|f| f.0 == s) {
                Some(&(_, p)) => p,
                None => match buf.seq_pos_max(s) {
                    -1 => continue,
                    last => last + 1,
                },
            };
            let (lo, _) = self.needed(next);
            if lo > self.keep as i32 {
                buf.seq_rm(Some(s), self.keep as i32, lo)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{build_mask, MaskKind, MASKED};

    /// Visible (sequence set, position) pairs of one mask row.
    fn seen(cells: &KvCells, p: i32, s: u64, window: u32) -> Vec<(u64, i32)> {
        let kind = MaskKind {
            swa: Some(window as i32),
            alibi: false,
            non_causal: false,
        };
        let n_kv = cells.size();
        let m = build_mask(cells.cells(), n_kv, &[p], &[s], kind);
        let mut v: Vec<(u64, i32)> = (0..n_kv)
            .filter(|&c| m[c] != MASKED)
            .map(|c| (cells.cells()[c].seq & s, cells.cells()[c].pos))
            .collect();
        v.sort();
        v
    }

    /// Two sequences decoded in ubatches of 3, with a context shift on sequence 0: every
    /// query sees the same (sequence, position) cells through the rolling buffer as
    /// through the full cache.
    #[test]
    fn the_buffer_shows_what_the_full_cache_shows_through_shifts() {
        let (window, keep, ub) = (5u32, 2u32, 3usize);
        let mut full = KvCells::new(128);
        let cap = RollingWindow::capacity(window, keep, 2, ub as u32, 128);
        let policy = RollingWindow::new(window, keep);
        let mut win = KvCells::new(cap);
        let mut next = [0i32, 0];
        for step in 0..24 {
            if step == 12 {
                // Shift sequence 0: drop [keep, keep + 4), move the rest down by 4.
                for c in [&mut full, &mut win] {
                    c.seq_rm(Some(0), keep as i32, keep as i32 + 4).unwrap();
                    c.seq_add(0, keep as i32 + 4, -1, -4).unwrap();
                }
                next[0] -= 4;
            }
            let s = step % 2;
            let pos: Vec<i32> = (0..ub as i32).map(|i| next[s] + i).collect();
            let seqs = vec![1u64 << s; ub];
            policy
                .prepare(&mut win, &full, &[(s as SeqId, pos[0])], ub)
                .unwrap();
            let a = full.find_slot(ub).unwrap();
            full.store(&a, &pos, &seqs).unwrap();
            let b = win.find_slot(ub).unwrap();
            win.store(&b, &pos, &seqs).unwrap();
            for &p in &pos {
                assert_eq!(
                    seen(&win, p, 1 << s, window),
                    seen(&full, p, 1 << s, window),
                    "step {step}, sequence {s}, position {p}"
                );
            }
            next[s] += ub as i32;
        }
        assert!(win.used() <= cap);
    }

    #[test]
    fn a_window_reaching_evicted_cells_is_refused() {
        let (window, keep) = (4u32, 0u32);
        let mut full = KvCells::new(32);
        let policy = RollingWindow::new(window, keep);
        let mut win = KvCells::new(8);
        for p in 0..12 {
            policy.prepare(&mut win, &full, &[(0, p)], 1).unwrap();
            let a = full.find_slot(1).unwrap();
            full.store(&a, &[p], &[1]).unwrap();
            let b = win.find_slot(1).unwrap();
            win.store(&b, &[p], &[1]).unwrap();
        }
        // The buffer of 8 evicted once, when position 8 found it full: 0..=4 went.
        // Regenerating from position 8 needs 5..8, still held.
        let (mut f2, mut w2) = (full.clone(), win.clone());
        f2.seq_rm(Some(0), 8, -1).unwrap();
        w2.seq_rm(Some(0), 8, -1).unwrap();
        policy.prepare(&mut w2, &f2, &[(0, 8)], 1).unwrap();
        // From position 4 it needs 1..4, evicted.
        full.seq_rm(Some(0), 4, -1).unwrap();
        win.seq_rm(Some(0), 4, -1).unwrap();
        let e = policy.prepare(&mut win, &full, &[(0, 4)], 1).unwrap_err();
        assert!(
            matches!(
                e,
                KvError::WindowLost {
                    seq: 0,
                    from: 1,
                    to: 4
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn capacity_covers_windows_pins_and_a_ubatch() {
        assert_eq!(RollingWindow::capacity(512, 17, 1, 64, 1000), 511 + 17 + 64);
        assert_eq!(
            RollingWindow::capacity(512, 0, 4, 512, 100_000),
            4 * 511 + 512
        );
        assert_eq!(RollingWindow::capacity(512, 0, 1, 512, 300), 300);
    }
}
