//! `wgllm bench`: llama-bench's flags, lists and output formats over the library's
//! benchmark (`wgllm::bench`). Parsing and printing only.

use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use wgllm::bench::{
    self, list, plot, report, BenchEvent, BenchPlan, MdColumns, OutputFormat, Stage, Writer,
};
use wgllm::gpu::{Backend, GpuOptions, KernelShape};
use wgllm::kv::{FlashAttn, KvConfig, KvType};

#[derive(Args)]
pub struct BenchArgs {
    /// GGUF models (comma list, or repeat -m).
    #[arg(short = 'm', long = "model", required = true)]
    pub model: Vec<String>,
    /// Prompt tokens of pp tests: a list (`16,32`) or range (`16-512*2`, `64-256+64`); 0 skips.
    #[arg(short = 'p', long = "n-prompt", default_value = "512")]
    pub n_prompt: Vec<String>,
    /// Generated tokens of tg tests (list or range; 0 skips).
    #[arg(short = 'n', long = "n-gen", default_value = "128")]
    pub n_gen: Vec<String>,
    /// A prompt-then-generate test `PP,TG` (llama-bench's pg; repeat for more).
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Logical batch sizes (list or range).
    #[arg(short = 'b', long = "batch-size", default_value = "2048")]
    pub batch: Vec<String>,
    /// Physical batch sizes (list or range).
    #[arg(long = "ubatch-size", visible_alias = "ub", default_value = "512")]
    pub ubatch: Vec<String>,
    /// Tokens already in the cache before each test (list or range).
    #[arg(short = 'd', long = "n-depth", default_value = "0")]
    pub depth: Vec<String>,
    /// Timed repetitions after one warm-up (list or range).
    #[arg(short = 'r', long = "repetitions", default_value = "5")]
    pub reps: Vec<String>,
    /// Context size at least (default: what each load's largest test needs).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: u32,
    /// Output format: md (rows as they finish), csv, json (one array) or jsonl.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: String,
    /// Print progress lines to stderr.
    #[arg(long)]
    pub progress: bool,
    /// Time a pp and a tg step per op kind for each model and backend.
    #[arg(long)]
    pub profile: bool,
    /// A vision encoder (mmproj) for the first model: after the table, one image's
    /// encode time and the time its tokens take to decode, as llama-mtmd-cli reports them.
    #[arg(long = "mmproj", visible_alias = "mm")]
    pub mmproj: Option<PathBuf>,
    /// The image for --mmproj (default: a generated one at the encoder's size).
    #[arg(long = "image", requires = "mmproj")]
    pub image: Option<PathBuf>,
    /// Draw tokens/s against depth (several -d) or test size as an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// wgpu backends: a list of auto, vulkan, metal, dx12, gl; each loads the models.
    #[arg(long, default_value = "auto")]
    pub backend: Vec<String>,
    /// Adapters from `wgllm devices` (index or BACKEND+N, as `vulkan0`): one, or several
    /// (`0,1` or `0/1`) to split the models over.
    #[arg(long = "device", visible_alias = "dev")]
    pub device: Vec<String>,
    /// Split modes over several --device adapters, a list of none and layer.
    #[arg(long = "split-mode", visible_alias = "sm", default_value = "layer")]
    pub split_mode: Vec<String>,
    /// Layer shares per --device adapter: a list of `3/1`-style splits (llama-bench's
    /// syntax: `,` between splits, `/` between adapters; `0`: equal).
    #[arg(long = "tensor-split", visible_alias = "ts")]
    pub tensor_split: Vec<String>,
    /// Which --device adapter holds the embeddings, the head and sampling (and with
    /// `-sm none` the whole model).
    #[arg(long = "main-gpu", visible_alias = "mg", default_value_t = 0)]
    pub main_gpu: usize,
    /// Do not use shader-f16 even if the adapter has it.
    #[arg(long)]
    pub no_f16: bool,
    /// Do not use subgroup operations even if the adapter has them.
    #[arg(long)]
    pub no_subgroups: bool,
    /// Kernel shapes: auto, cpu or gpu (see `wgllm run --help`).
    #[arg(long, default_value_t = KernelShape::Auto)]
    pub kernels: KernelShape,
    /// Compile the kernels with wgpu's runtime checks (see `wgllm run --help`).
    #[arg(long)]
    pub shader_checks: bool,
    /// Do not measure kernel shapes (`wgllm tune`); use the built-in choice.
    #[arg(long)]
    pub no_tune: bool,
    /// Where tg tests sample each next token (llama.cpp's default chain, fed to the next
    /// step): `gpu` draws it on the GPU, `cpu` reads the logits back; auto, cpu or gpu
    /// (see `wgllm run --help`).
    #[arg(long, default_value_t = wgllm::engine::SamplingPath::Auto)]
    pub sampling: wgllm::engine::SamplingPath,
    /// llama-bench's thread counts: one value accepted (there are no CPU threads here).
    #[arg(short = 't', long = "threads", hide_short_help = true)]
    pub threads: Vec<String>,
    /// llama-bench's GPU layers: one value accepted (every layer always runs on the GPU).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", hide_short_help = true)]
    pub n_gpu_layers: Vec<String>,
    /// Flash attention: a list of on, off, auto (or 1, 0), one load each.
    #[arg(long = "flash-attn", visible_alias = "fa")]
    pub flash_attn: Vec<String>,
    /// K cache types, a list (`f16,q8_0,q4_0`), one load each.
    #[arg(long = "cache-type-k", visible_alias = "ctk")]
    pub cache_type_k: Vec<String>,
    /// V cache types, a list; a quantized V needs flash attention.
    #[arg(long = "cache-type-v", visible_alias = "ctv")]
    pub cache_type_v: Vec<String>,
    /// llama-bench's mmap switch: one value accepted (weights are copied to the GPU).
    #[arg(long = "mmap", visible_alias = "mmp", hide_short_help = true)]
    pub mmap: Vec<String>,
    /// Speculative decoding in the tg tests: `-md FILE` and its `--spec-draft-*` flags
    /// (a draft model only; n-gram lookup has nothing to look up in a benchmark).
    #[command(flatten)]
    pub spec: super::speculative::SpecArgs,
    /// The text a speculative tg test continues (default: a short request for code).
    #[arg(long = "spec-prompt")]
    pub spec_prompt: Option<String>,
    /// On a split (--device A,B), run each ubatch through every device before the next
    /// starts, instead of overlapping them: to measure what the pipelining gains.
    #[arg(long = "no-pipeline")]
    pub no_pipeline: bool,
}

