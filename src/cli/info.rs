//! `wgllm inspect` and `wgllm devices`.

use super::GpuArgs;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use wgllm::gguf::GgufFile;
use wgllm::gpu::list_adapters;

#[derive(Args)]
pub struct InspectArgs {
    /// GGUF file.
    pub file: PathBuf,
    /// Print the whole tensor table (default: the first 20 tensors).
    #[arg(long)]
    pub all: bool,
}

pub fn inspect(a: &InspectArgs) -> Result<()> {
    let f = GgufFile::open(&a.file)?;
    println!(
        "file: {} (GGUF v{}, {} bytes)",
        f.path,
        f.version,
        f.file_size()
    );
    println!("metadata ({} keys):", f.metadata.len());
    for (k, v) in &f.metadata {
        println!("  {k:<48} {:<7} {v}", v.type_name());
    }
    println!(
        "tensors ({}), data at byte {} (alignment {}):",
        f.tensors.len(),
        f.data_offset,
        f.alignment
    );
    let shown = if a.all {
        f.tensors.len()
    } else {
        f.tensors.len().min(20)
    };
    for t in &f.tensors[..shown] {
        let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
        println!(
            "  {:<32} {:<6} [{}] {} bytes at {}",
            t.name,
            t.ty.to_string(),
            dims.join(", "),
            t.n_bytes,
            t.file_offset
        );
    }
    if shown < f.tensors.len() {
        println!("  … {} more (--all lists them)", f.tensors.len() - shown);
    }
    Ok(())
}

#[derive(Args)]
pub struct DevicesArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
}

pub fn devices(a: &DevicesArgs) -> Result<()> {
    let list = list_adapters(a.gpu.backend);
    if list.is_empty() {
        anyhow::bail!(
            "no GPU adapters found for backend `{}`; on Linux without a GPU, install mesa-vulkan-drivers (software Vulkan)",
            a.gpu.backend
        );
    }
    for d in &list {
        println!(
            "[{}] {} ({}, {})",
            d.index, d.name, d.backend, d.device_type
        );
        println!("    driver: {}", d.driver);
        println!(
            "    max storage binding {} MiB, max buffer {} MiB, workgroup memory {} KiB",
            d.max_storage_binding >> 20,
            d.max_buffer >> 20,
            d.max_workgroup_storage >> 10
        );
        println!(
            "    shader-f16: {}, subgroups: {} (size {}..{})",
            if d.shader_f16 { "yes" } else { "no" },
            if d.subgroups { "yes" } else { "no" },
            d.subgroup_size.0,
            d.subgroup_size.1
        );
        println!(
            "    cooperative matrices: {}",
            if d.cooperative_matrices.is_empty() {
                "none".to_string()
            } else {
                d.cooperative_matrices.join(", ")
            }
        );
    }
    if list.len() > 1 {
        println!("{}", together(&list));
    }
    let (file, entries) = wgllm::tune::cached_entries(&super::tune_options(false, false));
    if let Some(file) = file {
        if entries.is_empty() {
            println!(
                "no tuned choices yet ({}; `wgllm tune -m MODEL` measures)",
                file.display()
            );
        } else {
            println!("tuned choices ({}):", file.display());
            for e in &entries {
                println!("  {}", super::tune::describe(e));
            }
        }
    }
    Ok(())
}

/// Which of the adapters can run one model split by layers: any set of them, each a device
/// of its own in one process; those reaching the same hardware through different backends
/// share its memory and compute, so a split over them shows the split working and is no
/// faster than one of them.
fn together(list: &[wgllm::gpu::AdapterSummary]) -> String {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for d in list {
        let id = wgllm::tune::hardware_id(d);
        match groups.iter_mut().find(|g| g.0 == id) {
            Some(g) => g.1.push(d.index),
            None => groups.push((id, vec![d.index])),
        }
    }
    let indices = |v: &[usize]| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let all = list.iter().map(|d| d.index).collect::<Vec<_>>();
    let mut out = format!(
        "split a model by layers over any of these: --device {} (-sm layer, -ts shares, -mg main)",
        indices(&all)
    );
    for (_, g) in groups.iter().filter(|g| g.1.len() > 1) {
        out.push_str(&format!(
            "\n    adapters {} reach the same hardware through different backends: split over them, they share its memory and compute",
            indices(g)
        ));
    }
    out
}
