//! LoRA adapters: applied at run time beside the base weights, they must compute what a
//! model with the corrections merged into its weights computes (every adapted tensor:
//! stacked Q/K/V, interleaved gate/up, the output head, the token embedding), at the
//! scale llama.cpp applies (user scale · alpha / rank); and on SmolLM2 with a random
//! adapter, `wgllm perplexity --lora` must give llama-perplexity's estimates.

mod common;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use wgllm::context::{Batch, Context, ContextParams};
use wgllm::engine::{Engine, EngineOptions, LoraSpec};
use wgllm::gguf::{GgmlType, GgufFile};
use wgllm::model::synth::{synth, SynthArch, WeightScale};
use wgllm::model::synth_lora::{synth_lora, LoraSynth};

fn f32s(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.ty, GgmlType::F32, "{name}");
    bytemuck::cast_slice(f.tensor_data(t)).to_vec()
}

/// `base` with each of the adapter's corrections added into its weights at `scale`
/// (all f32): W + s B A, or for the embedding E[v] + s B A[v].
fn merged(base: &Path, adapter: &Path, scale: f32, out: &Path) {
    let (bf, af) = (
        GgufFile::open(base).unwrap(),
        GgufFile::open(adapter).unwrap(),
    );
    let alpha = af.get("adapter.lora.alpha").unwrap().as_f64().unwrap() as f32;
    let mut w = wgllm::gguf::GgufWriter::new();
    for (k, v) in &bf.metadata {
        w.meta(k, v.clone());
    }
    for t in &bf.tensors {
        let mut data = bytemuck::cast_slice::<u8, f32>(bf.tensor_data(t)).to_vec();
        let a_name = format!("{}.lora_a", t.name);
        if let Some(at) = af.tensor(&a_name) {
            let (a, b) = (f32s(&af, &a_name), f32s(&af, &format!("{}.lora_b", t.name)));
            let bt = af.tensor(&format!("{}.lora_b", t.name)).unwrap();
            let r = bt.dims[0] as usize;
            let s = scale * alpha / r as f32;
            let (n_in, n_out) = (t.dims[0] as usize, t.dims[1] as usize);
            let embedding = t.name == "token_embd.weight";
            assert_eq!(at.dims[if embedding { 0 } else { 1 }] as usize, r);
            for o in 0..n_out {
                for i in 0..n_in {
                    let d: f32 = (0..r)
                        .map(|k| match embedding {
                            // Row o (a token) of E gains B A[o]: B [r, n_embd], A [r, n_vocab].
                            true => b[i * r + k] * a[o * r + k],
                            false => b[o * r + k] * a[k * n_in + i],
                        })
                        .sum();
                    data[o * n_in + i] += s * d;
                }
            }
        }
        w.tensor(&t.name, &t.dims, t.ty, bytemuck::cast_slice(&data).to_vec());
    }
    w.write(out).unwrap();
}

fn engine(path: &Path, lora: Vec<LoraSpec>) -> Engine {
    let opts = EngineOptions {
        n_ctx: 64,
        n_batch: 16,
        n_ubatch: 16,
        lora,
        gpu: wgllm::gpu::GpuOptions {
            backend: wgllm::gpu::Backend::Vulkan,
            ..Default::default()
        },
        tune: wgllm::tune::TuneOptions {
            mode: wgllm::tune::TuneMode::Off,
            cache_dir: None,
        },
        ..Default::default()
    };
    Engine::load(path, &opts, &mut |_: u64, _: u64| {}).unwrap()
}

/// Every position's logits for `tokens`, in ubatches of 16.
fn logits(e: &Engine, tokens: &[u32]) -> Vec<f32> {
    let model = e.model.clone();
    let mut ctx = Context::new(model, ContextParams::new(64, 16, 16)).unwrap();
    ctx.set_lora(e.lora_scales());
    let mut out = Vec::new();
    for (c, chunk) in tokens.chunks(16).enumerate() {
        out.extend(
            ctx.decode(&Batch::simple(chunk, (c * 16) as i32, true))
                .unwrap(),
        );
    }
    out
}

/// A tiny f32 llama and a random adapter of type `ty` for it (its embedding included).
fn tiny_files(dir: &Path, ty: GgmlType) -> (PathBuf, PathBuf) {
    tiny_arch_files(dir, "llama", ty, true)
}

