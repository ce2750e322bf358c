//! The recurrent memory through a real context on tiny random Mamba and Mamba-2 models:
//! random sequence operations on four sequences against recomputing each sequence from
//! scratch, what llama.cpp refuses (cutting a state back from its end), copy on write of
//! shared states, and the engine's prompt reuse and endless generation on top.
mod common;

use common::{nmse, tiny_ssm_parts, Rng};
use std::sync::Arc;
use wgllm::context::{Batch, Context, ContextParams};
use wgllm::gpu::Gpu;
use wgllm::kv::KvError;
use wgllm::model::synth::SynthArch;
use wgllm::model::Model;

fn model(arch: SynthArch) -> Arc<Model> {
    tiny_ssm_parts(Gpu::new(&Default::default()).unwrap(), arch).0
}

fn context(model: &Arc<Model>, n_seq: u32) -> Context {
    // -c bounds the hybrid's attention cells only.
    let mut p = ContextParams::new(2048, 1024, 16);
    p.n_seq_max = n_seq;
    Context::new(model.clone(), p).unwrap()
}

fn seq_batch(tokens: &[u32], pos0: i32, seq: u32) -> Batch {
    let mut b = Batch::simple(tokens, pos0, false);
    b.seq = vec![1u64 << seq; tokens.len()];
    b
}

/// The probe's logits after sequence `s`, through a scratch sequence that shares s's
/// state (a recurrent state cannot be cut back, so the probe is not decoded on s itself):
/// the scratch sequence moves on into a cell of its own, s keeps its state.
fn probe_logits(ctx: &mut Context, s: u32, scratch: u32, probe: u32) -> Vec<f32> {
    let pos = ctx.cells().seq_pos_max(s) + 1;
    ctx.seq_cp(s, scratch, -1, -1).unwrap();
    let logits = ctx.decode(&seq_batch(&[probe], pos, scratch)).unwrap();
    ctx.seq_rm(Some(scratch), -1, -1).unwrap();
    logits
}

/// The probe after `tokens` decoded from scratch, ending at position `last`.
fn recomputed_logits(fresh: &mut Context, tokens: &[u32], last: i32, probe: u32) -> Vec<f32> {
    fresh.clear();
    let mut all = tokens.to_vec();
    all.push(probe);
    let first = last + 1 - tokens.len() as i32;
    fresh.decode(&seq_batch(&all, first, 0)).unwrap()
}

