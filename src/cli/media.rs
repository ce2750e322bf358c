//! llama-mtmd-cli's image flags for `run` and `chat`: the vision encoder (`--mmproj`)
//! and the images (`--image`), read and prepared before anything is generated.

use super::ModelArgs;
use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wgllm::engine::{Engine, PreparedImage};
use wgllm::vision::{decode_image, ImagePrep, MEDIA_MARKER};

/// The vision encoder's flags, as llama.cpp spells them (`run`, `chat` and `serve`).
#[derive(Args, Clone, Debug, Default)]
pub struct EncoderArgs {
    /// The model's vision encoder: an mmproj GGUF (llama.cpp's `--mmproj`); prompts and
    /// requests may then hold images.
    #[arg(long = "mmproj", visible_alias = "mm")]
    pub mmproj: Option<PathBuf>,
    /// With -hf, leave out the repository's mmproj (by default it is downloaded and
    /// loaded with the model, as llama.cpp does).
    #[arg(
        long = "no-mmproj",
        visible_alias = "no-mmproj-auto",
        conflicts_with = "mmproj"
    )]
    pub no_mmproj: bool,
    /// The fewest tokens an image takes, for an encoder that reads images at their own
    /// size (Qwen2.5-VL); smaller images are scaled up (default: the file's, or 8).
    #[arg(long = "image-min-tokens", value_name = "N")]
    pub image_min_tokens: Option<u32>,
    /// The most tokens an image takes, for an encoder that reads images at their own
    /// size; larger images are scaled down (default: the file's, or 4096, and what the
    /// device's largest buffer allows).
    #[arg(long = "image-max-tokens", value_name = "N")]
    pub image_max_tokens: Option<u32>,
}

impl EncoderArgs {
    /// The image token bounds given.
    pub fn image_tokens(&self) -> wgllm::vision::ImageTokens {
        wgllm::vision::ImageTokens {
            min: self.image_min_tokens,
            max: self.image_max_tokens,
        }
    }
}

#[derive(Args, Clone, Debug, Default)]
pub struct MediaArgs {
    #[command(flatten)]
    pub encoder: EncoderArgs,
    /// An image for the prompt (PNG, JPEG, WebP, BMP, PNM); repeat the flag or separate
    /// files with commas for several. Each goes where the prompt has a `<__media__>`
    /// marker, or before the prompt's text where it has none (as llama-mtmd-cli does).
    #[arg(long = "image", value_delimiter = ',')]
    pub images: Vec<PathBuf>,
}

impl MediaArgs {
    /// Refuses images without an encoder, before the model is loaded.
    pub fn check(&self) -> Result<()> {
        if !self.images.is_empty() && self.encoder.mmproj.is_none() {
            bail!("--image needs the model's vision encoder: pass --mmproj FILE (the mmproj GGUF beside the model)");
        }
        Ok(())
    }

    /// The model's path, and with -hf (unless `--no-mmproj`, and where `want`) the
    /// repository's mmproj taken as `--mmproj`; `model` then names the file (-m).
    pub fn resolve(&mut self, model: &mut ModelArgs, want: bool) -> Result<()> {
        if model.model.is_some() {
            return Ok(());
        }
        let want = want && self.encoder.mmproj.is_none() && !self.encoder.no_mmproj;
        let (path, mmproj) = model
            .hub
            .resolve_with_mmproj(want)?
            .ok_or_else(|| anyhow::anyhow!("a model is needed: -m FILE or -hf ORG/NAME[:QUANT]"))?;
        model.model = Some(path);
        if mmproj.is_some() {
            self.encoder.mmproj = mmproj;
        }
        Ok(())
    }

    /// Loads the encoder into `engine` (with `--mmproj`).
    pub fn attach(&self, engine: &mut Engine) -> Result<()> {
        if let Some(p) = &self.encoder.mmproj {
            let path = p.display().to_string();
            if !p.exists() {
                bail!("mmproj file {path} does not exist");
            }
            engine.attach_vision_with(&path, self.encoder.image_tokens())?;
        }
        Ok(())
    }

    /// The `--image` files, decoded and prepared for the engine's encoder.
    pub fn prepare(&self, engine: &Engine) -> Result<Vec<Arc<PreparedImage>>> {
        let Some(prep) = engine.image_prep() else {
            return Ok(Vec::new());
        };
        self.images.iter().map(|p| prepare_file(&prep, p)).collect()
    }
}

/// An image file decoded and prepared for `prep`'s encoder.
pub fn prepare_file(prep: &ImagePrep, path: &Path) -> Result<Arc<PreparedImage>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading the image {}", path.display()))?;
    let img = decode_image(&bytes, &path.display().to_string())?;
    Ok(PreparedImage::new(prep, &img)?)
}

/// `text` with a media marker for each of `n` images before it, where it has none (as
/// llama-mtmd-cli places images: most models expect them before the question).
pub fn with_markers(text: &str, n: usize) -> String {
    if n == 0 || text.contains(MEDIA_MARKER) {
        return text.to_string();
    }
    format!("{}{text}", MEDIA_MARKER.repeat(n))
}
