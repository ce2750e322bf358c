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

/// `wgllm run --temp 0 --sampling gpu` prints llama.cpp's greedy text up to its first
/// near-tie: Gemma's 262 144 logits per token are drawn from on the GPU (the first pass
/// in 64 segments) and only the token comes back.
#[test]
fn greedy_run_with_gpu_draws_reproduces_llama_cpp_text() {
    let path = common::model_path("WGLLM_GEMMA3", "gemma-3-270m-q4_k_m.gguf");
    let prompt = common::shared_dir().join("reference/gemma-capital.txt");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args([
            "run",
            "-m",
            path.to_str().unwrap(),
            "-f",
            prompt.to_str().unwrap(),
        ])
        .args([
            "-n",
            "24",
            "--temp",
            "0",
            "--no-display-prompt",
            "--sampling",
            "gpu",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = common::reliable_prefix("gemma-capital.cpu.json");
    let n = expected.chars().count().min(text.chars().count()).max(20);
    let want: String = expected.chars().take(n).collect();
    assert!(
        text.starts_with(&want),
        "got {text:?}, want a start of {expected:?}"
    );
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

/// llama.cpp's context-shift loop on Gemma (-c 1000 -b 64 --keep 16: two shifts of 491
/// positions, recorded with a full-size cache for the sliding-window layers), replayed
/// teacher-forced through the rolling buffer: the prompt and greedy tokens go in in
/// chunks of up to 64, the recorded cache operations are applied where llama.cpp applied
/// them, and the top-1 must equal llama.cpp's (all margins are >= 0.5) at the 64 steps
/// after each shift, the last 16 and every 16th step (each logits row of Gemma's 262144
/// tokens costs more than the rest of a token on lavapipe: all 1500 take 20 minutes).
/// After each shift the kept prefix is back inside the window of 512: the buffer must
/// still hold it (llama.cpp's own small SWA cache does not, and drifts).
#[test]
fn context_shifts_through_the_rolling_buffer_match_llama_cpp() {
    use wgllm::context::{Batch, Context, ContextParams};
    let model = gemma(&GpuOptions::default());
    let path = common::shared_dir().join("reference/gemma-count.ctxshift.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        (r[k].as_array().unwrap().iter())
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let (prompt, greedy) = (ids("prompt_tokens"), ids("greedy_tokens"));
    let margins: Vec<f64> = (r["top1_margins"].as_array().unwrap().iter())
        .map(|v| v.as_f64().unwrap())
        .collect();
    let p = &r["params"];
    let n_ctx = p["n_ctx"].as_u64().unwrap() as u32;
    let n_keep = p["n_keep"].as_u64().unwrap() as u32;
    let mut ctx = Context::new(
        model.clone(),
        ContextParams {
            swa_keep: n_keep,
            ..ContextParams::new(n_ctx, 64, 64)
        },
    )
    .unwrap();
    let window = ctx.memory().maps()[1].cells.len();
    assert!(window < n_ctx as usize, "buffer of {window} cells");
    let mut ops = r["cache_ops"].as_array().unwrap().iter();

    let n_vocab = model.hp.n_vocab as usize;
    let mut stream = prompt.clone();
    stream.extend(&greedy[..greedy.len() - 1]);
    let first_out = prompt.len() - 1; // stream index whose logits predict greedy[0]
    let n_steps = greedy.len();
    let (mut i, mut n_past, mut checked, mut shifts) = (0usize, 0i32, 0usize, 0);
    let mut shifted_at = None::<usize>;
    let wanted = |step: usize, shifted_at: Option<usize>| {
        step.is_multiple_of(16) || step + 16 >= n_steps || shifted_at.is_some_and(|a| step < a + 64)
    };
    while i < stream.len() {
        if n_past + 1 >= n_ctx as i32 {
            // The loop's shift, as recorded: seq_rm then seq_add, at this n_past.
            for _ in 0..2 {
                let o = ops.next().expect("a recorded cache operation");
                assert_eq!(o["n_past"].as_i64().unwrap() as i32, n_past);
                let (p0, p1, v) = (
                    o["p0"].as_i64().unwrap() as i32,
                    o["p1"].as_i64().unwrap() as i32,
                    o["v"].as_i64().unwrap() as i32,
                );
                match o["op"].as_str().unwrap() {
                    "seq_rm" => ctx.seq_rm(Some(0), p0, p1).unwrap(),
                    "seq_add" => {
                        ctx.seq_add(0, p0, p1, v).unwrap();
                        n_past += v;
                    }
                    other => panic!("unexpected operation {other}"),
                }
            }
            shifts += 1;
            shifted_at = Some(i.saturating_sub(first_out));
        }
        // Up to 64 tokens, never past the point where the loop shifts.
        let room = (n_ctx as i32 - 1 - n_past) as usize;
        let n = 64.min(stream.len() - i).min(room.max(1));
        let mut b = Batch::simple(&stream[i..i + n], n_past, true);
        let out = |j: usize| j >= first_out && wanted(j - first_out, shifted_at);
        for (k, l) in b.logits.iter_mut().enumerate() {
            *l = out(i + k);
        }
        let rows: Vec<usize> = (i..i + n).filter(|&j| b.logits[j - i]).collect();
        let logits = ctx.decode(&b).unwrap();
        for (row, j) in logits.chunks(n_vocab).zip(rows) {
            let step = j - first_out;
            if margins[step] >= 0.5 {
                assert_eq!(
                    common::argmax(row),
                    greedy[step],
                    "step {step} (n_past {}, margin {})",
                    n_past + (j - i) as i32,
                    margins[step]
                );
                checked += 1;
            }
        }
        i += n;
        n_past += n as i32;
    }
    assert_eq!(shifts, 2, "llama.cpp shifted twice");
    assert!(ops.next().is_none(), "every recorded operation applied");
    assert!(checked >= 200, "only {checked} steps checked");
}
