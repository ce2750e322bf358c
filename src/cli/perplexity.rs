//! `wgllm perplexity`: llama-perplexity's method — non-overlapping chunks of n_ctx tokens,
//! each scored on its second half, ending with "Final estimate: PPL = …".

use super::{load_engine, ModelArgs};
use anyhow::{Context as _, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use wgllm::engine::perplexity;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Score at most this many chunks (-1: all).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub chunks: i64,
}

pub fn perplexity(a: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let mut engine = load_engine(&a.model, &a.model.options()?)?;
    let tokens = engine.tokenizer.encode(&text, true, false);
    let n_ctx = engine.n_ctx();
    eprintln!(
        "perplexity: {} tokens, {} chunks of {n_ctx}, scoring the second half of each",
        tokens.len(),
        perplexity::n_chunks(&engine, tokens.len(), a.chunks),
    );
    let start = Instant::now();
    let mut out = std::io::stdout();
    let result = perplexity::run(&mut engine, &tokens, a.chunks, &mut |c| {
        if c.chunk == 1 {
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {secs:.2} seconds per pass - ETA {:.1} s",
                secs * c.n_chunks as f64
            );
        }
        let _ = write!(out, "[{}]{:.4},", c.chunk, c.ppl).and_then(|_| out.flush());
    })
    .with_context(|| format!("scoring {}", a.file.display()))?;
    println!();
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        result.ppl, result.uncertainty
    );
    Ok(())
}
