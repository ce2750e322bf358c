//! Each architecture against llama.cpp: small random-weight models (`wgllm synth
//! --trained-scale`, weights scaled like a trained model's, real vocabularies from
//! llama.cpp's tokenizer tests), scored by `wgllm perplexity -c 128` (or the recorded
//! context size) on the reference
//! text. Every running chunk estimate must be within 1 % of llama-perplexity's on the
//! same file (recorded by scripts/record-arch-ppl.sh; the file is rebuilt here and its
//! sha256 checked, so both saw the same bytes). A missing bias, a norm in the wrong
//! place or the wrong rotation moves these estimates by far more than 1 %. Then
//! teacher-forced against refdump on a prompt: the same prompt ids, the last prompt
//! position's top-5 logits within 0.1, and llama.cpp's greedy token wherever its margin
//! is at least 0.5.

mod common;

use sha2::{Digest, Sha256};
use std::path::PathBuf;
use wgllm::gguf::{GgufFile, GgufWriter};
use wgllm::model::synth::{synth, vocab_metadata, SynthArch, SynthShape, WeightScale};
use wgllm::quant;

struct Recorded {
    arch: String,
    ctx: u32,
    vocab: String,
    ty: String,
    sha256: String,
    chunks: Vec<f64>,
}

fn recorded(name: &str) -> Recorded {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/arch-ppl/{name}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .unwrap_or_else(|| panic!("{}: no `{k}` line", path.display()))
            .to_string()
    };
    Recorded {
        arch: field("arch"),
        ctx: field("ctx").parse().unwrap(),
        vocab: field("vocab"),
        ty: field("type"),
        sha256: field("sha256"),
        chunks: field("chunks")
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect(),
    }
}

/// The running estimates `wgllm perplexity` prints: `[1]123.4,[2]...`.
fn chunk_estimates(stdout: &str) -> Vec<f64> {
    stdout
        .split(',')
        .filter_map(|s| s.trim().strip_prefix('[')?.split_once(']'))
        .filter_map(|(_, v)| v.parse().ok())
        .collect()
}

fn check(name: &str) {
    check_with(name, &[], None);
}

/// A change to a model file before it is written (the file as first written, the writer).
type Perturb = dyn Fn(&GgufFile, &mut GgufWriter);

/// The recorded file for case `name`, rebuilt (and checked against llama.cpp's sha256);
/// `perturb` may change it before it is written.
fn synth_file(name: &str, perturb: Option<&Perturb>) -> (Recorded, PathBuf) {
    let r = recorded(name);
    let vocab = GgufFile::open(common::llamacpp_tests_dir().join("vocab").join(&r.vocab)).unwrap();
    let n_vocab = vocab.get_array("tokenizer.ggml.tokens").unwrap().len() as u64;
    let ty = quant::format_by_name(&r.ty).unwrap().ty();
    let arch = SynthArch::by_name(&r.arch).unwrap();
    let shape = SynthShape::preset("tiny").unwrap();
    let w = synth(
        arch,
        shape,
        ty,
        vocab_metadata(&vocab),
        n_vocab,
        WeightScale::FanIn,
        false,
    );
    let tag = if perturb.is_some() { "-perturbed" } else { "" };
    let path = std::env::temp_dir().join(format!(
        "wgllm-arch-{name}{tag}-{}.gguf",
        std::process::id()
    ));
    w.write(&path).unwrap();
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha, r.sha256,
        "{name}: the synthetic model is not the file llama.cpp scored"
    );
    if let Some(change) = perturb {
        let mut w = w;
        change(&GgufFile::open(&path).unwrap(), &mut w);
        w.write(&path).unwrap();
    }
    (r, path)
}

