//! The KQ mask for a ubatch: which cells each new token may attend to.

use super::Cell;

/// Value of a hidden entry (softmax gives it exactly zero weight).
pub const MASKED: f32 = f32::NEG_INFINITY;

/// Builds the [n_kv, n_tok] mask: token t sees cell c iff c shares one of t's sequences
/// and holds a position <= t's (causal). With `swa` = Some(w), cells with
/// pos <= p_t - w are hidden too (sliding-window attention).
pub fn build_mask(
    cells: &[Cell],
    n_kv: usize,
    positions: &[i32],
    seqs: &[u64],
    swa: Option<i32>,
) -> Vec<f32> {
    let mut m = vec![MASKED; n_kv * positions.len()];
    for (t, (&p, &s)) in positions.iter().zip(seqs).enumerate() {
        let row = &mut m[t * n_kv..(t + 1) * n_kv];
        for (c, cell) in cells.iter().take(n_kv).enumerate() {
            let visible =
                cell.seq & s != 0 && cell.pos <= p && swa.is_none_or(|w| p - cell.pos < w);
            if visible {
                row[c] = 0.0;
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(pos: i32, seq: u64) -> Cell {
        Cell { pos, delta: 0, seq }
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
        let m = build_mask(&cells, 5, &[1, 2], &[1, 1], None);
        assert_eq!(&m[..5], &[0.0, 0.0, MASKED, MASKED, MASKED]);
        assert_eq!(&m[5..], &[0.0, 0.0, MASKED, 0.0, MASKED]);
        let m = build_mask(&cells, 5, &[0], &[2], None);
        assert_eq!(m, vec![MASKED, MASKED, 0.0, MASKED, MASKED]);
        let m = build_mask(&cells, 5, &[2], &[1], Some(2));
        assert_eq!(m, vec![MASKED, 0.0, MASKED, 0.0, MASKED]);
    }
}