/// llama-bench flags that vary something wgllm has no choice of: one value is accepted
/// (and changes nothing), a list would only repeat the same test, so it is refused.
fn check_habits(a: &BenchArgs) -> Result<()> {
    let habits: [(&str, &[String], &str); 3] = [
        (
            "-t",
            &a.threads,
            "wgllm computes on the GPU and has no CPU threads to set",
        ),
        (
            "-ngl",
            &a.n_gpu_layers,
            "every layer always runs on the GPU",
        ),
        (
            "-mmp",
            &a.mmap,
            "the weights are read once from a memory map and copied to the GPU",
        ),
    ];
    for (flag, given, why) in habits {
        let values = list::parse_words(&given.join(",")).unwrap_or_default();
        if values.len() > 1 {
            bail!("{flag} {}: {why}, so a list of values would only repeat the same test; give one value or none", given.join(","));
        }
        if flag == "-ngl" && values.first().map(String::as_str) == Some("0") {
            bail!("-ngl 0 asks for a CPU-only run, and {why}");
        }
        if let Some(v) = values.first() {
            log::debug!("{flag} {v}: {why}; ignored");
        }
    }
    Ok(())
}

/// Every combination of the -ctk, -ctv and -fa lists (a missing list: the default).
fn cache_configs(
    a: &BenchArgs,
    words: &dyn Fn(&[String]) -> Result<Vec<String>>,
) -> Result<Vec<KvConfig>> {
    let types = |flag: &str, v: &[String]| -> Result<Vec<Option<KvType>>> {
        let w = words(v).context(flag.to_string())?;
        if w.is_empty() {
            return Ok(vec![None]);
        }
        (w.iter())
            .map(|t| KvType::parse(t).map(Some).map_err(anyhow::Error::msg))
            .collect::<Result<_>>()
            .context(flag.to_string())
    };
    let ks = types("-ctk", &a.cache_type_k)?;
    let vs = types("-ctv", &a.cache_type_v)?;
    let fas: Vec<FlashAttn> = match words(&a.flash_attn).context("-fa")? {
        w if w.is_empty() => vec![FlashAttn::Auto],
        w => (w.iter())
            .map(|f| FlashAttn::parse(f).map_err(anyhow::Error::msg))
            .collect::<Result<_>>()?,
    };
    let mut out = Vec::new();
    for &type_k in &ks {
        for &type_v in &vs {
            for &flash_attn in &fas {
                if let (Some(v), FlashAttn::Off) = (type_v, flash_attn) {
                    if v.is_quantized() {
                        bail!("-ctv {v} with -fa off: a quantized V cache needs flash attention, as in llama.cpp; add -fa 1 or auto to the list, or drop {v} from -ctv");
                    }
                }
                out.push(KvConfig {
                    type_k,
                    type_v,
                    flash_attn,
                });
            }
        }
    }
    Ok(out)
}

