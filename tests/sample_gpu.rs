//! Sampling on the GPU against the CPU sampler: the first pass's selection against
//! `top_k_ref`, and the whole chain (bias, penalties, top-k, top-p, min-p, temperature,
//! the draw) against `Sampler::pick_with_uniform` on the same logits and uniform number,
//! on every test device (CPU- and GPU-shaped, the portable one, GL).

mod common;
#[path = "../src/sample/fixture.rs"]
#[allow(dead_code)]
mod fixture;

use common::{gpus, Rng};
use wgllm::context::Drawn;
use wgllm::gpu::{Gpu, KernelShape};
use wgllm::ops::sample::{sample, segments, top_k_ref, SampleBuffers, MAX_K};
use wgllm::ops::uniforms::SampleRow;
use wgllm::ops::{run_now, View};
use wgllm::sample::{dense_bias, gpu_row, Sampler, SamplerParams, RING_MAX};

/// Logits like a model's: a few large, many small, some exactly tied (a coarse grid).
fn logits(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let x = rng.f32();
            let peak = if rng.below(64) == 0 {
                6.0 * rng.f32().abs()
            } else {
                0.0
            };
            let v = scale * (x + peak);
            if rng.below(8) == 0 {
                (v * 4.0).round() / 4.0
            } else {
                v
            }
        })
        .collect()
}

/// The buffers for `n_slots` slots and rows of `n_vocab`.
struct Bufs {
    logits: View,
    rows: View,
    counts: View,
    bias: View,
    cand: View,
    ring: View,
    result: View,
    probs: View,
}

impl Bufs {
    fn new(gpu: &Gpu, n_vocab: usize, n_rows: usize, n_slots: usize) -> Bufs {
        let s = |label: &str, bytes: usize| View::whole(&gpu.storage(label, bytes as u64).unwrap());
        let (_, n_seg) = segments(n_vocab as u32);
        Bufs {
            logits: s("logits", n_rows * n_vocab * 4),
            rows: s("rows", n_rows * 64),
            counts: s("counts", n_slots * n_vocab * 4),
            bias: s("bias", n_slots * n_vocab * 4),
            cand: s("cand", n_rows * n_seg as usize * MAX_K as usize * 8),
            ring: s("ring", n_slots * (RING_MAX as usize + 2) * 4),
            result: s("result", n_rows * 8),
            probs: s("probs", n_rows * MAX_K as usize * 8),
        }
    }

    /// Runs both passes; returns each row's (token, probability).
    fn draw(&self, gpu: &Gpu, n_vocab: usize, rows: &[SampleRow]) -> Vec<(u32, f32)> {
        self.draw_with_probs(gpu, n_vocab, rows)
            .into_iter()
            .map(|d| (d.token, d.prob))
            .collect()
    }

    /// [`Bufs::draw`], with each row's first `n_probs` final candidates.
    fn draw_with_probs(&self, gpu: &Gpu, n_vocab: usize, rows: &[SampleRow]) -> Vec<Drawn> {
        gpu.write(&self.rows.buf, 0, bytemuck::cast_slice(rows));
        let k = rows.iter().map(|r| r.k).max().unwrap();
        let b = SampleBuffers {
            logits: &self.logits,
            rows: &self.rows,
            counts: &self.counts,
            bias: &self.bias,
            cand: &self.cand,
            ring: &self.ring,
            result: &self.result,
            probs: &self.probs,
        };
        let d = sample(gpu, &b, n_vocab as u32, rows.len() as u32, k, RING_MAX).unwrap();
        run_now(gpu, &d).unwrap();
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(
            &gpu.read_bytes(&self.result.buf, 0, rows.len() as u64 * 8)
                .unwrap(),
        );
        let probs: Vec<u32> = bytemuck::pod_collect_to_vec(
            &gpu.read_bytes(&self.probs.buf, 0, self.probs.buf.size())
                .unwrap(),
        );
        (words.chunks(2).zip(rows).enumerate())
            .map(|(i, (w, r))| {
                let at = i * MAX_K as usize * 2;
                let top = (probs[at..at + r.n_probs as usize * 2].chunks(2))
                    .map(|c| (c[0], f32::from_bits(c[1])))
                    .collect();
                Drawn {
                    token: w[0],
                    prob: f32::from_bits(w[1]),
                    top,
                }
            })
            .collect()
    }

