//! The batch a caller decodes: tokens with their positions, sequences and whether their
//! logits are wanted. Plain data at the bottom of the crate: the memory splits it into
//! ubatches, the context checks and decodes it, the engine builds it.

/// Tokens to decode: for each, its position, its sequences (bit set) and whether its
/// logits are wanted.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<i32>,
    pub seq: Vec<u64>,
    pub logits: Vec<bool>,
}

impl Batch {
    /// One sequence (id 0) from `start_pos`; logits for the last token only, or for all.
    pub fn simple(tokens: &[u32], start_pos: i32, all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens.to_vec(),
            pos: (0..n as i32).map(|i| start_pos + i).collect(),
            seq: vec![1; n],
            logits: (0..n).map(|i| all_logits || i + 1 == n).collect(),
        }
    }
}