/// Random decodes (sometimes two sequences in one batch: the equal split), removals
/// (whole sequences, or refused cuts from the end), copies, seq_keep and position moves
/// on four sequences; after every step each sequence's next-token logits equal those of
/// recomputing its tokens alone.
fn random_ops_match_recomputation(arch: SynthArch) {
    let hybrid = arch == SynthArch::Lfm2;
    let model = model(arch);
    let mut ctx = context(&model, 5);
    let mut fresh = context(&model, 1);
    let mut rng = Rng(if arch == SynthArch::Mamba {
        0x5eed
    } else {
        0x5eee
    });
    // Per sequence: its tokens and its last position (-1: none).
    let mut seqs: Vec<(Vec<u32>, i32)> = vec![(Vec::new(), -1); 4];
    let (mut checks, mut refused) = (0, 0);
    for step in 0..60 {
        let s = rng.below(4) as usize;
        let what = rng.below(10);
        match what {
            0..=4 => {
                let n = 1 + rng.below(20) as usize;
                let toks: Vec<u32> = (0..n).map(|_| rng.below(256)).collect();
                let mut b = seq_batch(&toks, seqs[s].1 + 1, s as u32);
                let t = (s + 1) % 4;
                if rng.below(2) == 0 {
                    let tok = rng.below(256);
                    b.tokens.push(tok);
                    b.pos.push(seqs[t].1 + 1);
                    b.seq.push(1 << t);
                    b.logits.push(true);
                    seqs[t].0.push(tok);
                    seqs[t].1 += 1;
                }
                ctx.decode(&b).unwrap();
                seqs[s].0.extend(&toks);
                seqs[s].1 += n as i32;
            }
            5 => {
                // A cut inside the state's range: refused, nothing changes; from 0: all.
                let last = seqs[s].1;
                if last > 0 {
                    let p = 1 + rng.below(last as u32) as i32;
                    let e = ctx.seq_rm(Some(s as u32), p, -1).unwrap_err();
                    assert!(
                        matches!(e.kv(), Some(KvError::BadStore(m)) if m.contains("recurrent state")),
                        "step {step}: {e}"
                    );
                    refused += 1;
                }
                if rng.below(2) == 0 {
                    ctx.seq_rm(Some(s as u32), 0, -1).unwrap();
                    seqs[s] = (Vec::new(), -1);
                }
            }
            6 | 7 => {
                // A copy (whatever the range: a state is whole) over another sequence.
                let d = (s + 1 + rng.below(3) as usize) % 4;
                // A K/V cache's copy adds to what the destination holds, so the hybrid's
                // destination is emptied first (as llama.cpp's users do).
                if hybrid {
                    ctx.seq_rm(Some(d as u32), -1, -1).unwrap();
                }
                ctx.seq_cp(s as u32, d as u32, -1, -1).unwrap();
                seqs[d] = seqs[s].clone();
            }
            8 => {
                // Positions move (a context shift's seq_add): the state goes on, and a
                // sequence sharing it moves with it, as in llama.cpp.
                if seqs[s].1 < 0 {
                    continue;
                }
                // (The hybrid's attention moves forward only: its cells keep positions
                // from 0, as a recomputation from scratch does.)
                let back = if hybrid { 0 } else { seqs[s].1.min(4) };
                let delta = rng.below(9) as i32 - back;
                ctx.seq_add(s as u32, -1, -1, delta).unwrap();
                let (toks, last) = seqs[s].clone();
                for q in seqs.iter_mut() {
                    if q.1 == last && q.0 == toks {
                        q.1 += delta;
                    }
                }
            }
            _ => {
                if rng.below(3) != 0 {
                    continue;
                }
                ctx.seq_keep(s as u32).unwrap();
                for (q, v) in seqs.iter_mut().enumerate() {
                    if q != s {
                        *v = (Vec::new(), -1);
                    }
                }
            }
        }
        for (q, (toks, last)) in seqs.iter().enumerate() {
            assert_eq!(
                ctx.cells().seq_pos_max(q as u32),
                *last,
                "step {step} (op {what}): seq {q} position"
            );
            if toks.is_empty() {
                continue;
            }
            let probe = rng.below(256);
            let got = probe_logits(&mut ctx, q as u32, 4, probe);
            let want = recomputed_logits(&mut fresh, toks, *last, probe);
            let e = nmse(&got, &want);
            // The hybrid's f16 K/V cells round what attention reads.
            let tol = if hybrid { 1e-5 } else { 1e-8 };
            assert!(e < tol, "step {step} (op {what}): seq {q} nmse {e}");
            checks += 1;
        }
        // One state per sequence at most, shared ones once.
        let states = ctx.memory().maps().last().map_or(0, |m| m.used);
        assert!(states <= 4, "step {step}: {states} states");
    }
    assert!(
        checks > 60 && refused > 2,
        "{checks} comparisons, {refused} refusals"
    );
}

#[test]
fn mamba_random_sequence_ops_match_recomputation() {
    random_ops_match_recomputation(SynthArch::Mamba);
}

#[test]
fn mamba2_random_sequence_ops_match_recomputation() {
    random_ops_match_recomputation(SynthArch::Mamba2);
}

/// The hybrid memory: one set of operations on the K/V cells and the states (a refused
/// cut leaves both as they were; a shift moves the keys and the state's position).
#[test]
fn lfm2_random_sequence_ops_match_recomputation() {
    random_ops_match_recomputation(SynthArch::Lfm2);
}

