//! The `wgllm` command line: flags follow llama.cpp's where they overlap. Commands only
//! parse arguments and print; the work is the library's engine.

#[cfg(feature = "app")]
pub mod app;
pub mod bench;
pub mod chat;
pub mod embed;
pub mod escapes;
pub mod habits;
pub mod hub;
pub mod image_embed;
pub mod info;
pub mod kernels;
pub mod media;
pub mod perplexity;
#[cfg(feature = "server")]
pub mod router;
pub mod run;
pub mod runtime_dir;
pub mod sampling;
#[cfg(feature = "server")]
pub mod serve;
pub mod speculative;
pub mod synth;
pub mod tokenize;
pub mod tune;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use wgllm::engine::{Engine, EngineOptions, SamplingPath};
use wgllm::gpu::{Backend, GpuOptions, KernelShape};
use wgllm::kv::{FlashAttn, KvConfig, KvType};
use wgllm::tune::{TuneMode, TuneOptions};

#[derive(Parser)]
#[command(
    name = "wgllm",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("WGLLM_BUILD_COMMIT"), ")"),
    about = "Run GGUF language models on any GPU wgpu reaches (Vulkan, Metal, DX12, GL)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// The desktop demo app: chat, tokens/s and the KV cache map in a window.
    #[cfg(feature = "app")]
    App(app::AppArgs),
    /// Generate text from a prompt.
    Run(Box<run::RunArgs>),
    /// Serve the model over HTTP: llama-server's, OpenAI's and Anthropic's APIs. With no
    /// -m or -hf, a router over the cached, --models-dir and --models-preset models.
    #[cfg(feature = "server")]
    Serve(Box<serve::ServeArgs>),
    /// Interactive chat using the model's chat template.
    Chat(chat::ChatArgs),
    /// Perplexity over a text file, as llama-perplexity computes it.
    Perplexity(perplexity::PerplexityArgs),
    /// Embeddings of texts (pooled, normalised), as llama-embedding computes them.
    Embed(embed::EmbedArgs),
    /// An image's embeddings from an mmproj file's vision encoder (llama.cpp's
    /// MTMD_DEBUG_EMBEDDINGS file).
    ImageEmbed(image_embed::ImageEmbedArgs),
    /// Prompt-processing and generation speed, as llama-bench reports it.
    Bench(bench::BenchArgs),
    /// Print a GGUF file's metadata and tensor table.
    Inspect(info::InspectArgs),
    /// List the GPU adapters wgpu can reach.
    Devices(info::DevicesArgs),
    /// Write a llama-shaped GGUF with random weights (benchmark subjects).
    Synth(synth::SynthArgs),
    /// Measure kernel shapes and backends on a model's layer and cache the choice.
    Tune(tune::TuneArgs),
    /// Write every kernel variant as a Vulkan driver gets it (SPIR-V), for validators and
    /// offline GPU compilers.
    Kernels(kernels::KernelsArgs),
    /// Text to token ids with a model's tokenizer, as llama-tokenize prints them.
    Tokenize(tokenize::TokenizeArgs),
    /// Print a shell completion script (e.g. `wgllm completions bash > /etc/bash_completion.d/wgllm`).
    Completions(CompletionsArgs),
}

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, powershell or elvish.
    pub shell: clap_complete::Shell,
}

/// Writes the completion script of every command and flag for `a.shell` to stdout.
pub fn completions(a: &CompletionsArgs) -> Result<()> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "wgllm", &mut std::io::stdout());
    Ok(())
}

