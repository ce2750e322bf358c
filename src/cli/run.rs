//! `wgllm run`: one prompt in, generated text out (stdout), logs and timings on stderr.

use super::{load_model, new_context, ModelArgs};
use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use wgllm::context::{Context, ContextError};
use wgllm::generate::{
    continue_generation, feed_prompt, Feeder, ShiftPolicy, Stop, Timings, Utf8Stream,
};
use wgllm::sample::{Sampler, SamplerParams};
use wgllm::tokenizer::Tokenizer;

/// Sampling flags, with llama.cpp's defaults.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed (-1: random).
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// Never end generation: end-of-generation tokens are not sampled.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    pub fn sampler(&self, tok: &Tokenizer) -> Result<Sampler> {
        if self.temp.is_nan()
            || self.top_p.is_nan()
            || self.min_p.is_nan()
            || self.repeat_penalty <= 0.0
        {
            bail!(
                "invalid sampling flags: --repeat-penalty must be positive and no value may be NaN"
            );
        }
        let seed = if self.seed < 0 {
            SamplerParams::RANDOM_SEED
        } else {
            self.seed as u64
        };
        Ok(Sampler::new(
            SamplerParams {
                temp: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                repeat_last_n: self.repeat_last_n,
                seed,
                banned: if self.ignore_eos {
                    tok.eog_tokens().collect()
                } else {
                    Vec::new()
                },
            },
            tok.n_vocab(),
        ))
    }
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Do not echo the prompt before the generated text.
    #[arg(long)]
    pub no_display_prompt: bool,
    /// Take the prompt literally (by default \n, \t, \\ … in -p are unescaped, as llama.cpp does).
    #[arg(long)]
    pub no_escape: bool,
    #[command(flatten)]
    pub shift: ShiftArgs,
    /// Print the KV cache cells after every decode (llama.cpp's -dkvc).
    #[arg(long = "dump-kv-cache", visible_alias = "dkvc")]
    pub dump_kv_cache: bool,
    /// Reuse the cache of an earlier run whose prompt shares a prefix with this one, and
    /// save this prompt's cache there (created if missing).
    #[arg(long = "prompt-cache")]
    pub prompt_cache: Option<PathBuf>,
    /// Use --prompt-cache without updating the file.
    #[arg(long = "prompt-cache-ro", requires = "prompt_cache")]
    pub prompt_cache_ro: bool,
}

/// What happens when the context fills: llama.cpp's flags.
#[derive(Args, Clone, Debug)]
pub struct ShiftArgs {
    /// Prompt tokens kept at a context shift (-1: the whole prompt).
    #[arg(long = "keep", default_value_t = 0, allow_negative_numbers = true)]
    pub keep: i32,
    /// Stop when the context is full instead of shifting it.
    #[arg(long = "no-context-shift")]
    pub no_context_shift: bool,
    /// Self-Extend group factor (1: off).
    #[arg(long = "grp-attn-n", visible_alias = "gan", default_value_t = 1)]
    pub ga_n: i32,
    /// Self-Extend group width.
    #[arg(long = "grp-attn-w", visible_alias = "gaw", default_value_t = 512)]
    pub ga_w: i32,
}

impl ShiftArgs {
    /// The policy for a prompt of `n_prompt` tokens (n_keep counts BOS as llama.cpp does).
    pub fn policy(&self, n_prompt: usize, add_bos: bool) -> Result<ShiftPolicy> {
        let n_keep = match self.keep {
            k if k < 0 => n_prompt as i32,
            k if k as usize > n_prompt => {
                bail!("--keep {k} is larger than the prompt ({n_prompt} tokens)")
            }
            k => (k + add_bos as i32).min(n_prompt as i32),
        };
        if self.ga_n < 1 {
            bail!("--grp-attn-n must be at least 1, got {}", self.ga_n);
        }
        if self.ga_n > 1 && (self.ga_w <= 0 || self.ga_w % self.ga_n != 0) {
            bail!(
                "--grp-attn-w ({}) must be a positive multiple of --grp-attn-n ({})",
                self.ga_w,
                self.ga_n
            );
        }
        Ok(ShiftPolicy {
            context_shift: !self.no_context_shift,
            n_keep,
            ga_n: self.ga_n,
            ga_w: self.ga_w,
        })
    }
}

/// llama.cpp's escape processing of -p.
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            Some(o) => {
                out.push('\\');
                out.push(o);
            }
            None => out.push('\\'),
        }
    }
    out
}

