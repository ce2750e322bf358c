//! `wgllm run`: one prompt in, generated text out (stdout), logs and timings on stderr.

use super::escapes::unescape;
pub use super::sampling::SamplingArgs;
use super::{load_engine, ModelArgs};
use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use wgllm::engine::{Engine, Event, PromptCache, SessionId, SessionParams, ShiftPolicy, Stop};

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
    #[command(flatten)]
    pub spec: super::speculative::SpecArgs,
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
    /// Render the prompt as the first user turn of a chat with this system prompt
    /// (the model's chat template), as llama-cli does.
    #[arg(long = "system-prompt", visible_alias = "sys")]
    pub system: Option<String>,
    /// Accepted for compatibility: `run` never enters conversation mode.
    #[arg(long = "no-conversation", visible_alias = "no-cnv")]
    pub no_conversation: bool,
    #[command(flatten)]
    pub media: super::media::MediaArgs,
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
    /// The prefix a sliding-window model's rolling buffer must never drop: what a shift
    /// keeps (plus BOS), everything for `--keep -1`, nothing without context shift.
    pub fn swa_keep(&self) -> u32 {
        match self.keep {
            _ if self.no_context_shift => 0,
            k if k < 0 => u32::MAX,
            k => k as u32 + 1,
        }
    }

    /// The engine's shift policy, checked before anything is loaded.
    pub fn policy(&self) -> Result<ShiftPolicy> {
        let p = ShiftPolicy {
            context_shift: !self.no_context_shift,
            keep: self.keep,
            ga_n: self.ga_n,
            ga_w: self.ga_w,
        };
        p.validate().map_err(anyhow::Error::msg)?;
        Ok(p)
    }
}

pub fn run(a: &RunArgs) -> Result<()> {
    let policy = a.shift.policy()?;
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
    let mut params = SessionParams {
        sampling: Default::default(),
        n_predict: a.n_predict,
        shift: policy,
        prompt_cache: a.prompt_cache.as_ref().map(|p| PromptCache {
            path: p.clone(),
            read_only: a.prompt_cache_ro,
        }),
        ..Default::default()
    };
    // Checked before loading anything.
    params.validate()?;
    a.spec.speculation()?;
    a.media.check()?;
    let with_images = !a.media.images.is_empty();
    // With -hf the repository's mmproj comes too where images are given.
    let (mut model, mut media) = (a.model.clone(), a.media.clone());
    media.resolve(&mut model, with_images)?;
    if with_images && a.prompt_cache.is_some() {
        bail!("--prompt-cache is not taken with --image: a prompt-cache file records token ids, and an image's cells would be matched by a hash the file cannot check against the mmproj");
    }
    let mut opts = model.options()?;
    opts.swa_keep = a.shift.swa_keep();
    let mut engine = load_engine(&model, &opts)?;
    a.spec.attach(&mut engine)?;
    media.attach(&mut engine)?;
    params.sampling = a.sampling.params(&engine)?;
    let images = media.prepare(&engine)?;
    let id = engine.open_session(params)?;
    // With a system prompt the prompt is the first user turn of a chat (as llama-cli
    // does with -sys); with images too (as llama-mtmd-cli does, each image's marker
    // before the text unless the prompt places them); otherwise it is raw text.
    let text = super::media::with_markers(&prompt, images.len());
    let n = match &a.system {
        _ if with_images => engine.chat_media(id, a.system.as_deref(), &text, &images)?,
        Some(sys) => engine.chat_with_system(id, Some(sys), &prompt)?,
        None => engine.prompt_text(id, &prompt)?,
    };
    log::info!(
        "prompt: {n} tokens, sampler seed {}",
        engine.session(id)?.sampler_seed()
    );
    let mut stdout = std::io::stdout().lock();
    if !a.no_display_prompt && a.system.is_none() && !with_images {
        write!(stdout, "{prompt}")?;
        stdout.flush()?;
    }
    let stop = drive(&mut engine, id, a.dump_kv_cache, &mut |text| {
        write!(stdout, "{text}").and_then(|_| stdout.flush())
    })?;
    writeln!(stdout)?;
    let s = engine.session(id)?;
    let n_shifts = s.shift().ops.iter().filter(|o| o.op == "seq_rm").count();
    if n_shifts > 0 {
        log::info!("context shifts: {n_shifts}");
    }
    match stop {
        Stop::ContextFull(reason) => log::warn!(
            "stopped: the context ({} tokens) is full and {reason}",
            engine.n_ctx_seq()
        ),
        Stop::EndOfGeneration => log::info!("[end of text]"),
        _ => {}
    }
    let mut timings = s.timings().clone();
    timings.load = engine.load_time;
    eprintln!("{}", timings.report());
    Ok(())
}

/// Steps the engine until session `id` finishes, writing its text with `out` (a closed
/// pipe cancels the session quietly); returns why it stopped. `dump_cells` prints the
/// cache's cells after every step (-dkvc).
fn drive(
    engine: &mut Engine,
    id: SessionId,
    dump_cells: bool,
    out: &mut dyn FnMut(&str) -> std::io::Result<()>,
) -> Result<Stop> {
    let mut write_err = None;
    loop {
        let events = engine.step()?;
        if dump_cells {
            let map = engine.cache_map();
            // The K/V cells (a recurrent model's states stand in for them), then the
            // states of a hybrid's recurrent layers.
            eprint!("\n{}", engine.cells().view());
            for st in map.stores.iter().skip(1).filter(|s| s.is_recurrent()) {
                eprint!("{}", st.states_view());
            }
        }
        for ev in events {
            match &ev {
                Event::Token { text, .. } | Event::Finished { tail: text, .. }
                    if write_err.is_none() && !text.is_empty() =>
                {
                    if let Err(e) = out(text) {
                        write_err = Some(e);
                        engine.cancel(id)?;
                    }
                }
                _ => {}
            }
            match ev {
                Event::Error { error, .. } => return Err(error.into()),
                Event::ContextShifted {
                    n_keep, n_discard, ..
                } => log::debug!("context shift: kept {n_keep}, dropped {n_discard}"),
                Event::ContextExtended { n_past, .. } => {
                    log::debug!("Self-Extend: n_past now {n_past}")
                }
                Event::Finished { stop, .. } => {
                    if let Some(e) = write_err {
                        if e.kind() != std::io::ErrorKind::BrokenPipe {
                            return Err(e.into());
                        }
                    }
                    return Ok(stop);
                }
                _ => {}
            }
        }
        if !engine.session(id)?.is_busy() {
            bail!("session {id} went idle without finishing");
        }
    }
}