    /// Gives slot `slot` the sampler's penalty history and bias.
    fn sync(&self, gpu: &Gpu, n_vocab: usize, slot: usize, s: &Sampler) {
        let hist: Vec<u32> = s.penalty_history().iter().copied().collect();
        let mut dense = vec![0u32; n_vocab];
        for &t in &hist {
            dense[t as usize] += 1;
        }
        gpu.write(
            &self.counts.buf,
            (slot * n_vocab * 4) as u64,
            bytemuck::cast_slice(&dense),
        );
        let mut ring = vec![0u32, hist.len() as u32];
        ring.extend(hist);
        gpu.write(
            &self.ring.buf,
            (slot * (RING_MAX as usize + 2) * 4) as u64,
            bytemuck::cast_slice(&ring),
        );
        let bias = dense_bias(s.params(), n_vocab);
        gpu.write(
            &self.bias.buf,
            (slot * n_vocab * 4) as u64,
            bytemuck::cast_slice(&bias),
        );
    }
}

/// Each segment's candidates after the first pass equal its reference top-k, in id order
/// (GPU shape) or best first (CPU shape).
#[test]
fn first_pass_keeps_each_segments_top_k() {
    let mut rng = Rng(71);
    for (name, gpu, _serial) in gpus() {
        for &(n_vocab, k) in &[
            (1000usize, 40u32),
            (49152, 1),
            (262144, 256),
            (300, 256),
            (8193, 7),
        ] {
            let b = Bufs::new(gpu, n_vocab, 1, 1);
            let l = logits(&mut rng, n_vocab, 3.0);
            gpu.write(&b.logits.buf, 0, bytemuck::cast_slice(&l));
            let row = SampleRow {
                k,
                temp: 0.0,
                top_p: 1.0,
                ..Default::default()
            };
            b.draw(gpu, n_vocab, &[row]);
            let (seg_len, n_seg) = segments(n_vocab as u32);
            let cand: Vec<u32> = bytemuck::pod_collect_to_vec(
                &gpu.read_bytes(&b.cand.buf, 0, n_seg as u64 * k as u64 * 8)
                    .unwrap(),
            );
            for s in 0..n_seg as usize {
                let lo = s * seg_len as usize;
                let hi = (lo + seg_len as usize).min(n_vocab);
                // Best first (the reference's order) from the CPU shape, which the
                // CPU-shaped chain merges; in id order from a workgroup's radix select.
                let mut want: Vec<u32> = top_k_ref(&l[lo..hi], k as usize)
                    .iter()
                    .map(|c| c.0 + lo as u32)
                    .collect();
                if gpu.kernels == KernelShape::Gpu {
                    want.sort();
                }
                let got: Vec<u32> = cand[s * k as usize * 2..(s + 1) * k as usize * 2]
                    .chunks(2)
                    .filter(|c| c[0] != 0)
                    .map(|c| c[1])
                    .collect();
                assert_eq!(
                    got, want,
                    "{name}: vocabulary {n_vocab}, k {k}, segment {s}"
                );
            }
        }
    }
}

/// Settings the GPU chain runs: llama.cpp's defaults, greedy, wide and narrow nuclei,
/// penalties over a history, logit bias with a banned token, min_keep.
fn param_sets() -> Vec<SamplerParams> {
    let d = SamplerParams::default();
    vec![
        SamplerParams {
            temp: 0.8,
            ..d.clone()
        },
        SamplerParams {
            temp: 0.0,
            ..d.clone()
        },
        SamplerParams {
            top_k: 256,
            top_p: 0.5,
            min_p: 0.0,
            temp: 1.5,
            ..d.clone()
        },
        SamplerParams {
            top_k: 1,
            ..d.clone()
        },
        SamplerParams {
            top_k: 100,
            top_p: 1.0,
            min_p: 0.2,
            temp: 0.6,
            min_keep: 3,
            ..d.clone()
        },
        SamplerParams {
            repeat_penalty: 1.3,
            frequency_penalty: 0.2,
            presence_penalty: 0.1,
            repeat_last_n: 64,
            ..d.clone()
        },
        SamplerParams {
            logit_bias: vec![(5, 4.0), (17, -2.5), (5, 1.0)],
            banned: vec![0, 2],
            temp: 1.0,
            ..d.clone()
        },
    ]
}

