//! Images in a session's input. An image's tokens have no ids in the vocabulary: each
//! takes a placeholder id made from the image's hash (keyed by a secret of the process,
//! see [`ImagePrep::image_hash`]) and its index in the image (the high bit set, so no
//! vocabulary reaches it). The placeholders keep every token-based
//! part of the engine working on prompts with images: two prompts share a prefix through
//! an image exactly when they hold the same image there (llama-server compares images by
//! hash the same way), a cache's token list records which image its cells came from, and
//! an image's first token is told from a later one by its id alone, so no cut of the
//! cache (a reused prefix, a context shift) ever keeps part of an image.

use crate::tokenizer::Tokenizer;
use crate::vision::{
    tokenize_with_images, EncoderInput, ImagePrep, PromptChunk, RgbImage, TileTokens, VisionError,
};
use std::sync::Arc;

/// Set in every image placeholder id, never in a vocabulary's.
const IMAGE_BIT: u32 = crate::batch::ROW_ID_BIT;

/// What the encoder reads in one go, and the placeholders it fills: a whole image, or
/// one tile of a tiled image (llama.cpp's image chunk).
#[derive(Clone, Debug)]
pub struct ImageChunk {
    /// The encoder's input ([`ImagePrep::preprocess`]).
    pub pixels: Arc<EncoderInput>,
    /// [`ImagePrep::image_hash`] of the image, mixed with the tile's index.
    pub hash: u64,
    pub n_tokens: u32,
    /// Its tokens attend to each other both ways (Gemma 3).
    pub non_causal: bool,
    /// Its tokens across and down, for a model that places them by M-RoPE (set for an
    /// encoder that reads images at their own size; `None`: a run of positions).
    pub grid: Option<(u32, u32)>,
    /// Its image's first chunk, and its last (both for an image read whole): the cache
    /// keeps or drops the span from the first to the last as one.
    pub first: bool,
    pub last: bool,
}

impl ImageChunk {
    /// The placeholder ids of its tokens, in order.
    pub fn tokens(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.n_tokens).map(|k| image_token(self.hash, k))
    }
}

/// An image prepared for the encoder: its chunks and how they are laid out.
#[derive(Clone, Debug)]
pub struct PreparedImage {
    /// The image itself, or its tiles row by row and then its global view.
    pub chunks: Vec<Arc<ImageChunk>>,
    /// Tiles across and down; `None` for an image read whole.
    pub grid: Option<(u32, u32)>,
}

impl PreparedImage {
    /// Prepares `img` for the encoder `prep` describes; refuses an image the projector
    /// cannot tile.
    pub fn new(prep: &ImagePrep, img: &RgbImage) -> Result<Arc<PreparedImage>, VisionError> {
        let split = prep.split(img)?;
        let hash = prep.image_hash(img);
        let whole = split.grid.is_none();
        let n = split.parts.len();
        let chunks = (split.parts.iter().enumerate())
            .map(|(k, part)| {
                let input = prep.preprocess(part);
                let grid = (prep.dynamic.is_some())
                    .then(|| (input.width / prep.cell, input.height / prep.cell));
                Arc::new(ImageChunk {
                    n_tokens: prep.tokens_for_input(input.width, input.height),
                    grid,
                    pixels: Arc::new(input),
                    // A tile's hash: the image's, mixed with its index (splitmix64's
                    // step), so that no two tiles share placeholders.
                    hash: match whole {
                        true => hash,
                        false => mix(hash.wrapping_add((k as u64 + 1).wrapping_mul(GOLDEN))),
                    },
                    non_causal: prep.projector.non_causal(),
                    first: k == 0,
                    last: k + 1 == n,
                })
            })
            .collect();
        Ok(Arc::new(PreparedImage {
            chunks,
            grid: split.grid,
        }))
    }

    /// Image tokens in all its chunks.
    pub fn n_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.n_tokens as usize).sum()
    }
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A prompt's tokens, image placeholders among them, and its image chunks in order.
#[derive(Clone, Debug, Default)]
pub struct MediaPrompt {
    pub tokens: Vec<u32>,
    pub images: Vec<Arc<ImageChunk>>,
}

impl MediaPrompt {
    /// A prompt of text only.
    pub fn text(tokens: Vec<u32>) -> Self {
        MediaPrompt {
            tokens,
            images: Vec::new(),
        }
    }

    /// `text` with one `marker` ([`crate::vision::MEDIA_MARKER`], or a server's own) per
    /// image of `images` (prepared for the encoder `prep` describes, bound to `tok`'s
    /// vocabulary where it tiles), tokenized as llama.cpp's mtmd does (BOS before the
    /// first part when `add_bos`), each image's placeholders in its marker's place
    /// (a tiled image's between the tokens of [`TileTokens`]).
    pub fn build(
        tok: &Tokenizer,
        prep: &ImagePrep,
        text: &str,
        marker: &str,
        images: &[Arc<PreparedImage>],
        add_bos: bool,
    ) -> Result<MediaPrompt, VisionError> {
        let chunks = tokenize_with_images(tok, text, marker, prep.projector, images.len())?;
        let mut out = MediaPrompt::default();
        for c in chunks {
            match c {
                PromptChunk::Text(mut ids) => {
                    // tokenize_with_images adds BOS before the first part where the model
                    // wants one; a later turn's text goes without.
                    if !add_bos
                        && out.tokens.is_empty()
                        && tok.add_bos()
                        && ids.first().copied() == tok.bos()
                    {
                        ids.remove(0);
                    }
                    out.tokens.extend(ids)
                }
                PromptChunk::Image(i) => out.place(tok, prep, &images[i])?,
            }
        }
        Ok(out)
    }