fn tiny_arch_files(dir: &Path, arch: &str, ty: GgmlType, embedding: bool) -> (PathBuf, PathBuf) {
    let base = dir.join(format!("base-{arch}.gguf"));
    synth(
        SynthArch::by_name(arch).unwrap(),
        common::TINY,
        GgmlType::F32,
        common::tiny_vocab(),
        256,
        WeightScale::FanIn,
        false,
    )
    .write(&base)
    .unwrap();
    let p = LoraSynth {
        rank: if ty == GgmlType::F32 { 8 } else { 32 },
        alpha: 16.0,
        ty,
        strength: 0.5,
        seed: 7,
        embedding,
    };
    let adapter = dir.join(format!("adapter-{arch}-{ty}.gguf"));
    synth_lora(&GgufFile::open(&base).unwrap(), &p)
        .unwrap()
        .write(&adapter)
        .unwrap();
    (base, adapter)
}

/// The adapter applied at run time equals its corrections merged into the weights, at
/// scale 1 and 0.5 (a rank of 8, padded to the kernels' blocks of 32); at scale 0 it is
/// the base model. A correction at the wrong rows (Q's at K's, gate's at up's) or the
/// wrong scale moves the logits by far more than the tolerance: the difference between
/// the base and the merged model is shown beside it. Llama (every kind of pair, the
/// embedding and an output head of its own), Gemma 3 (its own graph; a tied head) and
/// Qwen2 (Q/K/V biases after the stacked product).
#[test]
fn adapter_equals_merged_weights() {
    let dir = common::scratch_dir("lora-merged");
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 256).collect();
    for (name, embedding) in [("llama", true), ("gemma3", false), ("qwen2", false)] {
        let (base, adapter) = tiny_arch_files(&dir, name, GgmlType::F32, embedding);
        let n_pairs = GgufFile::open(&adapter).unwrap().tensors.len() / 2;
        let plain = logits(&engine(&base, vec![]), &tokens);
        for scale in [1.0f32, 0.5] {
            let m = dir.join(format!("merged-{name}-{scale}.gguf"));
            merged(&base, &adapter, scale, &m);
            let want = logits(&engine(&m, vec![]), &tokens);
            let spec = LoraSpec {
                path: adapter.clone(),
                scale,
            };
            let e = engine(&base, vec![spec]);
            assert_eq!(e.lora_adapters().len(), 1);
            assert_eq!(e.lora_adapters()[0].n_pairs(), n_pairs, "{name}");
            let got = logits(&e, &tokens);
            let err = common::nmse(&got, &want);
            let apart = common::nmse(&plain, &want);
            assert!(
                err < 1e-9 && apart > 1e-2,
                "{name} scale {scale}: nmse {err:e} to the merged model (base to merged: {apart:e})"
            );
        }
        let off = engine(
            &base,
            vec![LoraSpec {
                path: adapter.clone(),
                scale: 0.0,
            }],
        );
        assert_eq!(
            logits(&off, &tokens),
            plain,
            "{name}: scale 0 is the base model"
        );
    }
    // Llama's adapter has every projection of both layers, the head and the embedding.
    let (_, adapter) = tiny_files(&dir, GgmlType::F32);
    assert_eq!(
        GgufFile::open(&adapter).unwrap().tensors.len(),
        2 * (2 * 7 + 2)
    );
}

/// An f16 adapter (convert_lora_to_gguf.py's default type) is read as its f16 values.
#[test]
fn f16_adapter_equals_merged_weights() {
    let dir = common::scratch_dir("lora-f16");
    let (base, adapter) = tiny_files(&dir, GgmlType::F16);
    // The merge reads f32 halves: write the f16 adapter's values out as f32.
    let af = GgufFile::open(&adapter).unwrap();
    let mut w = wgllm::gguf::GgufWriter::new();
    for (k, v) in &af.metadata {
        w.meta(k, v.clone());
    }
    for t in &af.tensors {
        let n = t.n_elements() as usize;
        let mut v = vec![0f32; n];
        wgllm::quant::dequantize_row(t.ty, af.tensor_data(t), &mut v);
        w.tensor(
            &t.name,
            &t.dims,
            GgmlType::F32,
            bytemuck::cast_slice(&v).to_vec(),
        );
    }
    let as_f32 = dir.join("adapter-as-f32.gguf");
    w.write(&as_f32).unwrap();
    let m = dir.join("merged.gguf");
    merged(&base, &as_f32, 1.0, &m);
    let tokens: Vec<u32> = (0..24).map(|i| (i * 53 + 5) % 256).collect();
    let want = logits(&engine(&m, vec![]), &tokens);
    let got = logits(
        &engine(
            &base,
            vec![LoraSpec {
                path: adapter,
                scale: 1.0,
            }],
        ),
        &tokens,
    );
    let err = common::nmse(&got, &want);
    assert!(err < 1e-9, "nmse {err:e}");
}