/// The same logits, settings and uniform number give the CPU sampler's token, except
/// where the draw lands within rounding of a boundary between candidates or the two
/// candidates' logits tie (counted, and few).
#[test]
fn gpu_chain_picks_the_cpu_samplers_token() {
    let mut rng = Rng(72);
    for (name, gpu, _serial) in gpus() {
        let (mut cases, mut near, mut ties) = (0, 0, 0);
        for &n_vocab in &[49152usize, 262144, 1000] {
            let sets = param_sets();
            let n_rows = sets.len();
            let b = Bufs::new(gpu, n_vocab, n_rows, n_rows);
            for round in 0..3u64 {
                let mut all = Vec::new();
                let mut rows = Vec::new();
                let mut samplers = Vec::new();
                for (slot, p) in sets.iter().enumerate() {
                    let l = logits(&mut rng, n_vocab, 1.0 + 2.0 * (round as f32));
                    let mut s = Sampler::new(
                        SamplerParams {
                            seed: 1000 * round + slot as u64,
                            ..p.clone()
                        },
                        n_vocab,
                    );
                    for _ in 0..80 {
                        s.accept(rng.below(n_vocab.min(300) as u32));
                    }
                    b.sync(gpu, n_vocab, slot, &s);
                    let mut row = gpu_row(s.params(), n_vocab)
                        .unwrap()
                        .with_uniform(s.peek_uniform());
                    (row.row, row.slot) = (slot as u32, slot as u32);
                    // Every final candidate, or a few.
                    row.n_probs = if slot % 2 == 0 { row.k } else { row.k.min(3) };
                    all.extend_from_slice(&l);
                    rows.push(row);
                    samplers.push((s, l));
                }
                gpu.write(&b.logits.buf, 0, bytemuck::cast_slice(&all));
                let got = b.draw_with_probs(gpu, n_vocab, &rows);
                for (slot, ((mut s, l), d)) in samplers.into_iter().zip(got).enumerate() {
                    let (tok, prob) = (d.token, d.prob);
                    cases += 1;
                    let u = s.peek_uniform();
                    let (want, want_p, cands) = s.pick_with_uniform(&l, u);
                    // The GPU recorded its token in the slot's history: the counts are
                    // the CPU history's after accepting it.
                    s.accept_gpu_pick(tok).unwrap();
                    if s.params().repeat_last_n > 0 && s.params().repeat_penalty != 1.0 {
                        let counts: Vec<u32> = bytemuck::pod_collect_to_vec(
                            &gpu.read_bytes(
                                &b.counts.buf,
                                (slot * n_vocab * 4) as u64,
                                n_vocab as u64 * 4,
                            )
                            .unwrap(),
                        );
                        let mut dense = vec![0u32; n_vocab];
                        for &t in s.penalty_history() {
                            dense[t as usize] += 1;
                        }
                        assert!(
                            counts == dense,
                            "{name}: slot {slot}: penalty counts after the draw"
                        );
                    }
                    if tok == want {
                        assert!(
                            (prob - want_p).abs() < 1e-3,
                            "{name}: {n_vocab} slot {slot}: p {prob} vs {want_p}"
                        );
                        check_final_candidates(&d.top, &cands, rows[slot].n_probs as usize);
                        continue;
                    }
                    let mut cum = 0.0f64;
                    let boundary = cands.iter().any(|c| {
                        cum += c.1 as f64;
                        (cum - u).abs() < 1e-4
                    });
                    let tie = (tok as usize) < l.len() && l[tok as usize] == l[want as usize];
                    assert!(boundary || tie, "{name}: vocabulary {n_vocab}, round {round}, slot {slot} ({:?}): GPU {tok} vs CPU {want} (u {u})", s.params());
                    near += boundary as u32;
                    ties += (tie && !boundary) as u32;
                }
            }
        }
        eprintln!("{name}: {cases} draws, {near} within rounding of a boundary, {ties} ties");
        assert!(near + ties <= cases / 10, "{name}: too many exempt draws");
    }
}

/// The GPU's final candidates (post-sampling probabilities) against the CPU chain's:
/// best first, each probability the CPU's within rounding, and every CPU candidate of
/// the first `n` that is not vanishingly small listed — except tokens tied with the
/// last candidate top-k kept, where the two sorts keep different ones of the tie.
fn check_final_candidates(gpu: &[(u32, f32)], cpu: &[(u32, f32)], n: usize) {
    let mut want: Vec<(u32, f32)> = cpu.iter().copied().filter(|c| c.1 > 0.0).collect();
    want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    want.truncate(n);
    assert_eq!(gpu.len(), n, "one place per candidate asked for");
    let listed: Vec<(u32, f32)> = gpu.iter().copied().filter(|c| c.1 > 0.0).collect();
    assert!(
        listed.windows(2).all(|w| w[0].1 >= w[1].1),
        "best first: {listed:?}"
    );
    let last = cpu.iter().map(|c| c.1).fold(f32::INFINITY, f32::min);
    let at_the_cut = |p: f32| (p - last).abs() < 1e-6;
    for &(id, p) in &listed {
        match cpu.iter().find(|c| c.0 == id) {
            Some(c) => assert!((p - c.1).abs() < 1e-4, "token {id}: GPU p {p}, CPU {}", c.1),
            None => assert!(at_the_cut(p), "token {id} (p {p}) is not a CPU candidate"),
        }
    }
    for &(id, q) in want.iter().filter(|c| c.1 > 1e-6 && !at_the_cut(c.1)) {
        assert!(
            listed.iter().any(|c| c.0 == id),
            "token {id} (p {q}) missing from {listed:?}"
        );
    }
}

