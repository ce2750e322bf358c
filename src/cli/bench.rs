//! `wgllm bench`: llama-bench's pp (prompt processing) and tg (generation) tests, as a
//! markdown table of tokens per second, mean ± standard deviation over repetitions.

use super::{load_model, new_context, ModelArgs};
use anyhow::Result;
use clap::Args;
use std::time::Instant;
use wgllm::context::Batch;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the pp test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: u32,
    /// Generated tokens for the tg test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: u32,
    /// Repetitions.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: u32,
    /// Tokens already in the cache before each test (llama-bench's -d): the cost of a
    /// step with a full cache rather than an empty one.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub n_depth: u32,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (m, var.sqrt())
}

pub fn bench(a: &BenchArgs) -> Result<()> {
    let mut margs = a.model.clone();
    margs.ctx_size = margs.ctx_size.max(a.n_depth + a.n_prompt.max(a.n_gen) + 8);
    margs.batch_size = margs.batch_size.max(a.n_prompt);
    let loaded = load_model(&margs)?;
    let model = &loaded.model;
    let mut ctx = new_context(model, &margs)?;
    let n_vocab = model.hp.n_vocab;
    // Deterministic pseudo-random tokens, as llama-bench uses random ones.
    let mut s = 12345u64;
    let mut rand_tok = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) % n_vocab as u64) as u32
    };
    let size_mib = model.weights.gpu_bytes as f64 / (1 << 20) as f64;
    let backend = format!("wgpu/{}", model.gpu.info.backend);
    println!("| model | size | backend | device | test | t/s |");
    println!("| --- | ---: | --- | --- | ---: | ---: |");
    let depth = a.n_depth as i32;
    let at = if depth > 0 {
        format!(" @ d{depth}")
    } else {
        String::new()
    };
    // Fills the cache with `depth` tokens once (untimed), as llama-bench does before a
    // test; each repetition then removes its own tokens, so a deep cache is filled only once.
    let fill = |ctx: &mut wgllm::context::Context, toks: &[u32]| -> Result<()> {
        ctx.clear();
        let nb = ctx.params.n_batch as usize;
        for (i, c) in toks.chunks(nb).enumerate() {
            ctx.decode(&Batch::simple(c, (i * nb) as i32, false))?;
        }
        Ok(())
    };
    let depth_toks: Vec<u32> = (0..a.n_depth).map(|_| rand_tok()).collect();
    fill(&mut ctx, &depth_toks)?;
    let rewind = |ctx: &mut wgllm::context::Context| ctx.seq_rm(None, depth, -1);
    let row = |test: String, rates: &[f64]| {
        let (m, sd) = mean_sd(rates);
        println!(
            "| {} | {:.2} MiB | {} | {} | {} | {:.2} ± {:.2} |",
            model.name, size_mib, backend, model.gpu.info.name, test, m, sd
        );
    };
    if a.n_prompt > 0 {
        let mut rates = Vec::new();
        for rep in 0..=a.reps {
            let toks: Vec<u32> = (0..a.n_prompt).map(|_| rand_tok()).collect();
            rewind(&mut ctx)?;
            let t0 = Instant::now();
            ctx.decode(&Batch::simple(&toks, depth, false))?;
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                rates.push(a.n_prompt as f64 / dt); // rep 0 warms up (pipelines, graphs)
            }
        }
        row(format!("pp{}{at}", a.n_prompt), &rates);
    }
    if a.n_gen > 0 {
        let mut rates = Vec::new();
        for rep in 0..=a.reps {
            rewind(&mut ctx)?;
            let t0 = Instant::now();
            for i in 0..a.n_gen {
                let t = rand_tok();
                ctx.decode(&Batch::simple(&[t], depth + i as i32, true))?;
            }
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                rates.push(a.n_gen as f64 / dt);
            }
        }
        row(format!("tg{}{at}", a.n_gen), &rates);
    }
    Ok(())
}
