//! `wgllm synth`: writes a llama-shaped GGUF with random weights, for benchmarks at sizes
//! no test model has (`--shape 7b`), loadable by llama.cpp too.

use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::gguf::{quant, GgufFile};
use wgllm::model::synth::{synth_llama, vocab_metadata, SynthShape};

#[derive(Args)]
pub struct SynthArgs {
    /// A GGUF whose tokenizer (all `tokenizer.*` metadata) the new file takes.
    #[arg(long = "vocab-from")]
    pub vocab_from: PathBuf,
    /// Model shape: 135m, 1b or 7b.
    #[arg(long, default_value = "7b")]
    pub shape: String,
    /// Weight type of the matrices: any type wgllm can quantize to (q4_0, q5_1, q8_0, f16, …).
    #[arg(long = "type", default_value = "q4_0")]
    pub ty: String,
    /// Write only the metadata (a vocabulary file, as llama.cpp's ggml-vocab-*.gguf).
    #[arg(long)]
    pub vocab_only: bool,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

pub fn synth(a: &SynthArgs) -> Result<()> {
    let Some(shape) = SynthShape::preset(&a.shape) else {
        bail!(
            "unknown shape `{}` (--shape takes one of: {})",
            a.shape,
            SynthShape::PRESETS
        );
    };
    let ty = match quant::format_by_name(&a.ty) {
        Some(f) if f.quantizer().is_some() => f.ty(),
        _ => bail!(
            "unknown weight type `{}` (--type takes one of: {})",
            a.ty,
            quant::quantizable_names()
        ),
    };
    let bs = ty.block_size() as u32;
    if !shape.n_embd.is_multiple_of(bs) || !shape.n_ff.is_multiple_of(bs) {
        bail!(
            "{ty} stores rows in blocks of {bs} weights, and the {} shape's rows of {} and {} \
             are not whole blocks",
            a.shape,
            shape.n_embd,
            shape.n_ff
        );
    }
    let src = GgufFile::open(&a.vocab_from)?;
    let n_vocab = src
        .get_array("tokenizer.ggml.tokens")
        .with_context(|| format!("{} has no vocabulary", a.vocab_from.display()))?
        .len() as u64;
    log::info!(
        "writing {} ({:?}, {ty}, {n_vocab} tokens)",
        a.output.display(),
        shape
    );
    let w = synth_llama(shape, ty, vocab_metadata(&src), n_vocab, 0.02, a.vocab_only);
    w.write(&a.output)
        .with_context(|| format!("writing {}", a.output.display()))?;
    Ok(())
}
