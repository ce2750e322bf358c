//! Gemma-3-270M (Q4_K_M) against llama.cpp's own outputs (../shared/reference): the
//! gemma3 graph (sandwich norms, per-head Q/K norms, GELU, tied output), its interleaved
//! sliding-window attention (gemma-long is longer than the window of 512) and its quant
//! types. Teacher-forced as in smollm2_reference.rs.
//!
//! `WGLLM_GEMMA3` picks another file of the same model (e.g. requantized with
//! llama-quantize) and `WGLLM_GEMMA3_REFS` a directory of refdump outputs for it named
//! `gemma-<prompt>.json`, so any quant type can be checked against llama.cpp.

mod common;

use std::sync::Arc;
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::model::Model;

fn gemma(opts: &GpuOptions) -> Arc<Model> {
    let path = common::model_path("WGLLM_GEMMA3", "gemma-3-270m-q4_k_m.gguf");
    let f = GgufFile::open(&path).unwrap();
    Arc::new(Model::load(Gpu::new(opts).unwrap(), &f, &mut |_, _| {}).unwrap())
}

fn reference(prompt: &str) -> common::Reference {
    let path = match std::env::var("WGLLM_GEMMA3_REFS") {
        Ok(dir) => std::path::Path::new(&dir).join(format!("gemma-{prompt}.json")),
        Err(_) => common::shared_dir().join(format!("reference/gemma-{prompt}.cpu.json")),
    };
    common::Reference::load(&path)
}

#[test]
fn teacher_forced_top1_matches_llama_cpp() {
    let model = gemma(&GpuOptions::default());
    let mut checked = 0;
    for prompt in ["capital", "chat", "long"] {
        let r = reference(prompt);
        // gemma-long (670 prompt tokens) in chunks of 256 also crosses the window
        // boundary inside a ubatch.
        checked += common::teacher_forced(&model, &r, 1024, 256, 0.5).0;
    }
    assert!(checked > 60, "only {checked} positions checked");
}
