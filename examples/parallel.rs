//! Several conversations sharing a system prompt, served by one engine: the prompt is
//! decoded once in one session and forked (its cells shared, not copied), then every
//! question and every generation step goes to the GPU in shared batches. Each answer is
//! checked against answering that question alone: the greedy tokens must be the same.
//!
//! `cargo run --release --example parallel -- MODEL.gguf [N_SEQUENCES] [N_TOKENS]`

use std::time::Instant;
use wgllm::engine::{Engine, EngineOptions, SessionParams};
use wgllm::sample::SamplerParams;

const SYSTEM: &str = "You are a helpful assistant. Answer each question in one short sentence.\n";
const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "How many legs does a spider have?",
    "What is the boiling point of water?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet?",
    "What do bees make?",
    "How many days are in a week?",
];

/// Answers `questions` together after a shared system prompt; returns each one's tokens.
fn answer(engine: &mut Engine, questions: &[&str], n_gen: i32) -> anyhow::Result<Vec<Vec<u32>>> {
    let params = SessionParams {
        sampling: SamplerParams::greedy(),
        n_predict: n_gen,
        ..Default::default()
    };
    let base = engine.open_session(params.clone())?;
    let system = engine.tokenizer.encode(SYSTEM, true, true);
    engine.feed(base, &system)?;
    let mut ids = Vec::new();
    for q in questions {
        let id = engine.fork_session(base, params.clone())?;
        let toks = engine.tokenizer.encode(&format!("Q: {q}\nA:"), false, true);
        engine.prompt_tokens(id, &toks)?;
        ids.push(id);
    }
    while engine.is_busy() {
        engine.step()?;
    }
    let out = ids
        .iter()
        .map(|&id| Ok(engine.session(id)?.generated().to_vec()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for id in ids.into_iter().chain([base]) {
        engine.close_session(id)?;
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        anyhow::bail!("usage: parallel MODEL.gguf [N_SEQUENCES (1..=8)] [N_TOKENS]");
    };
    let n_seq: usize = args.next().map_or(Ok(4), |s| s.parse())?;
    let n_gen: i32 = args.next().map_or(Ok(24), |s| s.parse())?;
    anyhow::ensure!((1..=8).contains(&n_seq), "N_SEQUENCES must be 1..=8");
    let opts = |n: usize| EngineOptions {
        n_ctx: 512 * n as u32,
        n_batch: 512,
        n_seq_max: n as u32,
        ..Default::default()
    };
    let mut engine = Engine::load(path.as_ref(), &opts(n_seq + 1), &mut |_, _| {})?;
    let t0 = Instant::now();
    let together = answer(&mut engine, &QUESTIONS[..n_seq], n_gen)?;
    let dt = t0.elapsed().as_secs_f64();
    let n_tokens: usize = together.iter().map(|t| t.len()).sum();
    let mut alone_engine = Engine::new(engine.model.clone(), engine.tokenizer.clone(), &opts(2))?;
    let mut all_same = true;
    for (i, toks) in together.iter().enumerate() {
        let alone = answer(&mut alone_engine, &[QUESTIONS[i]], n_gen)?;
        let same = alone[0] == *toks;
        all_same &= same;
        println!("[{i}] {} ->{}", QUESTIONS[i], engine.tokenizer.decode(toks));
        println!(
            "    same tokens as answered alone: {}",
            if same { "yes" } else { "NO" }
        );
    }
    eprintln!(
        "{n_seq} sessions, {n_tokens} tokens generated together in {dt:.2} s ({:.1} tokens/s)",
        n_tokens as f64 / dt
    );
    anyhow::ensure!(
        all_same,
        "a session answered together differs from answering it alone"
    );
    Ok(())
}
