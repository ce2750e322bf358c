//! `wgllm image-embed`: an image's embeddings from an mmproj file's vision encoder, as
//! llama.cpp's mtmd writes them with `MTMD_DEBUG_EMBEDDINGS=FILE` (i32 tokens, i32 width,
//! then the f32 rows), for comparing the two encoders on the same file and image.

use super::GpuArgs;
use anyhow::{Context as _, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::gpu::Gpu;
use wgllm::vision::{decode_image, VisionEncoder};

#[derive(Args)]
pub struct ImageEmbedArgs {
    /// The vision encoder: an mmproj GGUF (llama.cpp's `--mmproj`).
    #[arg(long = "mmproj", visible_alias = "mm")]
    pub mmproj: PathBuf,
    /// The image: PNG, JPEG, WebP, BMP or PNM.
    #[arg(long)]
    pub image: PathBuf,
    /// Write the embeddings here (llama.cpp's MTMD_DEBUG_EMBEDDINGS layout).
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

pub fn image_embed(a: &ImageEmbedArgs) -> Result<()> {
    let bytes =
        std::fs::read(&a.image).with_context(|| format!("reading {}", a.image.display()))?;
    let img = decode_image(&bytes, &a.image.display().to_string())?;
    let gpu = Gpu::new(&a.gpu.options()?)?;
    let mmproj = a.mmproj.display().to_string();
    let enc = VisionEncoder::load(gpu, &mmproj)?;
    let t0 = std::time::Instant::now();
    let emb = enc.encode(&img)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let width = enc.n_embd_out() as usize;
    let n_tok = emb.len() / width;
    let n = emb.len() as f64;
    let mean = emb.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = emb.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    println!(
        "{}: {}x{} pixels -> {n_tok} tokens of {width} in {ms:.1} ms (mean {mean:.6}, std {:.6})",
        a.image.display(),
        img.width,
        img.height,
        var.sqrt()
    );
    if let Some(out) = &a.output {
        let mut bytes = Vec::with_capacity(8 + emb.len() * 4);
        bytes.extend((n_tok as i32).to_le_bytes());
        bytes.extend((width as i32).to_le_bytes());
        bytes.extend(bytemuck::cast_slice::<f32, u8>(&emb));
        std::fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
