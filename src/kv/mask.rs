//! The KQ mask for a ubatch: which cells each new token may attend to.

use super::Cell;

/// Value of a hidden entry (softmax gives it exactly zero weight).
pub const MASKED: f32 = f32::NEG_INFINITY;

/// How the mask is filled besides causality and sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskKind {
    /// Sliding-window attention: cells with pos <= p_t - w are hidden too.
    pub swa: Option<i32>,
    /// ALiBi: a visible entry holds -|p_t - p_c| (the softmax scales it by the head's
    /// slope) instead of 0.
    pub alibi: bool,
    /// Encoders (BERT): a token sees every cell of its sequences, later positions too.
    pub non_causal: bool,
}

impl MaskKind {
    /// The store whose cells a mask of this kind is over: a sliding window's is the
    /// window store (its rolling buffer, where the context has one).
    pub fn cache(&self) -> super::CacheKind {
        if self.swa.is_some() {
            super::CacheKind::Window
        } else {
            super::CacheKind::Full
        }
    }
}

/// Builds the [n_kv, n_tok] mask: token t sees cell c iff c shares one of t's sequences
/// and holds a position <= t's (causal, unless the kind is not), within the window if
/// there is one.
pub fn build_mask(
    cells: &[Cell],
    n_kv: usize,
    positions: &[i32],
    seqs: &[u64],
    kind: MaskKind,
) -> Vec<f32> {
    let swa = kind.swa;
    let mut m = vec![MASKED; n_kv * positions.len()];
    for (t, (&p, &s)) in positions.iter().zip(seqs).enumerate() {
        let row = &mut m[t * n_kv..(t + 1) * n_kv];
        for (c, cell) in cells.iter().take(n_kv).enumerate() {
            let visible = cell.seq & s != 0
                && (kind.non_causal || cell.pos <= p)
                && swa.is_none_or(|w| p - cell.pos < w);
            if visible {
                row[c] = if kind.alibi {
                    -((p - cell.pos).abs() as f32)
                } else {
                    0.0
                };
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(pos: i32, seq: u64) -> Cell {
        Cell {
            pos,
            seq,
            ..Cell::default()
        }
    }

    #[test]
    fn causal_per_sequence_and_windowed() {
        let cells = [
            cell(0, 1),
            cell(1, 1),
            cell(0, 2),
            cell(2, 1),
            Cell::default(),
        ];
        let m = build_mask(&cells, 5, &[1, 2], &[1, 1], MaskKind::default());
        assert_eq!(&m[..5], &[0.0, 0.0, MASKED, MASKED, MASKED]);
        assert_eq!(&m[5..], &[0.0, 0.0, MASKED, 0.0, MASKED]);
        let m = build_mask(&cells, 5, &[0], &[2], MaskKind::default());
        assert_eq!(m, vec![MASKED, MASKED, 0.0, MASKED, MASKED]);
        let swa = MaskKind {
            swa: Some(2),
            alibi: false,
            non_causal: false,
        };
        let m = build_mask(&cells, 5, &[2], &[1], swa);
        assert_eq!(m, vec![MASKED, 0.0, MASKED, 0.0, MASKED]);
        let alibi = MaskKind {
            swa: None,
            alibi: true,
            non_causal: false,
        };
        let m = build_mask(&cells, 5, &[2], &[1], alibi);
        assert_eq!(m, vec![-2.0, -1.0, MASKED, 0.0, MASKED]);
        let encoder = MaskKind {
            non_causal: true,
            ..MaskKind::default()
        };
        let m = build_mask(&cells, 5, &[0], &[1], encoder);
        assert_eq!(m, vec![0.0, 0.0, MASKED, 0.0, MASKED]);
    }
}
