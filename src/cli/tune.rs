//! `wgllm tune`: measures the kernel shapes (and, with `--backend auto`, the backends
//! reaching the same device) on one layer of a model, prints every candidate's time and
//! caches the choice that `run`, `chat`, `perplexity` and `bench` then use.

use super::GpuArgs;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::gguf::GgufFile;
use wgllm::gpu::KernelShape;
use wgllm::tune::{self, TuneEntry};

#[derive(Args)]
pub struct TuneArgs {
    /// Path to a GGUF model: its own matrix sizes and types are timed.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Only check every candidate kernel against the portable ones on the device (random
    /// inputs through the model's first layer), timing and caching nothing.
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

pub fn tune(a: &TuneArgs) -> Result<()> {
    if a.gpu.no_tune {
        anyhow::bail!("--no-tune turns tuning off; `wgllm tune` is for measuring");
    }
    a.gpu.one_device(
        "`wgllm tune` measures one adapter at a time (a split takes each adapter's own cached choice)",
    )?;
    let mut gpu = a.gpu.options()?;
    if gpu.kernels != KernelShape::Auto {
        anyhow::bail!(
            "--kernels {} fixes the kernel shape; `wgllm tune` measures the shapes (leave --kernels auto)",
            gpu.kernels
        );
    }
    gpu.kernels = KernelShape::Auto;
    let f = GgufFile::open(&a.model).with_context(|| format!("reading {}", a.model.display()))?;
    let topts = super::tune_options(false, true);
    if a.check {
        return check(&gpu, &f);
    }
    println!("| backend | kernels | candidate | checked: normalized error | one layer |");
    println!("| --- | --- | --- | ---: | ---: |");
    let r = tune::resolve(
        &gpu,
        &topts,
        &f,
        &mut |backend: &str, t: &tune::CandidateTime| {
            let error = t
                .check
                .as_ref()
                .map_or("-".into(), |c| format!("{:.1e}", c.nmse));
            println!(
                "| {backend} | {} | {} | {error} | {} |",
                t.kernels,
                t.name,
                t.outcome()
            )
        },
    )?;
    println!();
    for (i, e) in r.entries.iter().enumerate() {
        println!(
            "{} {}",
            if i == 0 { "chosen:" } else { "beside:" },
            describe(e)
        );
    }
    if let Some(dir) = topts.dir() {
        println!("cached in {}", tune::TuneCache::file(&dir).display());
    }
    Ok(())
}

/// `--check`: each candidate's error against the portable kernels, and a summary line.
fn check(gpu: &wgllm::gpu::GpuOptions, f: &GgufFile) -> Result<()> {
    println!("| backend | kernels | candidate | normalized error | bound | verdict |");
    println!("| --- | --- | --- | ---: | ---: | --- |");
    let checks = tune::check_only(gpu, f, &mut |backend, t| {
        if let Some(c) = &t.check {
            println!(
                "| {backend} | {} | {} | {:.1e} | {:.0e} | {} |",
                t.kernels,
                t.name,
                c.nmse,
                c.bound,
                if c.passed() { "passed" } else { "dropped" }
            )
        }
    })?;
    let dropped: Vec<&str> = checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| c.name.as_str())
        .collect();
    println!();
    if dropped.is_empty() {
        println!("{} kernels checked, all passed", checks.len());
    } else {
        println!(
            "{} kernels checked, {} dropped (never used on this device): {}",
            checks.len(),
            dropped.len(),
            dropped.join(", ")
        );
    }
    Ok(())
}

/// One line for a tuned choice: adapter, backend, kernels with their tiles, times.
pub fn describe(e: &TuneEntry) -> String {
    let mut knobs = Vec::new();
    let pair = |(a, b): (u32, u32)| format!("{a}x{b}");
    if let Some(t) = e.cpu_decode_tile {
        knobs.push(format!("decode {}", pair(t)));
    }
    if let Some(t) = e.cpu_prompt_tile {
        knobs.push(format!("prompt {}", pair(t)));
    }
    if let Some(r) = e.gpu_vec_rows {
        knobs.push(format!("decode rows {r}"));
    }
    if let Some(t) = e.gpu_tile {
        knobs.push(format!("prompt tile {}", pair(t)));
    }
    for (kind, on) in [("decode", e.int_dot_decode), ("prompt", e.int_dot_prompt)] {
        if on == Some(true) {
            knobs.push(format!("{kind} int-dot"));
        }
    }
    if e.coop_matrix == Some(true) {
        knobs.push("prompt coop-matrix".into());
    }
    let draws = match (e.draw_gpu_busy_us, e.draw_host_us, e.gpu_draws()) {
        (Some(g), Some(h), Some(gpu)) => format!(
            "; a token drawn on the GPU {g:.0} us, read back and sampled {h:.0} us: --sampling auto is {}",
            if gpu { "gpu" } else { "cpu" }
        ),
        _ => String::new(),
    };
    let dropped: Vec<String> = e
        .dropped()
        .map(|c| format!("{} (normalized error {:.1e})", c.name, c.nmse))
        .collect();
    let checks = match (e.checks.len(), dropped.is_empty()) {
        (0, _) => String::new(),
        (n, true) => format!("; {n} kernels checked on the device, all passed"),
        (n, false) => format!(
            "; {n} kernels checked on the device, dropped: {}",
            dropped.join(", ")
        ),
    };
    let first_use = if e.first_use {
        format!(
            "; measured at a first use to a time budget, {} candidates left: `wgllm tune -m MODEL` may find faster ones",
            e.left
        )
    } else {
        String::new()
    };
    format!(
        "{} on {} ({}): {} kernels ({}), {:.0} us per layer and decoded token, {:.1} per prompt token{draws}{checks}{first_use}; model {}",
        e.adapter,
        e.backend,
        e.driver,
        e.kernels,
        knobs.join(", "),
        e.decode_us,
        e.prompt_us,
        e.model
    )
}
