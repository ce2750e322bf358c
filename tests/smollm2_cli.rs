//! `wgllm run` and `wgllm perplexity` on SmolLM2 against llama.cpp's recorded results.

mod common;

use std::process::Command;

use common::smollm2 as model;

fn wgllm(args: &[&str]) -> String {
    wgllm_out_err(args).0
}

/// Runs wgllm, which must succeed; returns stdout and stderr.
fn wgllm_out_err(args: &[&str]) -> (String, String) {
    wgllm_with_env(args, &[])
}

/// [`wgllm_out_err`] with environment variables set for the run.
fn wgllm_with_env(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(args)
        .envs(env.iter().copied())
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

/// `wgllm run --temp 0 -f PROMPT ARGS` prints a start of `expected`.
fn check_greedy_run(name: &str, expected: &str, n_predict: usize, args: &[&str]) {
    let prompt = common::shared_dir().join(format!("reference/{name}.txt"));
    let n = n_predict.to_string();
    let mut all = vec![
        "run",
        "-m",
        &model(),
        "-f",
        prompt.to_str().unwrap(),
        "-n",
        &n,
        "--temp",
        "0",
        "--no-display-prompt",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
    let out = wgllm(&all);
    assert!(
        out.starts_with(expected),
        "{name} {args:?}: got {out:?}, want a start of {expected:?}"
    );
}

/// `run --temp 0` prints llama.cpp's greedy text up to its first near-tie, on every
/// reference prompt (the chat one is already in SmolLM2's template, special tokens and all),
/// with tokens sampled on the host from the logits (lavapipe's default) and two of them
/// again with the tokens drawn on the GPU.
#[test]
fn greedy_run_reproduces_llama_cpp_text() {
    for name in ["smol-capital", "smol-code", "smol-chat", "smol-story"] {
        check_greedy_run(
            name,
            &common::reliable_prefix(&format!("{name}.cpu.json")),
            48,
            &[],
        );
    }
    for name in ["smol-code", "smol-story"] {
        check_greedy_run(
            name,
            &common::reliable_prefix(&format!("{name}.cpu.json")),
            48,
            &["--sampling", "gpu"],
        );
    }
}

/// With SmolLM2 drafting for itself (`-md`), `run --temp 0` still prints llama.cpp's
/// greedy text, with tokens sampled on the host and with `--sampling gpu` (proposals are
/// checked on the host, the rest drawn on the GPU); the timings end with the acceptance.
#[test]
fn greedy_run_with_a_draft_model_reproduces_llama_cpp_text() {
    for (name, extra) in [("smol-story", None), ("smol-code", Some("gpu"))] {
        let prompt = common::shared_dir().join(format!("reference/{name}.txt"));
        let m = model();
        let mut args = vec![
            "run",
            "-m",
            &m,
            "-md",
            &m,
            "-f",
            prompt.to_str().unwrap(),
            "-n",
            "48",
            "--temp",
            "0",
            "--no-display-prompt",
        ];
        if let Some(s) = extra {
            args.extend(["--sampling", s]);
        }
        let (out, err) = wgllm_out_err(&args);
        let expected = common::reliable_prefix(&format!("{name}.cpu.json"));
        assert!(
            out.starts_with(&expected),
            "{name}: got {out:?}, want a start of {expected:?}"
        );
        let line = err
            .lines()
            .find(|l| l.contains("draft acceptance rate"))
            .unwrap_or_else(|| panic!("no acceptance line in {err}"));
        assert!(!line.contains("(    0 accepted"), "{line}");
    }
}

/// llama-completion's context-shift loop, through `wgllm run` with the same flags
/// (../shared/reference/README.md): counting through 4 shifts of a 128-token context. All
/// 300 of llama.cpp's margins are >= 0.5, so the whole text must match. (The story's first
/// near-tie comes before any shift, and Self-Extend's at the first token: the teacher-forced
/// replays in smollm2_kv.rs cover those.)
#[test]
fn greedy_run_through_context_shifts_reproduces_llama_cpp_text() {
    let expected = common::reliable_prefix("smol-count.ctxshift.json");
    let args = ["-c", "128", "-b", "32", "-ub", "32", "--keep", "4"];
    check_greedy_run("smol-count", &expected, 300, &args);
}

/// No kernel runs on a device before it matched the portable ones there. With the
/// integer-dot kernels broken on purpose (`WGLLM_FAULT=wrong-int-dot`) and asked for
/// (`WGLLM_INT_DOT=1`): `wgllm tune --check` reports them dropped; a run without tuning
/// is refused at load by the kernel audit (which runs whatever chose the kernels), with
/// the kernel and the switch named; a run that tunes at first use drops them with a log
/// line naming them, runs the float kernels and prints llama.cpp's text; `wgllm devices`
/// lists what was dropped.
#[test]
fn kernels_that_fail_their_check_on_the_device_are_never_used() {
    let dir = std::env::temp_dir().join(format!("wgllm-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env = [
        ("WGLLM_FAULT", "wrong-int-dot"),
        ("WGLLM_INT_DOT", "1"),
        ("WGLLM_CACHE_DIR", dir.to_str().unwrap()),
    ];
    let model = model();
    let (out, _) = wgllm_with_env(&["tune", "--check", "-m", &model], &env);
    for row in ["| cpu | decode 2x1 |", "| gpu | decode rows 8 |"] {
        let line = out.lines().find(|l| l.contains(row)).unwrap_or("");
        assert!(line.ends_with("| passed |"), "{row}: {out}");
    }
    for row in ["| gpu | decode int-dot |", "| cpu | prompt int-dot |"] {
        let line = out.lines().find(|l| l.contains(row)).unwrap_or("");
        assert!(line.ends_with("| dropped |"), "{row}: {out}");
    }
    assert!(out.contains("kernels checked, 4 dropped"), "{out}");

    let prompt = common::shared_dir().join("reference/smol-capital.txt");
    let expected = common::reliable_prefix("smol-capital.cpu.json");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            &model,
            "-f",
            prompt.to_str().unwrap(),
            "-n",
            "8",
            "--temp",
            "0",
            "--no-display-prompt",
        ];
        args.extend(extra);
        wgllm_with_env(&args, &env)
    };
    let start: String = expected.chars().take(6).collect();
    let refused = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(["run", "-m", &model, "-p", "Hi", "-n", "2", "--no-tune"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("matmul_q8_Q4_1_") && err.contains("asked for (WGLLM_INT_DOT=1)"),
        "{err}"
    );
    assert!(refused.stdout.is_empty(), "nothing generated");
    let (out, err) = run(&[]);
    assert!(
        err.contains("dropped the cpu decode int-dot kernels")
            && err.contains("WGLLM_INT_DOT=1 not followed"),
        "{err}"
    );
    assert!(
        out.starts_with(&start) && (expected.starts_with(&out) || out.starts_with(&expected)),
        "got {out:?}, want a start of {expected:?}"
    );
    let (devices, _) = wgllm_with_env(&["devices"], &env);
    assert!(
        devices.contains("dropped: cpu decode int-dot (normalized error inf)"),
        "{devices}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// llama-perplexity -c 128 on the same text gives 16.5035 over all 17 chunks (CPU; 16.5758
/// on Vulkan); over the first 8 (`--chunks 8`, tests/data/reference/README.md) 17.9341.
/// Eight chunks score the same code paths in half the time.
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
        "--chunks",
        "8",
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
    let reference = 17.9341;
    assert!(
        ((ppl - reference) / reference).abs() < 0.01,
        "PPL {ppl} is not within 1 % of llama.cpp's {reference}"
    );
    // Eight chunks of 128 tokens scored.
    assert!(
        out.contains("[8]") && !out.contains("[9]"),
        "chunk count differs: {out}"
    );
}

/// The running estimates `[1]a,[2]b,...` of a perplexity run's output.
fn running_estimates(out: &str) -> Vec<f64> {
    out.lines()
        .filter(|l| l.starts_with("[1]"))
        .flat_map(|l| l.split(','))
        .filter_map(|e| e.split(']').nth(1)?.trim().parse().ok())
        .collect()
}

/// With every matmul on integer dot products (`WGLLM_INT_DOT=1`: SmolLM2's Q4_1 and
/// Q8_0 weights times activations quantized to 8-bit blocks), the first two chunks score
/// as llama-perplexity's do (its running estimates over `-c 128`: 13.4571, then 19.1221;
/// llama.cpp's CPU backend also multiplies these types by 8-bit activations). Two
/// chunks: the integer kernel is shaped for GPUs and slow on lavapipe's prompts. A
/// profile shows the switch took the integer kernels.
#[test]
fn perplexity_with_integer_dot_products_tracks_llama_cpp() {
    let text = common::shared_dir().join("reference/ppl-text.txt");
    let model = model();
    let args = [
        "perplexity",
        "-m",
        &model,
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "2",
    ];
    let int_dot = [("WGLLM_INT_DOT", "1")];
    let ppl = running_estimates(&wgllm_with_env(&args, &int_dot).0);
    let reference = [13.4571, 19.1221];
    assert_eq!(ppl.len(), 2, "{ppl:?}");
    for (i, (&a, &r)) in ppl.iter().zip(&reference).enumerate() {
        // The float kernels' first chunk is 2.4 % off (13.777); this one 1.6 %.
        assert!(
            ((a - r) / r).abs() < 0.02,
            "chunk {}: PPL {a} with integer dot products, llama.cpp {r}",
            i + 1
        );
    }
    let bench = [
        "bench",
        "-m",
        &model,
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "--profile",
    ];
    let prof = wgllm_with_env(&bench, &int_dot).0;
    for op in [
        "| quantize_q8 |",
        "| matmul_q8 q4_1 |",
        "| matmul_q8_glu q4_1 |",
    ] {
        assert!(prof.contains(op), "no {op} in the profile:\n{prof}");
    }
    assert!(!prof.contains("| matmul q4_1 |"), "{prof}");
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
        "128",
        "-n",
        "400",
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
    // The first shift comes when 127 cells are used; each frees (127 - 1) / 2 = 63
    // (n_keep is BOS alone), so 405 tokens take 5.
    assert_eq!(shifts, 5, "context shifts");
    assert!(err.contains("/   400 runs"), "400 tokens generated: {err}");
    assert!(out.len() > 400, "text came out ({} bytes)", out.len());
}

/// `wgllm chat` over stdin: the first turn, rendered with SmolLM2's template (its default
/// system prompt included), is llama.cpp's smol-chat prompt, so the greedy reply starts with
/// llama.cpp's reliable prefix; a second turn continues the conversation; end of input ends
/// the chat cleanly with timings.
#[test]
fn chat_over_stdin_answers_as_llama_cpp() {
    let (code, stdout, stderr) = common::wgllm_with_stdin(
        &["chat", "-m", &model(), "--temp", "0", "-n", "24"],
        "What is the boiling point of water at sea level?\nAnd in Fahrenheit?\n",
    );
    assert_eq!(code, 0, "chat failed: {stderr}");
    let replies: Vec<&str> = stdout
        .split("> ")
        .filter(|r| !r.trim().is_empty())
        .collect();
    assert_eq!(replies.len(), 2, "two replies expected: {stdout:?}");
    let expected = common::reliable_prefix("smol-chat.cpu.json");
    assert!(
        replies[0].starts_with(&expected),
        "first reply {:?} does not start with llama.cpp's {expected:?}",
        replies[0]
    );
    assert!(
        replies[1].trim().len() > 3,
        "empty second reply: {stdout:?}"
    );
    assert!(stderr.contains("eval time"), "no timings: {stderr}");
}

/// A successful run says nothing alarming: no line of its stderr names an error or a
/// warning, also where `XDG_RUNTIME_DIR` is unset (Mesa's EGL, probed for GL adapters,
/// complained into every run there).
#[test]
fn a_successful_run_prints_no_error_or_warning() {
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args([
            "run",
            "-m",
            &model(),
            "-p",
            "The capital of France is",
            "-n",
            "4",
        ])
        .args(["--temp", "0"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    for line in err.lines() {
        let l = line.to_lowercase();
        assert!(
            !l.contains("error") && !l.contains("warn"),
            "{line:?} in:\n{err}"
        );
    }
}
