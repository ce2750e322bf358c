//! A prompt with images as the language model reads it, split as llama.cpp's mtmd splits
//! it: each media marker in the text becomes the projector's opening text, the image's
//! tokens and its closing text (Gemma 3: `<start_of_image>`, 256 embeddings,
//! `<end_of_image>`); the text between images is tokenized part by part (special tokens
//! recognised, BOS only before the first part), and empty parts are dropped. A tiled
//! image (SmolVLM) puts tokens of its own between its tiles: [`TileTokens`].

use super::mmproj::Projector;
use super::VisionError;
use crate::tokenizer::Tokenizer;

/// llama.cpp's default media marker, which a prompt places its images with.
pub const MEDIA_MARKER: &str = "<__media__>";

/// A run of a prompt: token ids, or the `n`-th image of the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptChunk {
    Text(Vec<u32>),
    Image(usize),
}

impl Projector {
    /// The text the language model reads before and after an image's tokens.
    pub fn image_wrap(self) -> (&'static str, &'static str) {
        match self {
            Projector::Gemma3 => ("<start_of_image>", "<end_of_image>"),
            Projector::Idefics3 => ("", ""),
            Projector::Qwen25vl => ("<|vision_start|>", "<|vision_end|>"),
        }
    }

    /// Whether an image's tokens attend to each other both ways in the language model
    /// (llama.cpp's `mtmd_decode_use_non_causal`: Gemma 3's do).
    pub fn non_causal(self) -> bool {
        match self {
            Projector::Gemma3 => true,
            Projector::Idefics3 | Projector::Qwen25vl => false,
        }
    }

    /// Whether an image is cut into tiles and a global view, each read by the encoder
    /// on its own.
    pub fn tiles(self) -> bool {
        self == Projector::Idefics3
    }
}

/// The tokens around a tiled image's tiles, as llama.cpp's mtmd places them for SmolVLM:
/// each tile after `<fake_token_around_image><row_R_col_C>` (1-based, special tokens
/// parsed), a newline after each row but the last, then the global view between
/// `\n\n<fake_token_around_image><global-img>` and `<fake_token_around_image>`. The fixed
/// tokens are looked up in the vocabulary by their text, as mtmd does (the first id
/// whose piece it is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileTokens {
    pub row_end: Vec<u32>,
    pub global_start: Vec<u32>,
    pub global_end: Vec<u32>,
}

impl TileTokens {
    /// The tokens for `projector`'s tiles in `tok`'s vocabulary (`None` for a projector
    /// that does not tile); refuses a vocabulary without them, as no image could be
    /// placed (SmolVLM's language model adds them to SmolLM2's).
    pub fn lookup(tok: &Tokenizer, projector: Projector) -> Result<Option<Self>, VisionError> {
        if !projector.tiles() {
            return Ok(None);
        }
        let wanted = ["\n", "\n\n", "<fake_token_around_image>", "<global-img>"];
        let mut found = [None; 4];
        for id in 0..tok.n_vocab() as u32 {
            let piece = tok.token_to_piece(id, true);
            for (slot, w) in found.iter_mut().zip(wanted) {
                if slot.is_none() && piece == w.as_bytes() {
                    *slot = Some(id);
                }
            }
            if found.iter().all(Option::is_some) {
                break;
            }
        }
        let id = |i: usize| {
            found[i].ok_or_else(|| VisionError::Image {
                what: "placement".into(),
                msg: format!(
                    "the language model's vocabulary has no {:?} token, which a {} projector places around its tiles: this mmproj belongs to another model",
                    wanted[i],
                    projector.name()
                ),
            })
        };
        Ok(Some(TileTokens {
            row_end: vec![id(0)?],
            global_start: vec![id(1)?, id(2)?, id(3)?],
            global_end: vec![id(2)?],
        }))
    }

    /// The tokens before the tile of row `row` and column `col` (both from 1).
    pub fn tile_start(tok: &Tokenizer, row: u32, col: u32) -> Vec<u32> {
        tok.encode(
            &format!("<fake_token_around_image><row_{row}_col_{col}>"),
            false,
            true,
        )
    }
}

/// `text` with one `marker` per image (the CLI's [`MEDIA_MARKER`]; a server's own, which
/// a client's text cannot hold by chance), as chunks (see the module docs); refuses a
/// count of markers other than `n_images`.
pub fn tokenize_with_images(
    tok: &Tokenizer,
    text: &str,
    marker: &str,
    projector: Projector,
    n_images: usize,
) -> Result<Vec<PromptChunk>, VisionError> {
    let n_markers = text.matches(marker).count();
    if n_markers != n_images {
        return Err(VisionError::Image {
            what: "prompt".into(),
            msg: format!(
                "has {n_markers} {marker} markers for {n_images} images: place one marker per image"
            ),
        });
    }
    let (open, close) = projector.image_wrap();
    let wrapped = text.replace(marker, &format!("{open}{marker}{close}"));
    let mut chunks = Vec::new();
    for (i, part) in wrapped.split(marker).enumerate() {
        if i > 0 {
            chunks.push(PromptChunk::Image(i - 1));
        }
        if !part.is_empty() {
            chunks.push(PromptChunk::Text(tok.encode(part, i == 0, true)));
        }
    }
    Ok(chunks)
}