/// `wgllm perplexity` on the case's file with `args` added: the running estimates, and
/// the worst relative distance from llama.cpp's.
fn perplexity_vs_llamacpp(
    name: &str,
    r: &Recorded,
    path: &std::path::Path,
    args: &[&str],
) -> (Vec<f64>, f64) {
    let text = common::shared_dir().join("reference/ppl-text.txt");
    let ctx_arg = r.ctx.to_string();
    let mut all = vec![
        "perplexity",
        "-c",
        &ctx_arg,
        "--no-tune",
        "-m",
        path.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let (code, out, err) = common::wgllm(&all);
    assert_eq!(code, 0, "{name}: {err}");
    let ours = chunk_estimates(&out);
    assert_eq!(
        ours.len(),
        r.chunks.len(),
        "{name}: chunk count differs from llama.cpp's"
    );
    let worst = ours
        .iter()
        .zip(&r.chunks)
        .map(|(a, b)| (a / b - 1.0).abs())
        .fold(0.0, f64::max);
    (ours, worst)
}

/// [`check`] with `args` added to the perplexity run and the teacher-forced decode in
/// batches of `n_batch` (default: the context) tokens.
fn check_with(name: &str, args: &[&str], n_batch: Option<u32>) {
    let (r, path) = synth_file(name, None);

    let (ours, worst) = perplexity_vs_llamacpp(name, &r, &path, args);
    eprintln!(
        "{name}: {} chunks, worst running estimate {:.3} % from llama.cpp",
        ours.len(),
        worst * 100.0
    );
    for (i, (a, b)) in ours.iter().zip(&r.chunks).enumerate() {
        assert!(
            (a / b - 1.0).abs() < 0.01,
            "{name}: chunk {} estimate {a:.4}, llama.cpp {b:.4} ({:+.2} %)",
            i + 1,
            (a / b - 1.0) * 100.0
        );
    }

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch-ppl");
    let ctx = r.ctx;
    let r = common::Reference::load(&dir.join(format!("{name}.refdump.json")));
    let f = GgufFile::open(&path).unwrap();
    let tok = wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let prompt =
        std::fs::read_to_string(common::shared_dir().join("reference/smol-story.txt")).unwrap();
    assert_eq!(
        tok.encode(&prompt, true, true),
        r.prompt,
        "{name}: prompt tokens"
    );
    let gpu = wgllm::gpu::Gpu::new(&Default::default()).unwrap();
    let mut model = wgllm::model::Model::load(gpu, &f, &mut |_, _| {}).unwrap();
    model.hp.fit_context(ctx, 1);
    let model = std::sync::Arc::new(model);
    std::fs::remove_file(&path).ok();
    let (n, _) = common::teacher_forced(&model, &r, ctx, n_batch.unwrap_or(ctx), 0.1);
    assert!(n >= 3, "{name}: only {n} generated steps had a clear top-1");
}

/// Llama with a SentencePiece vocabulary, as Mistral 7B and Llama 2 ship.
#[test]
fn llama_spm_q4_0() {
    check("llama-q4_0");
}

#[test]
fn llama3_rope_factors_q8_0() {
    check("llama3-q8_0");
}

#[test]
fn qwen2_q8_0() {
    check("qwen2-q8_0");
}

#[test]
fn qwen2_q4_k() {
    check("qwen2-q4_k");
}

/// Qwen2-VL's language model on text: M-RoPE with all components at the token's
/// position, which llama.cpp computes section by section and wgllm as NeoX's rotation.
#[test]
fn qwen2vl_q8_0() {
    check("qwen2vl-q8_0");
}

#[test]
fn qwen3_q8_0() {
    check("qwen3-q8_0");
}

#[test]
fn phi3_q8_0() {
    check("phi3-q8_0");
}

#[test]
fn phi3_f16() {
    check("phi3-f16");
}

/// Long-context RoPE within the original context of 256: the short factors.
#[test]
fn phi3_short_rope_q8_0() {
    check("phi3-long-q8_0");
}

/// The same file at -c 512, beyond its original context: the long factors.
#[test]
fn phi3_long_rope_q8_0() {
    check("phi3-long-q8_0-c512");
}

/// YaRN RoPE scaling (x4 over an original context of 256) at -c 512, past the original
/// context: the interpolated and extrapolated angles blended per pair, and the magnitude
/// correction.
#[test]
fn qwen2_yarn_rope_q8_0() {
    check("qwen2-yarn-q8_0-c512");
}

/// Qwen3-MoE: 16 experts, 4 chosen per token by softmax and renormalised, each half the
/// feed-forward width; then through GPU-shaped kernels, whose prompts group the (token,
/// expert) pairs by expert on the GPU before the expert products (one after the other:
/// both rebuild the same temporary file).
#[test]
fn qwen3moe_q8_0() {
    check("qwen3moe-q8_0");
    check_with("qwen3moe-q8_0", &["--kernels", "gpu"], None);
}

/// Qwen2-MoE: 16 experts, 4 chosen per token with their softmax probabilities as they
/// are (not renormalised), beside a shared expert every token takes, gated per token by a
/// sigmoid; Q/K/V biases. Then through GPU-shaped kernels (grouped expert products).
#[test]
fn qwen2moe_q8_0() {
    check("qwen2moe-q8_0");
    check_with("qwen2moe-q8_0", &["--kernels", "gpu"], None);
}

/// Qwen3-MoE's experts in MXFP4 (gpt-oss's expert format; here every matrix is).
#[test]
fn qwen3moe_mxfp4() {
    check("qwen3moe-mxfp4");
}

/// Gemma 2: a window of 32 on the even layers (so at -c 128 the sliding layers matter),
/// attention scores capped at 2 and logits at 15 (tight enough that random weights
/// meet both caps), sandwich norms, no Q/K norms. Then with flash attention on
/// GPU-shaped kernels, whose kernels cap the scores themselves.
#[test]
fn gemma2_q8_0() {
    check("gemma2-q8_0");
    check_with("gemma2-q8_0", &["--kernels", "gpu", "-fa", "on"], None);
}

/// gpt-oss in MXFP4 (its experts' format): Q/K/V/O biases, a sink logit per head, a
/// window of 32 on even layers (so at -c 128 both the window and the sinks matter: without
/// either the estimates move by more than 2 %), YaRN, 16 experts with biases, 4 chosen by
/// their logits and weighted by those logits' softmax, the clamped SwiGLU. Then through
/// GPU-shaped kernels with flash attention (the sinks in the flash kernels' store and the
/// chunks' join).
/// Last, llama.cpp's context-shift loop on the same file (tests/data/reference/README.md):
/// the same cache operations through the full and the rolling store, and the same top-1
/// wherever llama.cpp's margin is at least 0.5, teacher-forced across four shifts.
#[test]
fn gpt_oss_mxfp4() {
    check("gpt-oss-mxfp4");
    check_with("gpt-oss-mxfp4", &["--kernels", "gpu", "-fa", "on"], None);
    let (_, path) = synth_file("gpt-oss-mxfp4", None);
    let f = GgufFile::open(&path).unwrap();
    let gpu = wgllm::gpu::Gpu::new(&Default::default()).unwrap();
    let model = wgllm::model::Model::load(gpu, &f, &mut |_, _| {}).unwrap();
    let tok = wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    std::fs::remove_file(&path).ok();
    let rec = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reference/gpt-oss-story.ctxshift.json");
    let model = (std::sync::Arc::new(model), tok);
    let checked = common::replay::replay_recording(&model, &rec, Default::default(), |_| 18);
    eprintln!("gpt-oss context shift: {checked} steps checked");
}

/// Mixtral's layout (llama with 8 experts, 2 per token) in Q4_K.
#[test]
fn mixtral_q4_k() {
    check("mixtral-q4_k");
}

/// Mamba: the perplexity run in ubatches of 48 and the teacher-forced decode in batches
/// of 16, so that each sequence's conv and SSM states are carried between graphs.
#[test]
fn mamba_q8_0() {
    check_with("mamba-q8_0", &["-ub", "48"], Some(16));
}

#[test]
fn mamba2_q8_0() {
    check_with("mamba2-q8_0", &["-ub", "48"], Some(16));
}

/// The comparisons above can fail: with every layer's A halved (the state decays half as fast) in
/// the file, the perplexity moves by more than 1 % from llama.cpp's or the teacher-forced
/// logits by more than their tolerance.
#[test]
fn a_perturbed_state_update_fails_the_comparison() {
    for name in ["mamba-q8_0", "mamba2-q8_0"] {
        let perturb = |f: &GgufFile, w: &mut GgufWriter| {
            for t in f.tensors.iter().filter(|t| t.name.ends_with(".ssm_a")) {
                let a: Vec<f32> = bytemuck::pod_collect_to_vec(f.tensor_data(t));
                let a: Vec<f32> = a.iter().map(|v| v * 0.5).collect();
                w.remove_tensor(&t.name);
                w.tensor(&t.name, &t.dims, t.ty, bytemuck::cast_slice(&a).to_vec());
            }
        };
        let (r, path) = synth_file(name, Some(&perturb));
        let (_, worst) = perplexity_vs_llamacpp(name, &r, &path, &["-ub", "48"]);
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch-ppl");
        let reference = common::Reference::load(&dir.join(format!("{name}.refdump.json")));
        let f = GgufFile::open(&path).unwrap();
        let gpu = wgllm::gpu::Gpu::new(&Default::default()).unwrap();
        let model =
            std::sync::Arc::new(wgllm::model::Model::load(gpu, &f, &mut |_, _| {}).unwrap());
        std::fs::remove_file(&path).ok();
        let forced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            common::teacher_forced(&model, &reference, r.ctx, 16, 0.1);
        }));
        eprintln!(
            "{name} with A halved: worst running estimate {:.2} % from llama.cpp, teacher-forced check {}",
            worst * 100.0,
            if forced.is_ok() { "passed" } else { "failed" }
        );
        assert!(
            worst > 0.01 || forced.is_err(),
            "{name}: a perturbed state update went unnoticed"
        );
    }
}