/// What llama.cpp refuses is refused here with a sentence: a model file given as an
/// adapter, an adapter of another architecture, a pair whose shapes do not fit.
#[test]
fn wrong_adapters_are_refused() {
    let dir = common::scratch_dir("lora-refused");
    let (base, adapter) = tiny_files(&dir, GgmlType::F32);
    let opts = |p: &Path| EngineOptions {
        n_ctx: 64,
        lora: vec![LoraSpec {
            path: p.to_path_buf(),
            scale: 1.0,
        }],
        tune: wgllm::tune::TuneOptions {
            mode: wgllm::tune::TuneMode::Off,
            cache_dir: None,
        },
        ..Default::default()
    };
    let err = |p: &Path| match Engine::load(&base, &opts(p), &mut |_: u64, _: u64| {}) {
        Ok(_) => panic!("{} was accepted", p.display()),
        Err(e) => e.to_string(),
    };
    let refused = |p: &Path, why: &str| {
        let e = err(p);
        assert!(e.contains(why), "{}: {e}", p.display());
    };
    refused(&base, "not a LoRA adapter");
    let af = GgufFile::open(&adapter).unwrap();
    let rewrite = |name: &str, change: &dyn Fn(&mut wgllm::gguf::GgufWriter)| {
        let mut w = wgllm::gguf::GgufWriter::new();
        for (k, v) in &af.metadata {
            w.meta(k, v.clone());
        }
        for t in &af.tensors {
            w.tensor(&t.name, &t.dims, t.ty, af.tensor_data(t).to_vec());
        }
        change(&mut w);
        let p = dir.join(name);
        w.write(&p).unwrap();
        p
    };
    let qwen2 = wgllm::gguf::Value::String("qwen2".into());
    let other = rewrite("other-arch.gguf", &|w| {
        w.set_meta("general.architecture", qwen2.clone());
    });
    refused(&other, "architecture `qwen2`");
    let half = rewrite("half.gguf", &|w| {
        w.remove_tensor("blk.1.ffn_up.weight.lora_b");
    });
    refused(&half, "lacks one of its halves");
    let wide = rewrite("wide.gguf", &|w| {
        let name = "blk.0.attn_q.weight.lora_a";
        w.remove_tensor(name);
        w.tensor(name, &[32, 8], GgmlType::F32, vec![0; 32 * 8 * 4]);
    });
    refused(&wide, "wrong base model");
    refused(&dir.join("none.gguf"), "none.gguf");
    // Gemma 3's head is its embedding: an embedding pair cannot apply to it, so synth
    // does not write one and the loader refuses one (here the llama adapter's, moved over).
    let (gemma, _) = tiny_arch_files(&dir, "gemma3", GgmlType::F32, false);
    let gf = GgufFile::open(&gemma).unwrap();
    let p = LoraSynth {
        rank: 8,
        alpha: 16.0,
        ty: GgmlType::F32,
        strength: 0.5,
        seed: 1,
        embedding: true,
    };
    assert!(synth_lora(&gf, &p).is_err_and(|e| e.contains("tied")));
    let gemma3 = wgllm::gguf::Value::String("gemma3".into());
    let moved = rewrite("to-gemma.gguf", &|w| {
        w.set_meta("general.architecture", gemma3.clone());
        w.remove_tensor("output.weight.lora_a");
        w.remove_tensor("output.weight.lora_b");
    });
    let e = match Engine::load(&gemma, &opts(&moved), &mut |_: u64, _: u64| {}) {
        Ok(_) => panic!("an embedding pair on a tied head was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("tied embeddings"), "{e}");
}

/// Sessions with different adapter scales decode side by side (the engine batches each
/// setting on its own) and each gets what it would get alone.
#[test]
fn sessions_with_different_scales_match_alone() {
    use wgllm::engine::SessionParams;
    let dir = common::scratch_dir("lora-sessions");
    let (base, adapter) = tiny_files(&dir, GgmlType::F32);
    let spec = |scale| LoraSpec {
        path: adapter.clone(),
        scale,
    };
    let prompt: Vec<u32> = (0..12).map(|i| (i * 29 + 3) % 256).collect();
    let params = |scale: Option<f32>| SessionParams {
        sampling: wgllm::sample::SamplerParams::greedy(),
        n_predict: 8,
        lora: scale.map(|s| vec![s]),
        ..Default::default()
    };
    let run_alone = |scale: f32| -> Vec<u32> {
        let mut e = engine(&base, vec![spec(scale)]);
        let id = e.open_session(params(None)).unwrap();
        e.prompt_tokens(id, &prompt).unwrap();
        while e.is_busy() {
            e.step().unwrap();
        }
        e.session(id).unwrap().generated().to_vec()
    };
    let alone: Vec<Vec<u32>> = [0.0, 0.5, 1.0].iter().map(|&s| run_alone(s)).collect();
    assert_ne!(alone[0], alone[2], "the adapter changes the greedy tokens");
    let opts = EngineOptions {
        n_ctx: 192,
        n_batch: 16,
        n_ubatch: 16,
        n_seq_max: 3,
        lora: vec![spec(1.0)],
        tune: wgllm::tune::TuneOptions {
            mode: wgllm::tune::TuneMode::Off,
            cache_dir: None,
        },
        ..Default::default()
    };
    let mut e = Engine::load(&base, &opts, &mut |_: u64, _: u64| {}).unwrap();
    let ids: Vec<_> = [Some(0.0), Some(0.5), None]
        .iter()
        .map(|&s| e.open_session(params(s)).unwrap())
        .collect();
    for &id in &ids {
        e.prompt_tokens(id, &prompt).unwrap();
    }
    while e.is_busy() {
        e.step().unwrap();
    }
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(
            e.session(id).unwrap().generated(),
            &alone[i][..],
            "session {i}"
        );
    }
    // A scale per adapter: more scales than adapters loaded, or one that is not a
    // number, is refused.
    assert!(e.set_lora_scales(&[1.0, 2.0]).is_err());
    assert!(e.set_lora_scales(&[f32::NAN]).is_err());
    e.close_session(ids[0]).unwrap();
    let mut too_many = params(None);
    too_many.lora = Some(vec![1.0, 1.0]);
    assert!(e.open_session(too_many).is_err());
}

/// A slot file names the adapters its cells were computed with: restoring it where
/// other adapters are loaded (none, another file, or it saved without one and one is
/// loaded now) is refused with both named, and the slot is left as it was; where the
/// same adapter is loaded it restores, at the scale it was saved with.
#[test]
fn slot_files_are_refused_under_other_adapters() {
    use wgllm::engine::SessionParams;
    let dir = common::scratch_dir("lora-slot-files");
    let (base, adapter) = tiny_files(&dir, GgmlType::F32);
    let other = dir.join("other-adapter.gguf");
    let p = LoraSynth {
        rank: 8,
        alpha: 16.0,
        ty: GgmlType::F32,
        strength: 0.5,
        seed: 8,
        embedding: true,
    };
    synth_lora(&GgufFile::open(&base).unwrap(), &p)
        .unwrap()
        .write(&other)
        .unwrap();
    let spec = |path: &Path, scale| LoraSpec {
        path: path.to_path_buf(),
        scale,
    };
    let prompt: Vec<u32> = (0..12).map(|i| (i * 29 + 3) % 256).collect();
    let params = SessionParams {
        sampling: wgllm::sample::SamplerParams::greedy(),
        n_predict: 4,
        ..Default::default()
    };
    let saved_by = |lora: Vec<LoraSpec>, name: &str| -> PathBuf {
        let mut e = engine(&base, lora);
        let id = e.open_session(params.clone()).unwrap();
        e.prompt_tokens(id, &prompt).unwrap();
        while e.is_busy() {
            e.step().unwrap();
        }
        let file = dir.join(name);
        e.save_session(id, &file).unwrap();
        file
    };
    let with_adapter = saved_by(vec![spec(&adapter, 0.5)], "with-adapter.bin");
    let without = saved_by(vec![], "without.bin");
    let refused = |lora: Vec<LoraSpec>, file: &Path| -> String {
        let mut e = engine(&base, lora);
        let id = e.open_session(params.clone()).unwrap();
        let err = e.restore_session(id, file).unwrap_err().to_string();
        assert!(e.session(id).unwrap().history().is_empty());
        err
    };
    for (lora, file, now) in [
        (vec![], &with_adapter, "no LoRA adapter"),
        (vec![spec(&other, 0.5)], &with_adapter, "1 LoRA adapter"),
        (vec![spec(&adapter, 0.5)], &without, "1 LoRA adapter"),
    ] {
        let e = refused(lora, file);
        assert!(
            e.contains("the cache was computed with") && e.contains(now) && e.contains("--lora"),
            "{e}"
        );
    }
    let e = refused(vec![spec(&other, 0.5)], &with_adapter);
    assert!(
        e.contains("at scale 0.5"),
        "the saved setting is named: {e}"
    );
    // The same adapter at another scale: restored (the cells keep their own scale).
    let mut e = engine(&base, vec![spec(&adapter, 1.0)]);
    let id = e.open_session(params.clone()).unwrap();
    assert!(e.restore_session(id, &with_adapter).unwrap() >= prompt.len());
}

/// SmolLM2 Q4_1 with a random rank-16 f16 adapter (written by `wgllm synth --lora-for`,
/// its sha256 checked against the file llama.cpp scored): `wgllm perplexity --lora` within
/// 1 % of llama-perplexity's (recorded by scripts/record-lora-ppl.sh), and so is the ratio
/// the adapter makes of the base model's perplexity; without the adapter the estimate is
/// far off. (The final estimate is compared: the first chunks of a Q4_1 model differ by up
/// to 3 % between llama.cpp's CPU build, which multiplies with 8-bit activations, and any
/// float kernel, adapter or not.)
#[test]
fn smollm2_lora_perplexity_matches_llama_cpp() {
    let rec = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/lora-ppl/smollm2.txt"),
    )
    .unwrap();
    let field = |k: &str| {
        rec.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .unwrap_or_else(|| panic!("no `{k}` line"))
            .to_string()
    };
    let last = |k: &str| -> f64 { field(k).split_whitespace().last().unwrap().parse().unwrap() };
    let (want, want_base) = (last("chunks"), last("base_chunks"));
    let dir = common::scratch_dir("lora-smollm2");
    let adapter = dir.join("adapter.gguf");
    let model = common::smollm2();
    let synth_args: Vec<String> = field("synth")
        .split_whitespace()
        .map(String::from)
        .collect();
    let mut args = vec![
        "synth",
        "--lora-for",
        model.as_str(),
        "-o",
        adapter.to_str().unwrap(),
    ];
    args.extend(synth_args.iter().map(String::as_str));
    let (code, _, err) = common::wgllm(&args);
    assert_eq!(code, 0, "{err}");
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&adapter).unwrap()));
    assert_eq!(
        sha,
        field("sha256"),
        "the adapter is not the file llama.cpp scored"
    );
    let text = common::shared_dir().join("reference/ppl-text.txt");
    let ctx = field("ctx");
    let chunks = field("n_chunks");
    let run = |extra: &[&str]| -> f64 {
        let mut all = vec![
            "perplexity",
            "-m",
            model.as_str(),
            "-c",
            &ctx,
            "--chunks",
            &chunks,
            "-f",
            text.to_str().unwrap(),
        ];
        all.extend_from_slice(extra);
        let (code, out, err) = common::wgllm(&all);
        assert_eq!(code, 0, "{err}");
        let est: Vec<f64> = (out.split(','))
            .filter_map(|s| s.trim().strip_prefix('[')?.split_once(']'))
            .filter_map(|(_, v)| v.parse().ok())
            .collect();
        assert_eq!(est.len().to_string(), chunks, "{out}");
        *est.last().unwrap()
    };
    let with = run(&["--lora", adapter.to_str().unwrap()]);
    let without = run(&[]);
    let off = |a: f64, b: f64| (a / b - 1.0).abs();
    assert!(
        off(with, want) < 0.01 && off(with / without, want / want_base) < 0.01,
        "with the adapter {with} (llama.cpp {want}), without {without} (llama.cpp {want_base})"
    );
    assert!(
        off(without, want) > 0.05,
        "the adapter changes too little to tell: {without} against {want}"
    );
}
