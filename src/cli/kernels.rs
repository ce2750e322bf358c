//! `wgllm kernels`: every kernel variant as a driver would receive it, written to files
//! for tools that check kernels without a GPU: Khronos' `spirv-val`, and GPU compilers
//! on a device that is not there (`scripts/kernel-stats.sh` runs AMD's through Mesa's
//! RADV null device).

use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::fmt::Write as _;
use std::path::PathBuf;
use wgllm::gpu::spirv::{kernel_spirv, VulkanTarget};
use wgllm::ops::KernelKey;

#[derive(Args)]
pub struct KernelsArgs {
    /// Write each variant as the SPIR-V wgpu's Vulkan backend would create it from on a
    /// current GPU (Vulkan 1.3: SPIR-V 1.6, shader-f16, subgroups, cooperative matrices,
    /// integer dot products) into DIR: NNNN.spv and index.tsv.
    #[arg(long, value_name = "DIR")]
    pub spirv: Option<PathBuf>,
    /// The device's Vulkan version, which sets the SPIR-V version (1.1: 1.3, 1.2: 1.5,
    /// 1.3: 1.6).
    #[arg(long, default_value = "1.3", value_parser = parse_vulkan)]
    pub vulkan: (u8, u8),
    /// Write for a device without integer dot products (naga then writes them out).
    #[arg(long)]
    pub no_integer_dot: bool,
    /// Only the variants whose name contains this text.
    #[arg(long, value_name = "TEXT")]
    pub only: Option<String>,
}

fn parse_vulkan(s: &str) -> Result<(u8, u8), String> {
    match s {
        "1.0" => Ok((1, 0)),
        "1.1" => Ok((1, 1)),
        "1.2" => Ok((1, 2)),
        "1.3" => Ok((1, 3)),
        "1.4" => Ok((1, 4)),
        _ => Err(format!("`{s}` is not a Vulkan version from 1.0 to 1.4")),
    }
}

pub fn kernels(a: &KernelsArgs) -> Result<()> {
    let Some(dir) = &a.spirv else {
        bail!("say what to write: --spirv DIR (every kernel variant as SPIR-V, with index.tsv)");
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let target = VulkanTarget {
        vulkan: a.vulkan,
        integer_dot: !a.no_integer_dot,
        ..VulkanTarget::modern_gpu()
    };
    // index.tsv: file, Vulkan environment, the shapes that select it (gpu: any adapter
    // with GPU-shaped kernels, cpu: CPU-shaped adapters only), what its products should
    // compile to, the kernel's name. A variant naga could not write has `-` as its file
    // and the reason after its name.
    let mut index = String::new();
    let (mut written, mut failed) = (0usize, Vec::new());
    for (i, key) in KernelKey::all().into_iter().enumerate() {
        let name = key.to_string();
        if a.only.as_ref().is_some_and(|t| !name.contains(t.as_str())) {
            continue;
        }
        let shape = if key.cpu_shaped() { "cpu" } else { "gpu" };
        let products = key.product_instructions().name();
        match kernel_spirv(&key, &target) {
            Ok(words) => {
                let file = format!("{i:04}.spv");
                std::fs::write(dir.join(&file), bytemuck::cast_slice::<u32, u8>(&words))
                    .with_context(|| format!("writing {}", dir.join(&file).display()))?;
                let env = target.target_env();
                let _ = writeln!(index, "{file}\t{env}\t{shape}\t{products}\t{name}");
                written += 1;
            }
            Err(e) => {
                let first = e.lines().next().unwrap_or("").to_string();
                let _ = writeln!(index, "-\t-\t{shape}\t{products}\t{name}\t{first}");
                failed.push(format!("{name}: {e}"));
            }
        }
    }
    let path = dir.join("index.tsv");
    std::fs::write(&path, index).with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "{written} kernel variants written as SPIR-V {}.{} to {}",
        target.spirv_version().0,
        target.spirv_version().1,
        dir.display()
    );
    if !failed.is_empty() {
        bail!(
            "{} variants could not be written:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    Ok(())
}
