//! Compaction of the cells: used cells move to the front, in their order, so that the
//! bound attention reads (`n_kv`) follows the used count again after holes appear
//! (context shift, seq_rm in the middle). The GPU side copies the K/V rows by the plan.

use super::KvCells;

/// A run of `len` consecutive cells moving from `src` to `dst` (always `dst < src`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

impl KvCells {
    /// Share of the cells below the used bound that are holes (0 without holes).
    pub fn fragmentation(&self) -> f32 {
        let hi = self.used_max_p1();
        if hi == 0 {
            0.0
        } else {
            1.0 - self.used as f32 / hi as f32
        }
    }

    /// Moves every used cell to the front, keeping their order; returns the row moves the
    /// K/V buffers need (empty when there are no holes). Pending deltas move with cells.
    pub fn compact(&mut self) -> Vec<Move> {
        let mut moves: Vec<Move> = Vec::new();
        let mut dst = 0;
        for src in 0..self.size() {
            if self.cells[src].is_empty() {
                continue;
            }
            if src != dst {
                let c = self.cells[src];
                self.set_cell(src, Default::default());
                self.set_cell(dst, c);
                match moves.last_mut() {
                    Some(m) if m.src + m.len == src && m.dst + m.len == dst => m.len += 1,
                    _ => moves.push(Move { src, dst, len: 1 }),
                }
            }
            dst += 1;
        }
        self.head = if dst >= self.size() { 0 } else { dst };
        self.settle();
        moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_closes_holes_in_order_and_merges_runs() {
        let mut kv = KvCells::new(16);
        kv.store(
            &(0..10).collect::<Vec<_>>(),
            &(0..10).collect::<Vec<_>>(),
            &[1; 10],
        )
        .unwrap();
        kv.seq_rm(Some(0), 2, 5).unwrap(); // holes at 2, 3, 4
        kv.seq_add(0, 5, 10, -3).unwrap();
        assert!((kv.fragmentation() - 0.3).abs() < 1e-6);
        let before: Vec<_> = kv
            .cells()
            .iter()
            .filter(|c| !c.is_empty())
            .copied()
            .collect();
        let moves = kv.compact();
        assert_eq!(
            moves,
            vec![Move {
                src: 5,
                dst: 2,
                len: 5
            }]
        );
        let after: Vec<_> = kv.cells()[..7].to_vec();
        assert_eq!(after, before, "same cells, same order, deltas kept");
        assert!(kv.cells()[7..].iter().all(|c| c.is_empty()));
        assert_eq!(kv.used(), 7);
        assert_eq!(kv.fragmentation(), 0.0);
        assert_eq!(kv.find_slot(3).unwrap(), vec![7, 8, 9]);
        assert!(kv.compact().is_empty(), "nothing left to move");
    }

    #[test]
    fn scattered_holes_give_one_move_per_run() {
        let mut kv = KvCells::new(12);
        kv.store(
            &(0..12).collect::<Vec<_>>(),
            &(0..12).collect::<Vec<_>>(),
            &[1; 12],
        )
        .unwrap();
        for p in [1, 4, 5, 9] {
            kv.seq_rm(None, p, p + 1).unwrap();
        }
        let moves = kv.compact();
        assert_eq!(
            moves,
            vec![
                Move {
                    src: 2,
                    dst: 1,
                    len: 2
                },
                Move {
                    src: 6,
                    dst: 3,
                    len: 3
                },
                Move {
                    src: 10,
                    dst: 6,
                    len: 2
                },
            ]
        );
        let pos: Vec<i32> = kv.cells()[..8].iter().map(|c| c.pos).collect();
        assert_eq!(pos, vec![0, 2, 3, 6, 7, 8, 10, 11]);
    }
}
