//! llama-bench's measurements on an engine: pp (a prompt of n tokens in one batch) and tg
//! (n tokens generated one at a time), each at a depth of tokens already cached, over
//! repetitions after one warm-up. Front ends (`wgllm bench`, the desktop app) print them.

use super::{Engine, EngineError};
use crate::context::{Batch, Context};
use web_time::Instant;

/// One benchmark run's settings (llama-bench's -p, -n, -r, -d).
#[derive(Clone, Copy, Debug)]
pub struct BenchParams {
    pub n_prompt: u32,
    pub n_gen: u32,
    pub reps: u32,
    pub n_depth: u32,
}

/// One test's result: its llama-bench name (`pp512`, `tg128 @ d4096`) and the tokens
/// per second of each timed repetition.
#[derive(Clone, Debug)]
pub struct BenchResult {
    pub test: String,
    pub rates: Vec<f64>,
}

impl BenchResult {
    /// Mean and sample standard deviation of the rates.
    pub fn mean_sd(&self) -> (f64, f64) {
        let v = &self.rates;
        if v.is_empty() {
            return (0.0, 0.0);
        }
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let var = if v.len() > 1 {
            v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
        } else {
            0.0
        };
        (m, var.sqrt())
    }
}

/// The context size and batch a benchmark needs at least.
pub fn min_context(p: &BenchParams) -> (u32, u32) {
    (p.n_depth + p.n_prompt.max(p.n_gen) + 8, p.n_prompt)
}

/// Runs the pp and tg tests (a count of 0 skips one), calling `on_result` after each.
/// Tokens are deterministic pseudo-random ids, as llama-bench feeds random ones. The
/// engine's sessions must be idle: the benchmark uses the whole cache.
pub fn run(
    engine: &mut Engine,
    p: &BenchParams,
    on_result: &mut dyn FnMut(&BenchResult),
) -> Result<(), EngineError> {
    let n_vocab = engine.model.hp.n_vocab;
    let mut s = 12345u64;
    let mut rand_tok = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) % n_vocab as u64) as u32
    };
    let ctx = engine.context_mut();
    let depth = p.n_depth as i32;
    let at = if depth > 0 {
        format!(" @ d{depth}")
    } else {
        String::new()
    };
    // The depth is filled once (untimed); each repetition then removes its own tokens.
    ctx.clear();
    let depth_toks: Vec<u32> = (0..p.n_depth).map(|_| rand_tok()).collect();
    decode_chunks(ctx, &depth_toks)?;
    let rewind = |ctx: &mut Context| ctx.seq_rm(None, depth, -1);
    if p.n_prompt > 0 {
        let mut rates = Vec::new();
        for rep in 0..=p.reps {
            let toks: Vec<u32> = (0..p.n_prompt).map(|_| rand_tok()).collect();
            rewind(ctx)?;
            let t0 = Instant::now();
            ctx.decode(&Batch::simple(&toks, depth, false))?;
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                rates.push(p.n_prompt as f64 / dt); // rep 0 warms up (pipelines, graphs)
            }
        }
        on_result(&BenchResult {
            test: format!("pp{}{at}", p.n_prompt),
            rates,
        });
    }
    if p.n_gen > 0 {
        let mut rates = Vec::new();
        for rep in 0..=p.reps {
            rewind(ctx)?;
            let t0 = Instant::now();
            for i in 0..p.n_gen {
                let t = rand_tok();
                ctx.decode(&Batch::simple(&[t], depth + i as i32, true))?;
            }
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                rates.push(p.n_gen as f64 / dt);
            }
        }
        on_result(&BenchResult {
            test: format!("tg{}{at}", p.n_gen),
            rates,
        });
    }
    ctx.clear();
    Ok(())
}

fn decode_chunks(ctx: &mut Context, toks: &[u32]) -> Result<(), EngineError> {
    let nb = ctx.params.n_batch as usize;
    for (i, c) in toks.chunks(nb).enumerate() {
        ctx.decode(&Batch::simple(c, (i * nb) as i32, false))?;
    }
    Ok(())
}