/// GPU selection, shared by every command that runs a model.
#[derive(Args, Clone, Debug)]
pub struct GpuArgs {
    /// wgpu backend: auto, vulkan, metal, dx12 or gl.
    #[arg(long, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Adapters from `wgllm devices`, by index or as BACKEND+N (`vulkan0`, `gl0`): one,
    /// or several to split the model's layers over (default: the high-performance
    /// adapter).
    #[arg(long = "device", visible_alias = "dev", value_delimiter = ',')]
    pub device: Vec<String>,
    /// How a model is split over several --device adapters: `layer` (each holds a run
    /// of layers and their cache) or `none` (the main one holds everything).
    #[arg(long = "split-mode", visible_alias = "sm", default_value = "layer", value_parser = parse_split_mode)]
    pub split_mode: SplitMode,
    /// Each --device adapter's share of the layers, as `3,1` or `3/1` (default: equal
    /// shares, as wgpu reports no adapter's memory size).
    #[arg(long = "tensor-split", visible_alias = "ts", value_parser = parse_shares)]
    pub tensor_split: Option<Shares>,
    /// Which --device adapter (an index into that list) holds the embeddings, the output
    /// head and GPU sampling, and with `-sm none` the whole model.
    #[arg(long = "main-gpu", visible_alias = "mg", default_value_t = 0)]
    pub main_gpu: usize,
    /// Do not use shader-f16 even if the adapter has it.
    #[arg(long)]
    pub no_f16: bool,
    /// Do not use subgroup operations even if the adapter has them.
    #[arg(long)]
    pub no_subgroups: bool,
    /// Kernel shapes: `cpu` (row per invocation) suits software rasterizers, `gpu`
    /// (tiled prompt matmul, multi-row reductions) discrete GPUs; `auto` picks by adapter type.
    #[arg(long, default_value_t = KernelShape::Auto)]
    pub kernels: KernelShape,
    /// Compile the kernels with wgpu's runtime checks (index clamping, loop counters,
    /// guarded division), for debugging; slower (lavapipe: a third of prompt speed).
    #[arg(long)]
    pub shader_checks: bool,
    /// Do not measure kernel shapes and backends (`wgllm tune`); use the built-in choice
    /// by adapter type.
    #[arg(long)]
    pub no_tune: bool,
    /// Where generated tokens are sampled: `gpu` (only the token is read back), `cpu`
    /// (the logits are read back), `auto` (the GPU on discrete GPUs). Settings the GPU
    /// chain lacks (grammars, typical-p, XTC, top-n-sigma, dynamic temperature, top-k 0
    /// or above 256, the model's own token probabilities) sample on the CPU either way.
    #[arg(long, default_value_t = SamplingPath::Auto)]
    pub sampling: SamplingPath,
    /// llama.cpp's `-bs`: the same as `--sampling gpu` (a server's request can still
    /// say `"backend_sampling": false`).
    #[arg(
        long = "backend-sampling",
        visible_alias = "bs",
        conflicts_with = "sampling"
    )]
    pub backend_sampling: bool,
}

/// `-sm`: llama.cpp's split modes wgllm has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    None,
    Layer,
}

fn parse_split_mode(s: &str) -> Result<SplitMode, String> {
    match s {
        "none" => Ok(SplitMode::None),
        "layer" => Ok(SplitMode::Layer),
        "row" => Err("`-sm row` splits each matrix's rows over the GPUs, which needs every matmul's partial outputs gathered across devices after each layer; wgpu shares no buffers between devices, so each gather would be a host round trip per matmul. Use `-sm layer`".into()),
        _ => Err(format!("`{s}`: the split mode is none or layer")),
    }
}

/// `-ts`: each adapter's share of the layers.
#[derive(Clone, Debug, PartialEq)]
pub struct Shares(pub Vec<f32>);

/// `-ts 3,1` or `3/1`, as llama.cpp reads it.
fn parse_shares(s: &str) -> Result<Shares, String> {
    s.split([',', '/'])
        .map(|x| {
            x.trim()
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    format!(
                        "-ts `{s}`: give one share (a number >= 0) per --device adapter, as `3,1`"
                    )
                })
        })
        .collect::<Result<Vec<f32>, String>>()
        .map(Shares)
}

impl GpuArgs {
    /// The --device adapters as indices of the backend's list.
    pub fn device_indices(&self) -> Result<Vec<usize>> {
        resolve_devices(self.backend, &self.device)
    }

    /// The adapter the commands that run on one device open: the only --device, or the
    /// main one of several (`-mg`).
    pub fn adapter_index(&self) -> Result<Option<usize>> {
        let d = self.device_indices()?;
        if d.is_empty() {
            return Ok(None);
        }
        match d.get(self.main_gpu) {
            Some(&i) => Ok(Some(i)),
            None => bail!(
                "-mg {}: the main GPU indexes the --device list, which has {} adapter(s)",
                self.main_gpu,
                d.len()
            ),
        }
    }

    /// Refuses several --device adapters for a command that runs on one (`what` says
    /// which and why).
    pub fn one_device(&self, what: &str) -> Result<()> {
        if self.device_indices()?.len() > 1 {
            bail!("--device names several adapters, and {what}: name one (a split is for run, chat, perplexity, serve, bench and app)");
        }
        Ok(())
    }

    /// The layer split the flags ask for: several --device adapters with `-sm layer`.
    pub fn split(&self) -> Result<Option<wgllm::engine::SplitSpec>> {
        let devices = self.device_indices()?;
        self.adapter_index()?;
        if devices.len() < 2 || self.split_mode == SplitMode::None {
            if let Some(Shares(ts)) = &self.tensor_split {
                if devices.len() < 2 && ts.len() > 1 {
                    bail!("-ts gives {} shares, but one adapter runs the model: name the adapters to split over with --device A,B", ts.len());
                }
            }
            return Ok(None);
        }
        for (k, d) in devices.iter().enumerate() {
            if devices[..k].contains(d) {
                bail!("--device names adapter {d} twice: a split puts each part on a different adapter");
            }
        }
        Ok(Some(wgllm::engine::SplitSpec {
            devices,
            shares: (self.tensor_split.clone()).map(|s| s.0).unwrap_or_default(),
            main: self.main_gpu,
        }))
    }

