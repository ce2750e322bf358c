//! `wgllm app`: the desktop demo app (the window itself is the library's `app` module).

use super::escapes::unescape;
use super::habits::LlamaHabits;
use super::run::{SamplingArgs, ShiftArgs};
use super::GpuArgs;
use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::app::{AppOptions, AppSettings};

#[derive(Args)]
pub struct AppArgs {
    /// Model to load at start (else pick one in the window).
    #[arg(short = 'm', long = "model", conflicts_with = "hf_repo")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hub: super::hub::HubArgs,
    /// Context size in tokens: small sizes show a context shift in a short chat.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 1024)]
    pub ctx_size: u32,
    /// Chats at once, each a sequence of the one cache.
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 2)]
    pub n_parallel: u32,
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: u32,
    #[arg(long = "ubatch-size", visible_alias = "ub", default_value_t = 512)]
    pub ubatch_size: u32,
    /// Full-size cache for sliding-window layers (no rolling buffer).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// Most tokens per reply (-1: until the model ends it).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    pub n_predict: i32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub shift: ShiftArgs,
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Send this message to the first chat once the model is loaded.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// The model's vision encoder (an mmproj GGUF): chats then take images, attached by
    /// path or dropped on the window.
    #[arg(long = "mmproj", visible_alias = "mm")]
    pub mmproj: Option<PathBuf>,
    /// Images to send with --prompt (the headless drive), before its text.
    #[arg(long = "image", value_delimiter = ',', requires = "mmproj")]
    pub images: Vec<PathBuf>,
    /// Send --prompt as raw text for the model to continue (no chat template), as `wgllm
    /// run -p` takes it.
    #[arg(long)]
    pub raw: bool,
    /// After the reply to --prompt, save the window as a PNG here and exit (0 when the
    /// reply arrived, 1 otherwise).
    #[arg(long)]
    pub screenshot: Option<PathBuf>,
    /// Seconds the --screenshot drive waits for the reply before giving up.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Window size, WIDTHxHEIGHT in points.
    #[arg(long, default_value = "1280x800")]
    pub size: String,
    /// Folders whose .gguf files the model picker lists (default: the model cache
    /// scripts/fetch-models.sh fills, $WGLLM_MODELS or ~/.cache/wgllm-models).
    #[arg(long = "models-dir")]
    pub models_dir: Vec<PathBuf>,
    /// Start the chats with these conversations: the file an app that lost its GPU
    /// wrote for the app it started in its place.
    #[arg(long = "restore-chats", hide = true)]
    pub restore_chats: Option<PathBuf>,
    #[command(flatten)]
    pub habits: LlamaHabits,
}

fn parse_size(s: &str) -> Result<[f32; 2]> {
    let (w, h) = s
        .split_once(['x', 'X'])
        .with_context(|| format!("--size {s}: expected WIDTHxHEIGHT, e.g. 1280x800"))?;
    let w: f32 = w
        .trim()
        .parse()
        .with_context(|| format!("--size {s}: bad width"))?;
    let h: f32 = h
        .trim()
        .parse()
        .with_context(|| format!("--size {s}: bad height"))?;
    if !(200.0..=8192.0).contains(&w) || !(200.0..=8192.0).contains(&h) {
        bail!("--size {s}: width and height must be between 200 and 8192");
    }
    Ok([w, h])
}

fn default_model_dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("WGLLM_MODELS") {
        return vec![PathBuf::from(d)];
    }
    std::env::var_os("HOME")
        .map(|h| vec![PathBuf::from(h).join(".cache/wgllm-models")])
        .unwrap_or_default()
}

pub fn app(a: &AppArgs) -> Result<()> {
    a.habits.log();
    if a.sampling.ignore_eos {
        bail!("--ignore-eos is not offered in the app: replies end where the model ends them (set max tokens instead)");
    }
    let model = match &a.model {
        Some(m) => Some(m.clone()),
        None => a.hub.resolve()?,
    };
    if a.screenshot.is_some() && (model.is_none() || a.prompt.is_none()) {
        bail!("--screenshot drives the app headless: it needs a model (-m) and a message (-p)");
    }
    if let Some(m) = &model {
        if !m.exists() {
            bail!(
                "model file {} does not exist (scripts/fetch-models.sh downloads the test models)",
                m.display()
            );
        }
    }
    let shift = a.shift.policy()?;
    let settings = AppSettings {
        n_ctx: a.ctx_size,
        n_parallel: a.n_parallel,
        n_batch: a.batch_size,
        n_ubatch: a.ubatch_size,
        swa_full: a.swa_full,
        shift,
        sampling: a.sampling.checked()?,
        sampling_path: a.gpu.sampling_path(),
        n_predict: a.n_predict,
    };
    let opts = AppOptions {
        model,
        model_dirs: if a.models_dir.is_empty() {
            default_model_dirs()
        } else {
            a.models_dir.clone()
        },
        // With several --device adapters the window draws on the main one (-mg), and the
        // model's layers are split over all of them.
        gpu: a.gpu.options()?,
        split: a.gpu.split()?,
        tune: super::tune_options(a.gpu.no_tune, false),
        settings,
        drive: a.screenshot.is_some(),
        prompt: a.prompt.as_deref().map(unescape),
        mmproj: a.mmproj.clone(),
        images: a.images.clone(),
        raw: a.raw,
        screenshot: a.screenshot.clone(),
        timeout: std::time::Duration::from_secs(a.timeout),
        window_size: parse_size(&a.size)?,
        restore_chats: a.restore_chats.clone(),
    };
    let report = wgllm::app::run(opts)?;
    if let (Some(p), Some(r)) = (&a.screenshot, report) {
        // The reply on stdout (as `wgllm run` prints text), the rest on stderr.
        println!("{}", r.reply);
        for (name, used, size, moved) in r.stores {
            eprintln!("{name}: {used} of {size} cells used, {moved} moved by a shift");
        }
        if r.devices.len() > 1 {
            for (d, cache) in &r.devices {
                eprintln!(
                    "device {} ({}){}: layers {}, {} KiB of cache",
                    d.name,
                    d.backend,
                    if d.main { ", main" } else { "" },
                    d.layers_text(),
                    cache >> 10
                );
            }
        }
        eprintln!("saved the window to {}", p.display());
    }
    Ok(())
}
