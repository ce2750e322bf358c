//! Images in: the vision encoder of an mmproj file (llama.cpp's `clip.*` GGUF beside a
//! language model), run on the GPU like the language model, and the image preprocessing
//! it expects. An image becomes a block of embeddings as wide as the language model's
//! input, one row per image token.
//!
//! - `mmproj.rs`: the file's hyperparameters and weights, checked, on the device.
//! - `image.rs`: decoding a file's bytes into 8-bit RGB, refusing what would not fit
//!   before anything is allocated.
//! - `preprocess.rs`: the resize (Pillow's fixed-point filters, as llama.cpp's mtmd
//!   ports them), letterboxing, tiling, sizes in whole cells, and normalisation into the
//!   encoder's planar input.
//! - `encoder.rs`: the vision transformer and projector as one graph.
//! - `prompt.rs`: a prompt's text and images as the chunks the language model decodes.
//! - `reference.rs`: the encoder on the CPU in f64, for tests.
//!
//! Projectors: `gemma3` (SigLIP, 4 x 4 pooling), `idefics3` (SmolVLM: SigLIP on tiles
//! and a global view, pixel shuffle) and `qwen2.5vl_merger` (Qwen2.5-VL: images at their
//! own size, 2D rotary positions, window attention, a 2 x 2 merger). Others are refused
//! with their name.

mod encoder;
mod image;
mod mmproj;
mod preprocess;
mod prompt;
pub mod reference;

pub use encoder::{
    rotary_table, window_mask, EncoderInput, ImagePrep, ImageSplit, ImageTokens, VisionEncoder,
};
pub use image::{decode_image, decode_image_within, RgbImage, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE};
pub use mmproj::{ClipHparams, DynamicSize, Projector, VisionWeights};
pub use preprocess::{
    crop, fit_to_cells, letterbox, letterbox_to, normalize_planar, resize, resize_bilinear,
    tile_grid, tile_image, Filter, Tiles,
};
pub use prompt::{tokenize_with_images, PromptChunk, TileTokens, MEDIA_MARKER};

use crate::gguf::GgufError;
use crate::gpu::GpuError;

/// What can go wrong between an mmproj file or an image and its embeddings.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The mmproj file is readable but not one wgllm can run (what, and why).
    #[error("{path}: {msg}")]
    Mmproj { path: String, msg: String },
    /// An image that cannot be decoded or is too large.
    #[error("image {what}: {msg}")]
    Image { what: String, msg: String },
}