fn plan(a: &BenchArgs) -> Result<BenchPlan> {
    let nums = |flag: &str, v: &[String]| -> Result<Vec<u32>> {
        list::parse_u32_lists(v).with_context(|| flag.to_string())
    };
    let words = |v: &[String]| -> Result<Vec<String>> {
        let mut out = Vec::new();
        for s in v {
            out.extend(list::parse_words(s)?);
        }
        Ok(out)
    };
    let backends = (words(&a.backend).context("--backend")?.iter())
        .map(|b| b.parse::<Backend>().map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    let pg = (a.pg.iter())
        .map(|s| list::parse_pg(s).context("-pg"))
        .collect::<Result<Vec<_>>>()?;
    let mut p = BenchPlan {
        models: words(&a.model)
            .context("-m")?
            .into_iter()
            .map(PathBuf::from)
            .collect(),
        backends,
        n_batch: nums("-b", &a.batch)?,
        n_ubatch: nums("-ub", &a.ubatch)?,
        n_prompt: nums("-p", &a.n_prompt)?,
        n_gen: nums("-n", &a.n_gen)?,
        pg,
        n_depth: nums("-d", &a.depth)?,
        reps: nums("-r", &a.reps)?,
        profile: a.profile,
        cache: cache_configs(a, &words)?,
        ..BenchPlan::default()
    };
    p.base.n_ctx = a.ctx_size;
    let device_names: Vec<String> = (a.device.iter())
        .flat_map(|d| d.split([',', '/']))
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect();
    let backend_of_list = match p.backends[..] {
        [b] => b,
        _ if device_names.is_empty() => Backend::Auto,
        _ => bail!("--device indexes one backend's adapter list: give one --backend with it"),
    };
    p.devices = super::resolve_devices(backend_of_list, &device_names)?;
    p.main_gpu = a.main_gpu;
    if p.devices.len() >= 2 {
        let modes = words(&a.split_mode).context("-sm")?;
        let shares: Vec<Vec<f32>> = match words(&a.tensor_split).context("-ts")? {
            w if w.is_empty() => vec![Vec::new()],
            w => (w.iter())
                .map(|t| match t.as_str() {
                    "0" => Ok(Vec::new()),
                    t => (t.split('/'))
                        .map(|x| {
                            x.parse::<f32>()
                                .ok()
                                .filter(|v| v.is_finite() && *v >= 0.0)
                                .with_context(|| {
                                    format!("-ts {t}: shares are numbers >= 0, as 3/1")
                                })
                        })
                        .collect::<Result<Vec<f32>>>(),
                })
                .collect::<Result<_>>()?,
        };
        p.splits.clear();
        for m in &modes {
            match m.as_str() {
                "none" => p.splits.push(bench::BenchSplit::default()),
                "layer" => {
                    for s in &shares {
                        p.splits.push(bench::BenchSplit {
                            layer: true,
                            shares: s.clone(),
                        });
                    }
                }
                "row" => bail!("-sm row splits each matrix's rows over the GPUs, which needs every matmul's partial outputs gathered across devices; wgpu shares no buffers between devices, so each gather would be a host round trip per matmul. Use -sm layer"),
                other => bail!("-sm {other}: the split modes are none and layer"),
            }
        }
    } else if !a.tensor_split.is_empty() {
        bail!("-ts: name the adapters to split over with --device A,B");
    }
    p.base.gpu = GpuOptions {
        backend: Backend::Auto,
        adapter_index: None,
        no_f16: a.no_f16,
        no_subgroups: a.no_subgroups,
        max_binding_override: None,
        kernels: a.kernels,
        tuning: wgllm::ops::KernelTuning::from_env()?,
        shader_checks: a.shader_checks,
        fault: None,
        memory_budget: None,
    };
    p.base.tune = super::tune_options(a.no_tune, false);
    p.base.sampling = a.sampling;
    p.base.pipeline = !a.no_pipeline;
    p.draft = match a.spec.speculation()? {
        None if a.spec_prompt.is_some() => bail!("--spec-prompt is the text of speculative tg tests: add -md FILE"),
        None => None,
        Some(super::speculative::Speculation::Ngram(..)) => bail!(
            "--spec-type ngram-simple: wgllm bench speculates with a draft model (-md FILE) only; an n-gram lookup needs text that repeats itself"
        ),
        Some(super::speculative::Speculation::Model(model, params)) => {
            if !a.spec.synth_rates.is_empty() {
                bail!("--spec-synth-rates: wgllm bench measures the draft's own acceptance; use it with wgllm run");
            }
            Some(bench::DraftPlan {
                model,
                params,
                prompt: a.spec_prompt.clone().unwrap_or_else(|| bench::DRAFT_PROMPT.to_string()),
            })
        }
    };
    p.validate().map_err(anyhow::Error::msg)?;
    Ok(p)
}

fn progress_line(e: &BenchEvent) -> Option<String> {
    match e {
        BenchEvent::Progress {
            index,
            total,
            test,
            stage,
        } => Some(match stage {
            Stage::Warmup => format!("wgllm bench: benchmark {index}/{total}: {test}: warmup run"),
            Stage::Rep(i, n) => {
                format!("wgllm bench: benchmark {index}/{total}: {test}: run {i}/{n}")
            }
        }),
        BenchEvent::Loading {
            model,
            backend,
            done: 0,
            ..
        } => Some(format!(
            "wgllm bench: loading {} on {backend}",
            model.display()
        )),
        _ => None,
    }
}

pub fn bench(a: &BenchArgs) -> Result<()> {
    check_habits(a)?;
    let format: OutputFormat = a.output.parse().map_err(anyhow::Error::msg)?;
    let plan = plan(a)?;
    let md = MdColumns {
        n_batch: plan.n_batch.len() > 1,
        n_ubatch: plan.n_ubatch.len() > 1,
        cache: plan.cache.len() > 1,
        draft: plan.draft.is_some(),
        split: plan.splits_devices(),
    };
    let mut w = Writer::new(format, md);
    let mut out = std::io::stdout().lock();
    let mut profiles = Vec::new();
    let mut io_err = None;
    let mut emit = |out: &mut std::io::StdoutLock, s: &str| {
        if let Err(e) = out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
            io_err.get_or_insert(e);
        }
    };
    emit(&mut out, &w.begin());
    let rows = bench::run_plan(&plan, &mut |e| {
        if a.progress {
            if let Some(line) = progress_line(&e) {
                eprintln!("{line}");
            }
        }
        match e {
            BenchEvent::Row(r) => {
                let s = w.row(r);
                emit(&mut out, &s);
            }
            BenchEvent::Profile(p) => profiles.push(p.clone()),
            _ => {}
        }
    })?;
    emit(&mut out, &w.end());
    if let Some(e) = io_err {
        return Err(e).context("writing the results");
    }
    // md shows the profiles after the table; json and jsonl carry them in their rows;
    // csv has no place for them, so they go to stderr.
    let mut text = String::new();
    for p in &profiles {
        for (step, sp) in [("pp", &p.pp), ("tg", &p.tg)] {
            if let Some(sp) = sp {
                let title = format!(
                    "profile: {} on {} ({}), {step} step",
                    p.model_type, p.backend, p.adapter
                );
                text.push_str(&report::profile_md(&title, sp));
            }
        }
    }
    match format {
        OutputFormat::Md => print!("{text}"),
        OutputFormat::Csv => eprint!("{text}"),
        _ => {}
    }
    if let Some(path) = &a.plot {
        let svg = plot::bench_svg(&rows);
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        log::info!("plot written to {}", path.display());
    }
    if let Some(mmproj) = &a.mmproj {
        let text = image_bench(a, &plan, mmproj)?;
        match format {
            OutputFormat::Md => print!("{text}"),
            _ => eprint!("{text}"),
        }
    }
    Ok(())
}

