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
    /// For a batch of one image's rows (raster order) of a model that places them by
    /// M-RoPE: the image's grid and where in it the batch starts.
    pub image: Option<ImagePiece>,
    /// Each token's M-RoPE position: given by the caller (one per token), or left empty
    /// and filled by the context for a model with M-RoPE.
    pub mrope: Vec<MropePos>,
}

/// A batch's part of an image: the image's tokens across (`nx`) and down (`ny`), and the
/// index of the batch's first token among them (an image longer than a batch is decoded
/// in pieces, as llama.cpp's mtmd helper decodes it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImagePiece {
    pub nx: u32,
    pub ny: u32,
    pub first: u32,
}

/// A token's position under M-RoPE (Qwen2-VL), as llama.cpp's mtmd places them: a text
/// token at time t has components (t, t, t); an image's tokens share the time t0 of the
/// image and take rows t0 + y and columns t0 + x; the token after an image has time
/// t0 + max(across, down). The cell's position stays the token's index in its sequence:
/// `next` is the time the token after this one takes, kept with the cell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MropePos {
    pub t: i32,
    pub row: i32,
    pub col: i32,
    pub next: i32,
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
