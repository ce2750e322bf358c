//! The `wgllm` command line: flags follow llama.cpp's where they overlap.

pub mod bench;
pub mod chat;
pub mod info;
pub mod perplexity;
pub mod run;
pub mod synth;

use anyhow::{bail, Context as _, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use wgllm::context::{Context, ContextParams};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Backend, Gpu, GpuOptions, KernelShape};
use wgllm::model::Model;
use wgllm::tokenizer::Tokenizer;

#[derive(Parser)]
#[command(
    name = "wgllm",
    version,
    about = "Run GGUF language models on any GPU wgpu reaches (Vulkan, Metal, DX12, GL)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Generate text from a prompt.
    Run(run::RunArgs),
    /// Interactive chat using the model's chat template.
    Chat(chat::ChatArgs),
    /// Perplexity over a text file, as llama-perplexity computes it.
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt-processing and generation speed, as llama-bench reports it.
    Bench(bench::BenchArgs),
    /// Print a GGUF file's metadata and tensor table.
    Inspect(info::InspectArgs),
    /// List the GPU adapters wgpu can reach.
    Devices(info::DevicesArgs),
    /// Write a llama-shaped GGUF with random weights (benchmark subjects).
    Synth(synth::SynthArgs),
}

/// llama.cpp spells some flags with one dash and several letters (`-np 4`, `-ub 256`);
/// clap would read `-np` as `-n p`. Those spellings become their `--` aliases.
pub fn llama_style_flag(arg: std::ffi::OsString) -> std::ffi::OsString {
    const MULTI_LETTER: [&str; 7] = ["-np", "-ub", "-dt", "-dkvc", "-gan", "-gaw", "-sys"];
    match arg.to_str() {
        Some(a) if MULTI_LETTER.contains(&a) => format!("-{a}").into(),
        _ => arg,
    }
}

/// GPU selection, shared by every command that runs a model.
#[derive(Args, Clone, Debug)]
pub struct GpuArgs {
    /// wgpu backend.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Adapter index from `wgllm devices` (default: the high-performance adapter).
    #[arg(long = "device")]
    pub device: Option<usize>,
    /// Do not use shader-f16 even if the adapter has it.
    #[arg(long)]
    pub no_f16: bool,
    /// Do not use subgroup operations even if the adapter has them.
    #[arg(long)]
    pub no_subgroups: bool,
    /// Kernel shapes: `cpu` (row per invocation) suits software rasterizers, `gpu`
    /// (tiled prompt matmul, multi-row reductions) discrete GPUs; `auto` picks by adapter type.
    #[arg(long, value_enum, default_value_t = KernelShape::Auto)]
    pub kernels: KernelShape,
}

impl GpuArgs {
    pub fn open(&self) -> Result<Arc<Gpu>> {
        Ok(Gpu::new(&GpuOptions {
            backend: self.backend,
            adapter_index: self.device,
            no_f16: self.no_f16,
            no_subgroups: self.no_subgroups,
            max_binding_override: None,
            kernels: self.kernels,
            tuning: wgllm::ops::KernelTuning::from_env()?,
        })?)
    }
}

/// Model and context flags shared by run, chat, perplexity.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Path to a GGUF model.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Context size in tokens (0: the model's training context, capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u32,
    /// Logical batch size: most prompt tokens per decode call.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: u32,
    /// Physical batch size: most tokens per graph.
    #[arg(long = "ubatch-size", visible_alias = "ub", default_value_t = 512)]
    pub ubatch_size: u32,
    /// Sequences the context serves at once (llama.cpp's -np / --parallel).
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub n_parallel: u32,
    /// Compact the KV cache when more than this share of it is holes (<= 0: never).
    /// llama.cpp now ignores this flag; here it keeps attention from reading holes.
    #[arg(long = "defrag-thold", visible_alias = "dt", default_value_t = -1.0, allow_negative_numbers = true)]
    pub defrag_thold: f32,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub load_time: std::time::Duration,
}

/// Opens the GGUF, the GPU and uploads the weights with a progress bar on stderr.
pub fn load_model(args: &ModelArgs) -> Result<Loaded> {
    let start = Instant::now();
    if !args.model.exists() {
        bail!(
            "model file {} does not exist (scripts/fetch-models.sh downloads the test models)",
            args.model.display()
        );
    }
    let f = GgufFile::open(&args.model)?;
    // Check the architecture before anything else: the clearest error comes first.
    wgllm::model::Hparams::from_gguf(&f)?;
    let tokenizer = Tokenizer::from_gguf(&f)
        .with_context(|| format!("reading the tokenizer of {}", args.model.display()))?;
    let gpu = args.gpu.open()?;
    let bar = indicatif::ProgressBar::new(f.file_size());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "loading {msg} [{bar:40}] {bytes}/{total_bytes} ({eta})",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    bar.set_message(
        args.model
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let model = Model::load(gpu, &f, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    log::info!(
        "loaded {} ({} layers, {:.1} MiB on {} via {})",
        model.name,
        model.hp.n_layer,
        model.weights.gpu_bytes as f64 / (1 << 20) as f64,
        model.gpu.info.name,
        model.gpu.info.backend
    );
    Ok(Loaded {
        model: Arc::new(model),
        tokenizer,
        load_time: start.elapsed(),
    })
}

/// The context for `args`, with llama.cpp's defaults and checks.
pub fn new_context(model: &Arc<Model>, args: &ModelArgs) -> Result<Context> {
    let n_ctx = if args.ctx_size == 0 {
        model.hp.n_ctx_train.min(4096)
    } else {
        args.ctx_size
    };
    if args.batch_size == 0 || args.ubatch_size == 0 {
        bail!(
            "batch sizes must be positive (-b {}, -ub {})",
            args.batch_size,
            args.ubatch_size
        );
    }
    if n_ctx > model.hp.n_ctx_train {
        log::warn!(
            "context size {n_ctx} is larger than the model's training context {}",
            model.hp.n_ctx_train
        );
    }
    Ok(Context::new(
        model.clone(),
        ContextParams {
            n_ctx,
            n_batch: args.batch_size.min(n_ctx),
            n_ubatch: args.ubatch_size.min(args.batch_size).min(n_ctx),
            n_seq_max: args.n_parallel,
            defrag_thold: args.defrag_thold,
        },
    )?)
}
