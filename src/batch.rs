//! The batch a caller decodes: tokens with their positions, sequences and whether their
//! logits are wanted. Plain data at the bottom of the crate: the memory splits it into
//! ubatches, the context checks and decodes it, the engine builds it.

/// Set in the id a caller gives a position it fills with input rows instead of a token
/// (the engine's image placeholders): no vocabulary reaches it, and state files keep such
/// ids as they keep token ids.
pub const ROW_ID_BIT: u32 = 1 << 31;

/// Tokens to decode: for each, its position, its sequences (bit set) and whether its
/// logits are wanted.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<i32>,
    pub seq: Vec<u64>,
    pub logits: Vec<bool>,
    /// Input rows in place of the tokens' embeddings (llama.cpp's `llama_batch.embd`: an
    /// image's, n_embd values per token, token after token); empty for a batch of token
    /// ids. The token ids of such a batch are not read.
    pub embd: Vec<f32>,
    /// Every token sees every cell of its sequences, later ones in the batch included
    /// (llama.cpp's `llama_set_causal_attn(false)`, which its mtmd helper sets around an
    /// image whose tokens attend to each other, as Gemma 3's do).
    pub non_causal: bool,
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
            ..Default::default()
        }
    }
}