/// The comparison sees the routing: the Qwen3-MoE file with each token's experts one
/// fewer (3 of 16 instead of 4) must fail it.
#[test]
fn a_perturbed_router_fails_the_comparison() {
    let name = "qwen3moe-q8_0";
    let perturb = |_: &GgufFile, w: &mut GgufWriter| {
        w.set_meta("qwen3moe.expert_used_count", wgllm::gguf::Value::U32(3));
    };
    let (r, path) = synth_file(name, Some(&perturb));
    let (_, worst) = perplexity_vs_llamacpp(name, &r, &path, &[]);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch-ppl");
    let reference = common::Reference::load(&dir.join(format!("{name}.refdump.json")));
    let f = GgufFile::open(&path).unwrap();
    let gpu = wgllm::gpu::Gpu::new(&Default::default()).unwrap();
    let model = std::sync::Arc::new(wgllm::model::Model::load(gpu, &f, &mut |_, _| {}).unwrap());
    std::fs::remove_file(&path).ok();
    let forced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        common::teacher_forced(&model, &reference, r.ctx, 16, 0.1);
    }));
    eprintln!(
        "{name} with 3 experts per token: worst running estimate {:.2} % from llama.cpp, teacher-forced check {}",
        worst * 100.0,
        if forced.is_ok() { "passed" } else { "failed" }
    );
    assert!(
        worst > 0.01 || forced.is_err(),
        "{name}: a perturbed router went unnoticed"
    );
}

/// LFM2's hybrid: convolution layers' states carried between ubatches of 48 (and
/// decode batches of 16) beside the attention layers' K/V cache.
#[test]
fn lfm2_q8_0() {
    check_with("lfm2-q8_0", &["-ub", "48"], Some(16));
}
