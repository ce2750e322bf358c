//! Every kernel variant as the SPIR-V wgpu's Vulkan backend would hand a driver, through
//! Khronos' validator (`spirv-val` from spirv-tools 2024 or newer: Debian 12's 2023.1
//! predates cooperative matrices; scripts/spirv-tools.sh unpacks Debian 13's, and README's
//! test command names it in `WGLLM_SPIRV_VAL`): what a Vulkan driver may assume of its
//! input, checked without one. And the products become what the kernels are for: packed
//! dot products where the device has them, cooperative matrices in the matrix kernels.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use wgllm::gpu::spirv::{declares_capability, kernel_spirv, VulkanTarget};
use wgllm::ops::kernels::Products;
use wgllm::ops::KernelKey;

fn spirv_val() -> PathBuf {
    std::env::var_os("WGLLM_SPIRV_VAL")
        .map(PathBuf::from)
        .unwrap_or_else(|| "spirv-val".into())
}

/// `spirv-val`'s verdict on one file: None when valid, else its message.
fn validate(file: &Path, env: &str) -> Option<String> {
    let out = Command::new(spirv_val())
        .args(["--target-env", env])
        .arg(file)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {}: {e}; set WGLLM_SPIRV_VAL to the spirv-val that \
                 scripts/spirv-tools.sh prints",
                spirv_val().display()
            )
        });
    (!out.status.success()).then(|| {
        let text = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
        text.lines().take(4).collect::<Vec<_>>().join("\n")
    })
}

/// Writes each key's SPIR-V for `target` and validates them all, on as many threads as
/// the machine has; returns the failures, by kernel.
fn validate_all(name: &str, keys: &[KernelKey], target: &VulkanTarget) -> Vec<String> {
    let dir = common::scratch_dir(name);
    let env = target.target_env();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunks: Vec<&[KernelKey]> = keys.chunks(keys.len().div_ceil(threads).max(1)).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .enumerate()
            .map(|(c, chunk)| {
                let (dir, env) = (dir.as_path(), env.as_str());
                s.spawn(move || {
                    let mut failed = Vec::new();
                    for (i, key) in chunk.iter().enumerate() {
                        let words = match kernel_spirv(key, target) {
                            Ok(w) => w,
                            Err(e) => {
                                failed.push(format!("{key}: not written: {e}"));
                                continue;
                            }
                        };
                        let file = dir.join(format!("{c}-{i}.spv"));
                        std::fs::write(&file, bytemuck::cast_slice::<u32, u8>(&words)).unwrap();
                        if let Some(e) = validate(&file, env) {
                            failed.push(format!("{key}: {e}"));
                        }
                        std::fs::remove_file(&file).unwrap();
                    }
                    failed
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

#[test]
fn every_kernel_variant_is_valid_spirv_for_vulkan() {
    let keys = KernelKey::all();
    let failed = validate_all("spirv-all", &keys, &VulkanTarget::modern_gpu());
    assert!(
        failed.is_empty(),
        "{} of {} variants:\n{}",
        failed.len(),
        keys.len(),
        failed.join("\n\n")
    );
}

/// On a device without integer dot products naga writes the products out: still valid,
/// and without the capability such a device would refuse.
#[test]
fn integer_dot_kernels_are_valid_without_dot_products_too() {
    let keys: Vec<KernelKey> = (KernelKey::all().into_iter())
        .filter(|k| k.product_instructions() == Products::IntegerDot)
        .collect();
    assert!(keys.len() > 20, "{}", keys.len());
    let plain = VulkanTarget {
        vulkan: (1, 1),
        integer_dot: false,
        ..VulkanTarget::modern_gpu()
    };
    let failed = validate_all("spirv-plain", &keys, &plain);
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    for key in &keys {
        let words = kernel_spirv(key, &plain).unwrap();
        assert!(
            !declares_capability(&words, naga::back::spv::Capability::DotProduct),
            "{key}"
        );
    }
}

/// The products are what the kernels are for: every integer-dot kernel declares packed
/// dot products, every matrix kernel cooperative matrices; the others neither.
#[test]
fn products_declare_the_instructions_they_are_for() {
    use naga::back::spv::Capability as C;
    let target = VulkanTarget::modern_gpu();
    let (mut dot, mut matrix) = (0, 0);
    for key in KernelKey::all() {
        let words = kernel_spirv(&key, &target).unwrap();
        let has_dot = declares_capability(&words, C::DotProductInput4x8BitPacked);
        let has_matrix = declares_capability(&words, C::CooperativeMatrixKHR);
        match key.product_instructions() {
            Products::IntegerDot => {
                assert!(has_dot && !has_matrix, "{key}");
                dot += 1;
            }
            Products::Matrix => {
                assert!(has_matrix, "{key}");
                matrix += 1;
            }
            Products::Plain => assert!(!has_dot && !has_matrix, "{key}"),
        }
    }
    assert!(
        dot > 20 && matrix > 20,
        "{dot} integer-dot, {matrix} matrix kernels"
    );
}

/// `wgllm kernels --spirv` writes the same files with an index naming each one.
#[test]
fn the_kernels_command_writes_spirv_and_an_index() {
    let dir = common::scratch_dir("spirv-cli");
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(["kernels", "--only", "matmul_q8_tile_Q4_0", "--spirv"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index = std::fs::read_to_string(dir.join("index.tsv")).unwrap();
    let lines: Vec<Vec<&str>> = index.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 2, "{index}");
    for f in &lines {
        assert_eq!(f[1..4], ["vulkan1.3", "gpu", "intdot"], "{index}");
        assert!(f[4].starts_with("matmul_q8_tile_Q4_0_"), "{index}");
        let bytes = std::fs::read(dir.join(f[0])).unwrap();
        assert_eq!(bytes[..4], 0x0723_0203u32.to_le_bytes(), "SPIR-V magic");
        assert!(validate(&dir.join(f[0]), "vulkan1.3").is_none());
    }
    let none = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .arg("kernels")
        .output()
        .unwrap();
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("--spirv DIR"));
}