    /// `--sampling`, with `-bs` read as `gpu`.
    pub fn sampling_path(&self) -> SamplingPath {
        if self.backend_sampling {
            SamplingPath::Gpu
        } else {
            self.sampling
        }
    }
}

/// The tuning cache directory: `WGLLM_CACHE_DIR`, else the library's default
/// (`$XDG_CACHE_HOME/wgllm` or `~/.cache/wgllm`).
pub fn tune_options(no_tune: bool, redo: bool) -> TuneOptions {
    TuneOptions {
        mode: if no_tune {
            TuneMode::Off
        } else if redo {
            TuneMode::Redo
        } else {
            TuneMode::Cached
        },
        cache_dir: std::env::var_os("WGLLM_CACHE_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
    }
}

impl GpuArgs {
    /// The GPU options, with the kernel tuning read from the environment (the one place
    /// the `WGLLM_*` variables are read).
    pub fn options(&self) -> Result<GpuOptions> {
        Ok(GpuOptions {
            backend: self.backend,
            adapter_index: self.adapter_index()?,
            no_f16: self.no_f16,
            no_subgroups: self.no_subgroups,
            max_binding_override: None,
            kernels: self.kernels,
            tuning: wgllm::ops::KernelTuning::from_env()?,
            shader_checks: self.shader_checks,
            fault: None,
            memory_budget: None,
        })
    }
}

/// `--device` names as adapter indices of `backend`'s list: a number, or BACKEND+N (the
/// Nth adapter of that backend in the list: `vulkan0`, `gl0`).
pub fn resolve_devices(backend: Backend, names: &[String]) -> Result<Vec<usize>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let list = wgllm::gpu::list_adapters(backend);
    let spelled = |i: usize| {
        let b = list[i].backend.to_lowercase();
        let k = list[..i]
            .iter()
            .filter(|a| a.backend.to_lowercase() == b)
            .count();
        format!("{b}{k}")
    };
    names
        .iter()
        .map(|n| {
            let n = n.trim();
            if let Ok(i) = n.parse::<usize>() {
                if i >= list.len() {
                    bail!(
                        "--device {i}: {} adapter(s) found (see `wgllm devices`)",
                        list.len()
                    );
                }
                return Ok(i);
            }
            (0..list.len())
                .find(|&i| spelled(i) == n.to_lowercase())
                .ok_or_else(|| {
                    let known: Vec<String> = (0..list.len())
                        .map(|i| format!("{i} or {}", spelled(i)))
                        .collect();
                    anyhow!(
                        "--device `{n}`: no such adapter; name one by index or as BACKEND+N ({})",
                        known.join(", ")
                    )
                })
        })
        .collect()
}

/// Model and context flags shared by run, chat, perplexity.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Path to a GGUF model (or -hf ORG/NAME[:QUANT]).
    // Not required by the parser: `serve` without one is a router; the other commands
    // say a model is needed when they look for it (`ModelArgs::path`).
    #[arg(short = 'm', long = "model", conflicts_with = "hf_repo")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hub: hub::HubArgs,
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
    /// Give sliding-window layers a full-size KV cache instead of a rolling buffer of their
    /// window (needed only for Self-Extend, or to cut a sequence back past the buffer).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// K cache type: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (default: f16,
    /// or f32 on adapters without shader-f16).
    #[arg(long = "cache-type-k", visible_alias = "ctk", value_parser = KvType::parse)]
    pub cache_type_k: Option<KvType>,
    /// V cache type, as -ctk; a quantized V needs flash attention (-fa on or auto).
    #[arg(long = "cache-type-v", visible_alias = "ctv", value_parser = KvType::parse)]
    pub cache_type_v: Option<KvType>,
    /// Flash attention: on, off or auto (auto: on where a quantized V cache needs it).
    #[arg(long = "flash-attn", visible_alias = "fa", num_args = 0..=1, default_missing_value = "on", value_parser = FlashAttn::parse, default_value = "auto")]
    pub flash_attn: FlashAttn,
    /// LoRA adapter files (GGUF, as llama.cpp's convert_lora_to_gguf.py writes them),
    /// each applied at scale 1; comma-separated or repeated.
    #[arg(long = "lora", value_delimiter = ',')]
    pub lora: Vec<PathBuf>,
    /// LoRA adapters with their scales: FNAME:SCALE, comma-separated or repeated.
    #[arg(long = "lora-scaled", value_delimiter = ',', value_parser = parse_lora_scaled)]
    pub lora_scaled: Vec<(PathBuf, f32)>,
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub habits: habits::LlamaHabits,
}

