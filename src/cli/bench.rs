//! `wgllm bench`: llama-bench's pp (prompt processing) and tg (generation) tests, as a
//! markdown table of tokens per second, mean ± standard deviation over repetitions.

use super::{load_engine, ModelArgs};
use anyhow::Result;
use clap::Args;
use wgllm::engine::bench::{self, BenchParams};

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

pub fn bench(a: &BenchArgs) -> Result<()> {
    let p = BenchParams {
        n_prompt: a.n_prompt,
        n_gen: a.n_gen,
        reps: a.reps,
        n_depth: a.n_depth,
    };
    let (min_ctx, min_batch) = bench::min_context(&p);
    let mut opts = a.model.options()?;
    opts.n_ctx = opts.n_ctx.max(min_ctx);
    opts.n_batch = opts.n_batch.max(min_batch);
    let mut engine = load_engine(&a.model, &opts)?;
    let size_mib = engine.model.weights.gpu_bytes as f64 / (1 << 20) as f64;
    let backend = format!("wgpu/{}", engine.model.gpu.info.backend);
    let (name, device) = (
        engine.model.name.clone(),
        engine.model.gpu.info.name.clone(),
    );
    println!("| model | size | backend | device | test | t/s |");
    println!("| --- | ---: | --- | --- | ---: | ---: |");
    bench::run(&mut engine, &p, &mut |r| {
        let (m, sd) = r.mean_sd();
        println!(
            "| {name} | {size_mib:.2} MiB | {backend} | {device} | {} | {m:.2} ± {sd:.2} |",
            r.test
        );
    })?;
    Ok(())
}
