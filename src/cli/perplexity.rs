//! `wgllm perplexity`: llama-perplexity's method — non-overlapping chunks of n_ctx tokens,
//! each scored on its second half, ending with "Final estimate: PPL = …".

use super::{load_model, new_context, ModelArgs};
use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use wgllm::context::Batch;

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

/// Negative log-likelihood of `target` under `logits` (log-softmax in f64).
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

pub fn perplexity(a: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let loaded = load_model(&a.model)?;
    let tok = &loaded.tokenizer;
    let mut ctx = new_context(&loaded.model, &a.model)?;
    let n_ctx = ctx.n_ctx() as usize;
    let tokens = tok.encode(&text, true, false);
    let mut n_chunk = tokens.len() / n_ctx;
    if a.chunks >= 0 {
        n_chunk = n_chunk.min(a.chunks as usize);
    }
    if n_chunk == 0 {
        bail!(
            "{} has {} tokens; perplexity needs at least 2 * n_ctx = {} (use a smaller -c)",
            a.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    eprintln!(
        "perplexity: {} tokens, {} chunks of {}, scoring the second half of each",
        tokens.len(),
        n_chunk,
        n_ctx
    );
    let n_vocab = loaded.model.hp.n_vocab as usize;
    let n_batch = ctx.params.n_batch as usize;
    let first = n_ctx / 2;
    let (mut sum, mut sum2, mut count) = (0.0f64, 0.0f64, 0usize);
    let start = Instant::now();
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let mut input = chunk.to_vec();
        if tok.add_bos() {
            if let Some(bos) = tok.bos() {
                input[0] = bos;
            }
        }
        ctx.clear();
        let mut logits = Vec::with_capacity(n_ctx * n_vocab);
        for (b, part) in input.chunks(n_batch).enumerate() {
            logits.extend(ctx.decode(&Batch::simple(part, (b * n_batch) as i32, true))?);
        }
        for j in first..n_ctx - 1 {
            let v = nll(&logits[j * n_vocab..(j + 1) * n_vocab], chunk[j + 1]);
            sum += v;
            sum2 += v * v;
            count += 1;
        }
        if i == 0 {
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {:.2} seconds per pass - ETA {:.1} s",
                secs,
                secs * n_chunk as f64
            );
        }
        print!("[{}]{:.4},", i + 1, (sum / count as f64).exp());
        use std::io::Write;
        std::io::stdout().flush()?;
    }
    println!();
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let unc = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    println!("Final estimate: PPL = {ppl:.4} +/- {unc:.5}");
    Ok(())
}