/// `FNAME:SCALE` of `--lora-scaled` (the scale after the last colon, so a Windows path's
/// drive letter stays in the name).
fn parse_lora_scaled(s: &str) -> Result<(PathBuf, f32), String> {
    let (name, scale) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("`{s}`: --lora-scaled takes FNAME:SCALE"))?;
    let scale: f32 = scale
        .parse()
        .ok()
        .filter(|v: &f32| v.is_finite())
        .ok_or_else(|| {
            format!("`{s}`: the scale `{scale}` is not a number (--lora-scaled FNAME:SCALE)")
        })?;
    if name.is_empty() {
        return Err(format!("`{s}`: no file name before the scale"));
    }
    Ok((PathBuf::from(name), scale))
}

impl ModelArgs {
    /// The model file: -m, or the -hf model (downloaded into the cache if needed).
    pub fn path(&self) -> Result<PathBuf> {
        match &self.model {
            Some(m) => Ok(m.clone()),
            None => self.hub.resolve()?.ok_or_else(|| {
                anyhow::anyhow!("a model is needed: -m FILE or -hf ORG/NAME[:QUANT]")
            }),
        }
    }

    /// -ctk, -ctv and -fa.
    pub fn kv_config(&self) -> KvConfig {
        KvConfig {
            type_k: self.cache_type_k,
            type_v: self.cache_type_v,
            flash_attn: self.flash_attn,
        }
    }

    pub fn options(&self) -> Result<EngineOptions> {
        Ok(EngineOptions {
            n_ctx: self.ctx_size,
            n_batch: self.batch_size,
            n_ubatch: self.ubatch_size,
            n_seq_max: self.n_parallel,
            defrag_thold: self.defrag_thold,
            swa_full: self.swa_full,
            swa_keep: 0,
            kv_unified: false,
            kv: self.kv_config(),
            gpu: self.gpu.options()?,
            tune: tune_options(self.gpu.no_tune, false),
            sampling: self.gpu.sampling_path(),
            decode_ahead: true,
            embeddings: false,
            reranking: false,
            lora: self.lora_specs(),
            lora_init_without_apply: false,
            split: self.gpu.split()?,
            pipeline: true,
        })
    }

    /// `--lora` files at scale 1, then `--lora-scaled` ones, each group in the order
    /// given: their ids (llama.cpp keeps the command line's order, which differs only
    /// where the two flags alternate).
    pub fn lora_specs(&self) -> Vec<wgllm::engine::LoraSpec> {
        let plain = self.lora.iter().map(|p| (p.clone(), 1.0));
        (plain.chain(self.lora_scaled.iter().cloned()))
            .map(|(path, scale)| wgllm::engine::LoraSpec { path, scale })
            .collect()
    }
}

/// A load's progress on stderr (drawn only on a terminal): a line while a first use
/// measures kernels, then the upload's bar.
struct LoadBar {
    file: String,
    bar: indicatif::ProgressBar,
    tuning: Option<indicatif::ProgressBar>,
}

impl LoadBar {
    fn new(file: String) -> Self {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "loading {msg} [{bar:40}] {bytes}/{total_bytes} ({eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_message(file.clone());
        LoadBar {
            file,
            bar,
            tuning: None,
        }
    }
}

impl wgllm::engine::LoadProgress for LoadBar {
    fn upload(&mut self, done: u64, total: u64) {
        self.bar.set_length(total);
        self.bar.set_position(done);
    }

    fn tuning(&mut self, what: &str, budget_secs: Option<f64>) {
        let how_long = budget_secs.map_or("all candidates".to_string(), |s| {
            format!("first use, about {s:.0} s")
        });
        let t = indicatif::ProgressBar::new_spinner();
        t.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .expect("a valid template"),
        );
        t.set_message(format!(
            "{}: measuring kernels for {what} ({how_long})",
            self.file
        ));
        t.enable_steady_tick(std::time::Duration::from_millis(120));
        self.tuning = Some(t);
    }

    fn tuning_step(&mut self, _name: &str) {
        if let Some(t) = &self.tuning {
            t.tick();
        }
    }

    fn tuned(&mut self) {
        if let Some(t) = self.tuning.take() {
            t.finish_and_clear();
        }
    }
}

/// Loads the model for `args` into an engine, with a progress line on stderr.
pub fn load_engine(args: &ModelArgs, opts: &EngineOptions) -> Result<Engine> {
    args.habits.log();
    let model = args.path()?;
    let file = model
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut progress = LoadBar::new(file);
    let engine = Engine::load(&model, opts, &mut progress);
    if let Some(t) = progress.tuning.take() {
        t.finish_and_clear();
    }
    progress.bar.finish_and_clear();
    Ok(engine?)
}