/// `--mmproj`: one image through the first model's encoder and decode, as a small table.
fn image_bench(a: &BenchArgs, plan: &BenchPlan, mmproj: &std::path::Path) -> Result<String> {
    use wgllm::bench::image::{bench_image, ImageBench};
    let model = &plan.models[0];
    let mut opts = plan.base.clone();
    opts.gpu.backend = plan.backends[0];
    opts.n_ctx = opts.n_ctx.max(1024);
    let mut engine = wgllm::engine::Engine::load(model, &opts, &mut |_, _| {})?;
    engine.attach_vision(&mmproj.display().to_string())?;
    let side = engine.vision().map_or(224, |v| v.hp.image_size);
    let (img, name) = match &a.image {
        Some(p) => {
            let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            let img = wgllm::vision::decode_image(&bytes, &p.display().to_string())?;
            (img, p.display().to_string())
        }
        None => (test_card(side), format!("generated {side}x{side}")),
    };
    let reps = plan.reps.first().copied().unwrap_or(5).max(1);
    let r = bench_image(&mut engine, &img, reps)?;
    let (em, es) = ImageBench::stats(&r.encode_ms);
    let (dm, ds) = ImageBench::stats(&r.decode_ms);
    let n = r.n_tokens;
    Ok(format!(
        "\n| image | tokens | encode ms | decode ms | decode t/s |\n|---|---:|---:|---:|---:|\n| {name} | {n} | {em:.1} ± {es:.1} | {dm:.1} ± {ds:.1} | {:.1} |\n",
        n as f64 / (dm / 1e3)
    ))
}

/// A colour gradient of `side` x `side` pixels.
fn test_card(side: u32) -> wgllm::vision::RgbImage {
    let pixels = (0..side)
        .flat_map(|y| {
            (0..side).flat_map(move |x| [(x * 255 / side) as u8, (y * 255 / side) as u8, 128])
        })
        .collect();
    wgllm::vision::RgbImage {
        width: side,
        height: side,
        pixels,
    }
}
