//! Replaying llama.cpp's own context-shift and Self-Extend loops (refshift recordings)
//! through the engine.

use std::path::Path;
use std::sync::Arc;
use wgllm::engine::{CacheOp, Engine, EngineOptions, SessionParams, ShiftPolicy};
use wgllm::kv::KvConfig;
use wgllm::model::Model;
use wgllm::tokenizer::Tokenizer;

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

/// Replays a refshift recording (llama-completion's context-shift or Self-Extend loop)
/// through an engine over `model` with the cache types and flash attention of `kv`:
/// teacher-forced, the same top-1 token wherever llama.cpp's margin is at least 0.5, and
/// the same cache operations in the same order. Returns the steps checked, which must be
/// at least `min_checked` of the recording's steps.
pub fn replay_recording(
    model: &(Arc<Model>, Tokenizer),
    path: &Path,
    kv: KvConfig,
    min_checked: fn(usize) -> usize,
) -> usize {
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
        checked >= min_checked(margins.len()),
        "{file}: only {checked} of {} steps checked",
        margins.len()
    );
    checked
}