/// A token given to two sequences makes one state for both; the first to move on takes
/// a cell of its own starting from it, and the other is unaffected.
#[test]
fn a_shared_state_is_copied_on_write() {
    let model = model(SynthArch::Mamba);
    let mut ctx = context(&model, 3);
    let mut fresh = context(&model, 1);
    let mut b = seq_batch(&[3, 4, 5], 0, 0);
    b.seq = vec![3; 3];
    ctx.decode(&b).unwrap();
    assert_eq!(ctx.cells().used(), 1);
    ctx.decode(&seq_batch(&[9, 9], 3, 1)).unwrap();
    assert_eq!(ctx.cells().used(), 2);
    // What displays see (the app's map, -dkvc): sequence 1's state was copied from the
    // shared one, and each sequence's latest state is its own cell.
    let map = ctx.memory().maps().pop().unwrap();
    assert!(map.is_recurrent());
    let copied = (map.sources.iter().enumerate()).find(|(i, s)| s.is_some_and(|j| j != *i));
    let (to, from) = copied
        .map(|(i, s)| (i, s.unwrap()))
        .expect("a copied state");
    assert!(map.tails.contains(&(1, to)) && map.tails.contains(&(0, from)));
    assert!(map
        .states_view()
        .contains(&format!("copied from cell {from}")));
    let a = probe_logits(&mut ctx, 0, 2, 7);
    let want = recomputed_logits(&mut fresh, &[3, 4, 5], 2, 7);
    assert!(nmse(&a, &want) < 1e-8);
    // Whole-memory removal of a range is refused; of everything, done.
    assert!(ctx.seq_rm(None, 1, 3).is_err());
    ctx.seq_rm(None, -1, -1).unwrap();
    assert_eq!(ctx.cells().used(), 0);
}

/// Saving, loading into a fresh context and going on equals never stopping, for the
/// recurrent memory and the hybrid; one sequence loads into another sequence; a file of
/// the other model is refused.
#[test]
fn state_files_round_trip() {
    let dir = std::env::temp_dir();
    for arch in [SynthArch::Mamba2, SynthArch::Lfm2] {
        let model = model(arch);
        let path = dir.join(format!(
            "wgllm-rs-state-{}-{arch:?}.bin",
            std::process::id()
        ));
        let mut rng = Rng(21);
        let a: Vec<u32> = (0..30).map(|_| rng.below(256)).collect();
        let b: Vec<u32> = (0..5).map(|_| rng.below(256)).collect();
        let mut whole = context(&model, 2);
        whole.decode(&seq_batch(&a, 0, 0)).unwrap();
        whole.decode(&seq_batch(&a[..9], 0, 1)).unwrap();
        whole.state_save(&path, &a, None, &[]).unwrap();
        let want = whole.decode(&seq_batch(&b, 30, 0)).unwrap();

        let mut loaded = context(&model, 2);
        let saved = loaded.state_load(&path, None).unwrap();
        assert_eq!(saved.tokens, a);
        assert_eq!(loaded.cells().seq_pos_max(1), 8);
        let got = loaded.decode(&seq_batch(&b, 30, 0)).unwrap();
        assert_eq!(
            got, want,
            "{arch:?}: loading then going on must equal never stopping"
        );

        // Sequence 1 alone, into sequence 2 of a context holding other states.
        whole.state_save(&path, &a[..9], Some(1), &[]).unwrap();
        let mut other = context(&model, 4);
        other.decode(&seq_batch(&b, 0, 0)).unwrap();
        other.state_load(&path, Some(2)).unwrap();
        assert_eq!(other.cells().seq_pos_max(2), 8);
        let got = probe_logits(&mut other, 2, 3, 5);
        let mut fresh = context(&model, 1);
        let want = recomputed_logits(&mut fresh, &a[..9], 8, 5);
        assert!(nmse(&got, &want) < 1e-5, "{arch:?}: one sequence moved");
        std::fs::remove_file(&path).ok();
    }
    // Mamba's file in a Mamba-2 context: refused by the recurrent part's sizes.
    let m1 = model(SynthArch::Mamba);
    let path = dir.join(format!("wgllm-rs-state-{}-x.bin", std::process::id()));
    let mut c1 = context(&m1, 1);
    c1.decode(&seq_batch(&[1, 2, 3], 0, 0)).unwrap();
    c1.state_save(&path, &[1, 2, 3], None, &[]).unwrap();
    let mut c2 = context(&model(SynthArch::Mamba2), 1);
    let e = c2.state_load(&path, None).unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
    std::fs::remove_file(&path).ok();
}

