//! A prompt with images as the language model reads it, split as llama.cpp's mtmd splits
//! it: each media marker in the text becomes the projector's opening text, the image's
//! tokens and its closing text (Gemma 3: `<start_of_image>`, 256 embeddings,
//! `<end_of_image>`); the text between images is tokenized part by part (special tokens
//! recognised, BOS only before the first part), and empty parts are dropped.

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
        }
    }

    /// Whether an image's tokens attend to each other both ways in the language model
    /// (llama.cpp's `mtmd_decode_use_non_causal`: Gemma 3's do).
    pub fn non_causal(self) -> bool {
        match self {
            Projector::Gemma3 => true,
        }
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