/// The logit the chain's truncation sees for token `t`: bias, then penalties over the
/// sampler's history (llama.cpp's order).
fn chain_logit(s: &Sampler, logits: &[f32], t: u32) -> f32 {
    let p = s.params();
    let mut l = logits[t as usize] + dense_bias(p, logits.len())[t as usize];
    let count = s.penalty_history().iter().filter(|&&h| h == t).count();
    if count > 0 && p.repeat_last_n > 0 {
        l = if l <= 0.0 {
            l * p.repeat_penalty
        } else {
            l / p.repeat_penalty
        };
        l -= count as f32 * p.frequency_penalty + p.presence_penalty;
    }
    l
}

/// llama.cpp's own sampler, recorded on the harness's logit rows (tests/data/sampler):
/// every fixture whose settings the GPU chain runs picks llama.cpp's token on the GPU
/// too, except where llama.cpp's token ties with the GPU's (equal logits: the GPU orders
/// ties by id, llama.cpp as libstdc++'s sort leaves them; the fixtures' rows are full of
/// ties on purpose) or the draw falls within rounding of a boundary. A case stops at its
/// first difference, since later steps depend on it.
#[test]
fn gpu_chain_replays_llama_cpp_sampler_fixtures() {
    // The first test device of each kernel shape (the replay is long).
    let mut shapes = Vec::new();
    for (name, gpu, _serial) in gpus() {
        if shapes.contains(&gpu.kernels) {
            continue;
        }
        shapes.push(gpu.kernels);
        replay_fixtures(name, gpu);
    }
}

fn replay_fixtures(name: &str, gpu: &Gpu) {
    let (mut files, mut cases, mut steps, mut ties, mut near) = (0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    let mut logits = Vec::new();
    for file in fixture::fixtures() {
        let (params, recorded) = fixture::parse(&std::fs::read_to_string(&file).unwrap());
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let Some(max_vocab) = recorded.iter().map(|c| c.vocab).max() else {
            continue;
        };
        if let Err(why) = gpu_row(&params, max_vocab) {
            eprintln!("{stem}: stays on the CPU ({why})");
            continue;
        }
        files += 1;
        for c in recorded {
            cases += 1;
            let b = Bufs::new(gpu, c.vocab, 1, 1);
            let mut s = Sampler::new(
                SamplerParams {
                    seed: c.seed,
                    ..params.clone()
                },
                c.vocab,
            );
            for &t in &c.prompt {
                s.accept(t);
            }
            b.sync(gpu, c.vocab, 0, &s);
            for (step, &(tok, _)) in c.expect.iter().enumerate() {
                fixture::row(&mut logits, c.vocab, c.lseed, step as u64, &c.rows);
                gpu.write(&b.logits.buf, 0, bytemuck::cast_slice(&logits));
                let row = gpu_row(s.params(), c.vocab)
                    .unwrap()
                    .with_uniform(s.peek_uniform());
                let (got, _) = b.draw(gpu, c.vocab, &[row])[0];
                steps += 1;
                if got != tok {
                    let u = s.peek_uniform();
                    let (_, _, cands) = s.clone().pick_with_uniform(&logits, u);
                    let mut cum = 0.0f64;
                    if chain_logit(&s, &logits, got) == chain_logit(&s, &logits, tok) {
                        ties += 1;
                    } else if cands.iter().any(|c| {
                        cum += c.1 as f64;
                        (cum - u).abs() < 1e-4
                    }) {
                        near += 1;
                    } else {
                        failures.push(format!(
                            "{stem} {}: step {step}: llama.cpp {tok}, GPU {got}",
                            c.line
                        ));
                    }
                    break;
                }
                s.accept_gpu_pick(tok).unwrap();
            }
        }
    }
    eprintln!(
        "{name}: {files} fixture files, {cases} cases, {steps} steps on the GPU chain; \
         {ties} cases stopped at a tie, {near} at a draw within rounding of a boundary"
    );
    assert!(
        files >= 8,
        "only {files} fixture files run on the GPU chain"
    );
    assert!(
        failures.is_empty(),
        "{} of {cases} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
