//! A readable dump of the cells (`-dkvc`), like llama.cpp's cache view: counts, the
//! largest empty run, then runs of cells with consecutive positions and equal sequences.

use super::KvCells;
use std::fmt::Write;

/// A sequence set as text: `{0,2}`.
pub fn seq_set_text(mask: u64) -> String {
    let ids: Vec<String> = (0..64)
        .filter(|s| mask & (1u64 << s) != 0)
        .map(|s| s.to_string())
        .collect();
    format!("{{{}}}", ids.join(","))
}

impl KvCells {
    /// (start, length) of the longest run of empty cells.
    pub fn largest_empty_run(&self) -> (usize, usize) {
        let (mut best, mut cur_start, mut cur) = ((0, 0), 0, 0);
        for (i, c) in self.cells.iter().enumerate() {
            if c.is_empty() {
                if cur == 0 {
                    cur_start = i;
                }
                cur += 1;
                if cur > best.1 {
                    best = (cur_start, cur);
                }
            } else {
                cur = 0;
            }
        }
        best
    }

    pub fn view(&self) -> String {
        let (at, len) = self.largest_empty_run();
        let mut out = format!(
            "kv cache: {} cells, {} used, head {}, largest empty run {} @ {}{}\n",
            self.size(),
            self.used,
            self.head,
            len,
            at,
            if self.has_shift {
                ", shift pending"
            } else {
                ""
            }
        );
        let mut i = 0;
        while i < self.cells.len() {
            let c = self.cells[i];
            if c.is_empty() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < self.cells.len() {
                let n = self.cells[j];
                if n.is_empty() || n.seq != c.seq || n.pos != c.pos + (j - i) as i32 {
                    break;
                }
                j += 1;
            }
            let _ = writeln!(
                out,
                "  cells {:>5}..{:<5} pos {:>6}..{:<6} seq {}",
                i,
                j,
                c.pos,
                c.pos + (j - i) as i32,
                seq_set_text(c.seq)
            );
            i = j;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_summarises_runs_and_holes() {
        let mut kv = KvCells::new(12);
        kv.store(
            &[0, 1, 2, 3, 4, 5, 6, 7],
            &[0, 1, 2, 3, 4, 5, 6, 7],
            &[1; 8],
        )
        .unwrap();
        kv.seq_rm(Some(0), 2, 5).unwrap();
        kv.seq_cp(0, 2, 6, -1).unwrap();
        assert_eq!(kv.largest_empty_run(), (8, 4));
        let v = kv.view();
        assert!(v.starts_with("kv cache: 12 cells, 5 used"), "{v}");
        assert!(v.contains("largest empty run 4 @ 8"), "{v}");
        assert!(
            v.contains("cells     0..2     pos      0..2      seq {0}"),
            "{v}"
        );
        assert!(
            v.contains("cells     6..8     pos      6..8      seq {0,2}"),
            "{v}"
        );
    }
}