pub fn run(a: &RunArgs) -> Result<()> {
    // Checked before loading anything: the cache is reused by position, and Self-Extend
    // makes cached positions differ from the prompt's token indices.
    if a.prompt_cache.is_some() && a.shift.ga_n > 1 {
        bail!(
            "--prompt-cache cannot be used with Self-Extend (--grp-attn-n {} > 1): a cache is reused by position, and grouped positions no longer match the prompt's tokens",
            a.shift.ga_n
        );
    }
    let prompt = match (&a.prompt, &a.file) {
        (Some(p), _) if a.no_escape => p.clone(),
        (Some(p), _) => unescape(p),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt file {}", f.display()))?,
        (None, None) => bail!("no prompt: pass -p TEXT or -f FILE"),
    };
    if a.n_predict < -1 {
        bail!(
            "-n must be -1 (unlimited) or a token count, got {}",
            a.n_predict
        );
    }
    let loaded = load_model(&a.model)?;
    let tok = &loaded.tokenizer;
    let mut ctx = new_context(&loaded.model, &a.model)?;
    let tokens = tok.encode(&prompt, true, true);
    if tokens.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let n_ctx = ctx.n_ctx() as usize;
    if a.shift.ga_n == 1 && tokens.len() > n_ctx.saturating_sub(4) {
        bail!(
            "prompt is too long ({} tokens, max {}); use a larger context (-c) or a shorter prompt",
            tokens.len(),
            n_ctx.saturating_sub(4)
        );
    }
    let policy = a.shift.policy(tokens.len(), tok.add_bos())?;
    let mut sampler = a.sampling.sampler(tok)?;
    log::info!(
        "prompt: {} tokens, sampler seed {}",
        tokens.len(),
        sampler.seed()
    );
    let mut timings = Timings {
        load: loaded.load_time,
        ..Default::default()
    };
    let mut stdout = std::io::stdout().lock();
    if !a.no_display_prompt {
        write!(stdout, "{prompt}")?;
        stdout.flush()?;
    }
    let mut stream = Utf8Stream::default();
    let mut write_err = None;
    let cached = match &a.prompt_cache {
        Some(path) => reuse_prompt_cache(&mut ctx, path, &tokens)?,
        None => 0,
    };
    let mut feeder = Feeder::new(&mut ctx, policy)?;
    feeder.dump_cells = a.dump_kv_cache;
    feeder.n_past = cached as i32;
    let logits = match feed_prompt(&mut feeder, &mut sampler, &tokens, cached, &mut timings) {
        Err(ContextError::ContextFull { reason, .. }) => {
            bail!("the prompt does not fit in the context ({n_ctx} tokens): {reason}")
        }
        other => other?,
    };
    if let (Some(path), false) = (&a.prompt_cache, a.prompt_cache_ro) {
        feeder.ctx.state_save(path, &tokens, None)?;
    }
    let (_, stop) = continue_generation(
        &mut feeder,
        tok,
        &mut sampler,
        logits,
        a.n_predict,
        &mut timings,
        &mut |t| {
            let text = stream.push(&tok.token_to_piece(t, false));
            match write!(stdout, "{text}").and_then(|_| stdout.flush()) {
                Ok(()) => true,
                Err(e) => {
                    write_err = Some(e);
                    false
                }
            }
        },
    )?;
    if let Some(e) = write_err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    write!(stdout, "{}", stream.finish())?;
    writeln!(stdout)?;
    let n_shifts = feeder.ops.iter().filter(|o| o.op == "seq_rm").count();
    if n_shifts > 0 {
        log::info!("context shifts: {n_shifts}");
    }
    match stop {
        Stop::ContextFull(reason) => log::warn!(
            "stopped: the context ({} tokens) is full and {reason}",
            feeder.ctx.n_ctx()
        ),
        Stop::EndOfGeneration => log::info!("[end of text]"),
        _ => {}
    }
    eprintln!("{}", timings.report());
    Ok(())
}

/// Loads `path` (if it exists) and keeps the cells of the longest prefix its tokens share
/// with `prompt`, as llama.cpp's --prompt-cache does; returns how many prompt tokens need
/// no decoding. The last prompt token is always decoded again, for its logits.
fn reuse_prompt_cache(ctx: &mut Context, path: &std::path::Path, prompt: &[u32]) -> Result<usize> {
    if !path.exists() {
        log::info!(
            "prompt cache {} does not exist yet; it will be created",
            path.display()
        );
        return Ok(0);
    }
    let saved = ctx.state_load(path, None)?;
    let same = saved
        .tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let reuse = same.min(prompt.len() - 1);
    ctx.seq_rm(None, reuse as i32, -1)?;
    log::info!(
        "prompt cache {}: {reuse} of {} prompt tokens reused",
        path.display(),
        prompt.len()
    );
    Ok(reuse)
}