    fn push_chunk(&mut self, chunk: &Arc<ImageChunk>) {
        self.tokens.extend(chunk.tokens());
        self.images.push(chunk.clone());
    }

    /// `img`'s chunks, with the tokens between tiles where it is tiled.
    fn place(
        &mut self,
        tok: &Tokenizer,
        prep: &ImagePrep,
        img: &PreparedImage,
    ) -> Result<(), VisionError> {
        let Some((cols, rows)) = img.grid else {
            img.chunks.iter().for_each(|c| self.push_chunk(c));
            return Ok(());
        };
        let tt = prep.tile_tokens.as_ref().ok_or_else(|| VisionError::Image {
            what: "placement".into(),
            msg: "a tiled image needs its encoder bound to the language model's vocabulary (ImagePrep::bind_vocab)".into(),
        })?;
        if img.chunks.len() != (cols * rows + 1) as usize {
            return Err(VisionError::Image {
                what: "placement".into(),
                msg: format!(
                    "{} chunks for {cols} x {rows} tiles and a global view",
                    img.chunks.len()
                ),
            });
        }
        for y in 0..rows {
            for x in 0..cols {
                self.tokens
                    .extend(TileTokens::tile_start(tok, y + 1, x + 1));
                self.push_chunk(&img.chunks[(y * cols + x) as usize]);
            }
            if y + 1 < rows {
                self.tokens.extend(&tt.row_end);
            }
        }
        self.tokens.extend(&tt.global_start);
        self.push_chunk(&img.chunks[(cols * rows) as usize]);
        self.tokens.extend(&tt.global_end);
        Ok(())
    }
}

/// A media marker of this process's own for conversations (`wgllm chat`, the app): text a
/// user types or a model writes cannot hold it by chance, so a literal `<__media__>` in a
/// message stays text.
pub fn private_marker() -> &'static str {
    static MARKER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARKER.get_or_init(|| {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        format!("<__media_{:016x}__>", state.hash_one(0u8))
    })
}

/// The placeholder id of token `k` of the image hashed `hash`: consecutive ids (modulo
/// 2^31) from a start the hash gives.
pub fn image_token(hash: u64, k: u32) -> u32 {
    let start = (hash ^ (hash >> 32)) as u32;
    IMAGE_BIT | (start.wrapping_add(k) & !IMAGE_BIT)
}

/// Whether `t` is an image's placeholder.
pub fn is_image_token(t: u32) -> bool {
    t & IMAGE_BIT != 0
}

/// Whether `tokens[i]` is an image token after its image's first (the one before it is
/// of the same image): a cut before it would split the image.
pub fn inside_image(tokens: &[u32], i: usize) -> bool {
    i > 0
        && i < tokens.len()
        && is_image_token(tokens[i])
        && is_image_token(tokens[i - 1])
        && (tokens[i - 1].wrapping_add(1) & !IMAGE_BIT) == (tokens[i] & !IMAGE_BIT)
}

/// The largest `m <= n` such that `tokens[..m]` holds no part of an image: `n` moved back
/// to the start of the image it would cut.
pub fn whole_images(tokens: &[u32], n: usize) -> usize {
    let mut m = n.min(tokens.len());
    while inside_image(tokens, m) {
        m -= 1;
    }
    m
}

/// The images of `tokens` as (start, length) runs of placeholders.
pub fn image_runs(tokens: &[u32]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if !is_image_token(t) {
            continue;
        }
        match runs.last_mut() {
            Some((s, n)) if *s + *n == i && inside_image(tokens, i) => *n += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(hash: u64, n: u32) -> Vec<u32> {
        (0..n).map(|k| image_token(hash, k)).collect()
    }

    #[test]
    fn placeholders_mark_whole_images() {
        // Text, an image of 4, the same image again right after it, text, another image
        // whose ids wrap around 2^31.
        let mut t = vec![1, 2];
        t.extend(image(42, 4));
        t.extend(image(42, 4));
        t.push(3);
        let w = image(0x7fff_fffe, 3);
        assert_eq!(w[2], IMAGE_BIT, "the ids wrap");
        t.extend(&w);
        assert!(w.iter().all(|&x| is_image_token(x)));
        assert_eq!(image_runs(&t), vec![(2, 4), (6, 4), (11, 3)]);
        assert_eq!(whole_images(&t, 4), 2);
        assert_eq!(whole_images(&t, 6), 6, "between the two copies");
        assert_eq!(whole_images(&t, 9), 6);
        assert_eq!(whole_images(&t, 10), 10);
        assert_eq!(whole_images(&t, 13), 11);
        assert_eq!(whole_images(&t, 99), 14);
        // Another image at the same place differs at its first token.
        assert_ne!(image_token(42, 0), image_token(43, 0));
        assert!(!is_image_token(262_143));
    }
}