/// llama.cpp's context-shift loop on the synthetic LFM2 (tests/data/reference/README.md):
/// the attention layers' keys shift, the convolution layers' states go on with their
/// positions moved; the same cache operations and the same top-1 wherever llama.cpp's
/// margin is at least 0.5, teacher-forced across four shifts.
#[test]
fn lfm2_context_shift_matches_llama_cpp() {
    use wgllm::gguf::GgufFile;
    use wgllm::model::synth::{synth, vocab_metadata, SynthShape, WeightScale};
    use wgllm::quant;
    let vocab =
        GgufFile::open(common::llamacpp_tests_dir().join("vocab/ggml-vocab-llama-bpe.gguf"))
            .unwrap();
    let n_vocab = vocab.get_array("tokenizer.ggml.tokens").unwrap().len() as u64;
    let w = synth(
        SynthArch::Lfm2,
        SynthShape::preset("tiny").unwrap(),
        quant::format_by_name("q8_0").unwrap().ty(),
        vocab_metadata(&vocab),
        n_vocab,
        WeightScale::FanIn,
        false,
    );
    let path = std::env::temp_dir().join(format!("wgllm-lfm2-shift-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let model = Model::load(Gpu::new(&Default::default()).unwrap(), &f, &mut |_, _| {}).unwrap();
    let tok = wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    std::fs::remove_file(&path).ok();
    let rec = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reference/lfm2-story.ctxshift.json");
    let checked =
        common::replay::replay_recording(&(Arc::new(model), tok), &rec, Default::default(), |_| 20);
    eprintln!("lfm2 context shift: {checked} steps checked");
}

/// The engine on a recurrent model: a request that continues exactly what the sequence
/// holds reuses all of it; one that shares only an earlier prefix recomputes (a state
/// holds only its end) and gives what a fresh engine gives; prompts and replies go on
/// past `-c`, as a recurrent model has no window to shift.
#[test]
fn the_engine_reuses_a_state_only_at_its_end() {
    use wgllm::engine::SessionParams;
    let (model, tok) = tiny_ssm_parts(Gpu::new(&Default::default()).unwrap(), SynthArch::Mamba);
    let greedy = |n| SessionParams {
        sampling: wgllm::sample::SamplerParams::greedy(),
        n_predict: n,
        ..Default::default()
    };
    let run = |e: &mut wgllm::engine::Engine, prompt: &[u32], n: i32| -> (usize, Vec<u32>) {
        let reused = e.start_request(0, greedy(n), prompt, true).unwrap();
        while e.is_busy() {
            e.step().unwrap();
        }
        (reused, e.session(0).unwrap().generated().to_vec())
    };
    let mut e = common::engine(&model, &tok, 32, 32, 1);
    e.open_session(greedy(4)).unwrap();
    let a: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 256).collect();
    run(&mut e, &a, 4);
    let held = e.session(0).unwrap().history().to_vec();
    // Exactly what the state holds, and more: all of it reused.
    let mut longer = held.clone();
    longer.extend([5, 6]);
    let (reused, got) = run(&mut e, &longer, 4);
    assert_eq!(reused, held.len());
    let mut fresh = common::engine(&model, &tok, 32, 32, 1);
    fresh.open_session(greedy(4)).unwrap();
    let (_, want) = run(&mut fresh, &longer, 4);
    assert_eq!(got, want);
    // Only a prefix of it: recomputed from nothing, the same reply as a fresh engine.
    let mut other = a[..10].to_vec();
    other.extend((0..25).map(|i| (i * 11 + 1) % 256));
    let (reused, got) = run(&mut e, &other, 40);
    assert_eq!(
        reused, 0,
        "a recurrent state cannot be cut back to a prefix"
    );
    let (_, want) = run(&mut fresh, &other, 40);
    assert_eq!(got, want);
    // A 35-token prompt and its reply in a context of 32 cells: no shift needed.
    assert!(!got.is_empty());
    assert!(e.session(0).unwrap().shift().ops.is_empty());
}
