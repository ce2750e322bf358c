//! `wgllm bench` end to end on SmolLM2 (lavapipe and llvmpipe): lists expand into one row
//! per test and backend, the json, jsonl and csv outputs parse with llama-bench's field
//! names, --plot writes a line per series, --profile lists ops with their shares, and
//! bad input fails with a message. Sizes are tiny: the software adapters are slow.

mod common;

use common::wgllm;

use serde_json::Value;

fn ok(args: &[&str]) -> String {
    let (code, out, err) = wgllm(args);
    assert_eq!(code, 0, "{args:?}: exit {code}, stderr: {err}");
    out
}

const FIELDS: [&str; 30] = [
    "build_commit",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "model_n_params_active",
    "n_batch",
    "n_ubatch",
    "type_k",
    "type_v",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
    "backend",
    "adapter",
    "driver",
    "kernels",
    "gpu_mem_bytes",
    "dispatches_per_token",
    "barriers_per_token",
    "record_us",
];

/// One row per line of `-o jsonl` output.
fn jsonl_rows(out: &str) -> Vec<Value> {
    (out.lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn check_row(r: &Value, reps: usize) {
    for f in FIELDS {
        assert!(r.get(f).is_some(), "row lacks {f}: {r}");
    }
    assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["samples_ts"].as_array().unwrap().len(), reps, "{r}");
    assert_eq!(r["samples_ns"].as_array().unwrap().len(), reps, "{r}");
    assert!(r["model_n_params"].as_u64().unwrap() > 100_000_000);
    // A dense model uses all of its parameters for every token.
    assert_eq!(r["model_n_params_active"], r["model_n_params"]);
    assert!(r["gpu_mem_bytes"].as_u64().unwrap() > 50 << 20, "{r}");
    let dispatches = r["dispatches_per_token"].as_u64().unwrap();
    assert!(dispatches > 100, "{r}");
    // A decoded token is mostly a chain of ops, each reading the one before: nearly every
    // dispatch waits for a barrier, but never more than there are.
    let barriers = r["barriers_per_token"].as_u64().unwrap();
    assert!(barriers > dispatches / 2 && barriers < dispatches, "{r}");
}

/// Splits one CSV line into cells (quoted cells, doubled quotes inside).
fn csv_cells(line: &str) -> Vec<String> {
    let (mut cells, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => cells.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    cells.push(cur);
    cells
}

#[test]
fn lists_give_a_row_per_test_and_backend_with_a_plot() {
    let m = common::smollm2();
    let svg = std::env::temp_dir().join(format!("wgllm-bench-{}.svg", std::process::id()));
    let out = ok(&[
        "bench",
        "-m",
        &m,
        "-p",
        "16,32",
        "-n",
        "4",
        "-r",
        "2",
        "--backend",
        "vulkan,gl",
        "-o",
        "json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let rows: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let rows = rows.as_array().unwrap();
    let tests: Vec<(String, String)> = (rows.iter())
        .map(|r| {
            check_row(r, 2);
            (
                r["backend"].as_str().unwrap().into(),
                r["test"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = ["vulkan", "gl"]
        .iter()
        .flat_map(|b| ["pp16", "pp32", "tg4"].map(|t| (b.to_string(), t.to_string())))
        .collect();
    assert_eq!(tests, want);
    assert_eq!(rows[0]["n_prompt"], 16);
    assert_eq!(rows[2]["n_gen"], 4);
    assert_eq!(rows[3]["backends"], "Gl");
    // pp and tg on each backend: four lines.
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
    assert!(svg.contains("tokens/s") && svg.contains("vulkan") && svg.contains(" gl "));
}

#[test]
fn jsonl_with_profile_and_csv_parse() {
    let m = common::smollm2();
    let out = ok(&[
        "bench",
        "-m",
        &m,
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "-c",
        "64",
        "--backend",
        "vulkan",
        "-o",
        "jsonl",
        "--profile",
    ]);
    let rows = jsonl_rows(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        check_row(r, 1);
        let ops = r["profile"]["ops"].as_array().unwrap();
        let mm = (ops.iter())
            .find(|o| o["op"].as_str().unwrap().starts_with("matmul"))
            .unwrap_or_else(|| panic!("no matmul in {ops:?}"));
        let share = mm["share"].as_f64().unwrap();
        assert!(share > 0.0 && share <= 1.0, "{mm}");
        assert!(r["profile"]["timing"].as_str().unwrap().len() > 10);
    }

    let (code, out, err) = wgllm(&[
        "bench",
        "-m",
        &m,
        "-p",
        "4",
        "-n",
        "0",
        "-r",
        "1",
        "-c",
        "64",
        "--backend",
        "gl",
        "-o",
        "csv",
        "--profile",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let header = csv_cells(lines.next().unwrap());
    for f in FIELDS {
        assert!(
            header.iter().any(|h| h == f),
            "csv header lacks {f}: {header:?}"
        );
    }
    let rows: Vec<Vec<String>> = lines.map(csv_cells).collect();
    assert_eq!(rows.len(), 1, "{out}");
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    assert_eq!(rows[0].len(), header.len());
    assert_eq!(rows[0][col("n_prompt")], "4");
    assert!(rows[0][col("avg_ts")].parse::<f64>().unwrap() > 0.0);
    assert_eq!(rows[0][col("samples_ns")].split(' ').count(), 1);
    // csv has no place for the profile: its md table goes to stderr.
    assert!(
        err.contains("| matmul q4_1 |") && err.contains(" % |"),
        "{err}"
    );
}

#[test]
fn bad_input_fails_with_a_message() {
    let m = common::smollm2();
    for (args, needle) in [
        (vec!["--backend", "vulkan,nope"], "unknown backend `nope`"),
        (vec!["-p", "64-16"], "before it starts"),
        (vec!["-n", "1-9*1"], "multiplier below 2"),
        (vec!["-d", "x"], "not a non-negative integer"),
        (vec!["-o", "xml"], "unknown output format `xml`"),
        (vec!["-pg", "16"], "PROMPT,GEN"),
        (vec!["-r", "0"], "at least 1"),
        (vec!["-p", "0", "-n", "0"], "no tests"),
        (vec!["-t", "1,2"], "no CPU threads"),
        (vec!["-ngl", "0"], "CPU-only"),
        (vec!["-fa", "0,maybe"], "on, off or auto"),
        (vec!["-ctk", "q4_k"], "q8_0, q4_0"),
        (vec!["-ctv", "q8_0", "-fa", "0"], "needs flash attention"),
    ] {
        let mut a = vec!["bench", "-m", m.as_str()];
        a.extend(args.iter().copied());
        let (code, _, err) = wgllm(&a);
        assert_eq!(code, 1, "{a:?}: exit {code}: {err}");
        assert!(
            err.contains(needle),
            "{a:?}: stderr lacks {needle:?}: {err}"
        );
    }
    let (code, _, err) = wgllm(&[
        "bench",
        "-m",
        "/no/such.gguf",
        "-p",
        "4",
        "-n",
        "0",
        "-r",
        "1",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
}

/// `-ctk`, `-ctv` and `-fa` lists: one load per combination, each row naming the cache
/// types and flash attention it ran with (llama-bench's `type_k`, `type_v`, `flash_attn`).
#[test]
fn cache_type_lists_run_one_load_each() {
    let m = common::smollm2();
    let args = ["bench", "-m", m.as_str(), "-p", "16", "-n", "0", "-r", "1"];
    let mut a = args.to_vec();
    a.extend([
        "-ctk",
        "bf16,q8_0",
        "-ctv",
        "q4_0",
        "-fa",
        "1,auto",
        "-o",
        "jsonl",
    ]);
    let (code, out, err) = wgllm(&a);
    assert_eq!(code, 0, "{err}");
    let rows = jsonl_rows(&out);
    let got: Vec<(String, String, u64)> = rows
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap().to_string();
            (s("type_k"), s("type_v"), r["flash_attn"].as_u64().unwrap())
        })
        .collect();
    let want = [("bf16", 1), ("bf16", 1), ("q8_0", 1), ("q8_0", 1)];
    assert_eq!(got.len(), 4, "{out}");
    for ((k, v, fa), (wk, wfa)) in got.iter().zip(want) {
        assert_eq!((k.as_str(), v.as_str(), *fa), (wk, "q4_0", wfa));
    }
}

/// A pp test fills its context exactly (depth + prompt); drawing on the GPU, the tg
/// tests' pipelined loop once submitted a step even for a pp test, which took a cell past
/// the end ("the KV cache is full") and was timed with the prompt.
#[test]
fn prompt_tests_fill_their_context_when_the_gpu_draws() {
    let m = common::smollm2();
    let out = ok(&[
        "bench",
        "-m",
        m.as_str(),
        "-p",
        "16",
        "-n",
        "0",
        "-d",
        "0,8",
        "-r",
        "1",
        "--sampling",
        "gpu",
        "-o",
        "jsonl",
    ]);
    let rows = jsonl_rows(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        check_row(r, 1);
        assert_eq!(r["n_prompt"].as_u64(), Some(16), "{r}");
    }
}

/// `-md`: a tg test generates from a text prompt with the draft proposing; its row
/// counts the proposals and the kept ones. SmolLM2 drafting for itself, greedy, keeps
/// (nearly) every proposal; a pp test of the same run stays a plain one. What a
/// speculative benchmark cannot take is refused.
#[test]
fn draft_model_rows_count_proposals() {
    let m = common::smollm2();
    let out = ok(&[
        "bench",
        "-m",
        &m,
        "-md",
        &m,
        "-p",
        "8",
        "-n",
        "12",
        "-r",
        "1",
        "-o",
        "jsonl",
        "--no-tune",
    ]);
    let rows = jsonl_rows(&out);
    assert_eq!(rows.len(), 2, "{out}");
    let (pp, tg) = (&rows[0], &rows[1]);
    check_row(tg, 1);
    assert_eq!(pp["n_drafted"], 0, "{pp}");
    assert_eq!(tg["draft_model"], m.as_str());
    let drafted = tg["n_drafted"].as_u64().unwrap();
    let accepted = tg["n_accepted"].as_u64().unwrap();
    assert!(drafted > 0 && accepted <= drafted, "{tg}");
    assert!(tg["draft_acceptance"].as_f64().unwrap() >= 0.9, "{tg}");
    let md = ok(&[
        "bench",
        "-m",
        &m,
        "-md",
        &m,
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "--no-tune",
    ]);
    assert!(md.contains("| accepted |") && md.contains(" % of "), "{md}");
    for (args, why) in [
        (&["-d", "16"][..], "-d takes 0 only"),
        (
            &["--spec-type", "ngram-simple"][..],
            "draft model (-md FILE) only",
        ),
    ] {
        let mut all = vec!["bench", "-m", &m, "-p", "0", "-n", "4", "-r", "1"];
        if args[0] == "-d" {
            all.extend(["-md", &m]);
        }
        all.extend_from_slice(args);
        let (code, _, err) = wgllm(&all);
        assert!(code != 0 && err.contains(why), "{all:?}: {err}");
    }
}
