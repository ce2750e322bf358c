//! Several sequences sharing a system prompt, decoded together in one context:
//! the prompt is decoded once and shared through seq_cp, then all questions and every
//! generation step go to the GPU in shared batches. Each answer is then checked against
//! decoding that question alone in a fresh context: the greedy tokens must be the same.
//!
//! `cargo run --release --example parallel -- MODEL.gguf [N_SEQUENCES] [N_TOKENS]`

use std::sync::Arc;
use std::time::Instant;
use wgllm::context::{Context, ContextParams};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::model::Model;
use wgllm::parallel::{decode_shared_prefix, Request};
use wgllm::sample::{Sampler, SamplerParams};
use wgllm::tokenizer::Tokenizer;

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

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        anyhow::bail!("usage: parallel MODEL.gguf [N_SEQUENCES (1..=8)] [N_TOKENS]");
    };
    let n_seq: usize = args.next().map_or(Ok(4), |s| s.parse())?;
    let n_gen: usize = args.next().map_or(Ok(24), |s| s.parse())?;
    anyhow::ensure!((1..=8).contains(&n_seq), "N_SEQUENCES must be 1..=8");
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let model = Arc::new(Model::load(
        Gpu::new(&GpuOptions::default())?,
        &file,
        &mut |_, _| {},
    )?);
    let prefix = tok.encode(SYSTEM, true, true);
    let requests = |n: usize, skip: usize| -> Vec<Request> {
        QUESTIONS[skip..skip + n]
            .iter()
            .map(|q| Request {
                prompt: tok.encode(&format!("Q: {q}\nA:"), false, true),
                sampler: Sampler::new(SamplerParams::greedy(), tok.n_vocab()),
                n_predict: n_gen,
            })
            .collect()
    };
    let is_end = |t: u32| tok.is_eog(t);
    let mut params = ContextParams::new(1024, 512, 512);
    params.n_seq_max = n_seq as u32;
    let mut ctx = Context::new(model.clone(), params)?;
    let t0 = Instant::now();
    let together = decode_shared_prefix(&mut ctx, &prefix, &mut requests(n_seq, 0), &is_end)?;
    let dt = t0.elapsed().as_secs_f64();
    let n_tokens: usize = together.iter().map(|t| t.len()).sum();
    let mut alone_ctx = Context::new(model, ContextParams::new(1024, 512, 512))?;
    let mut all_same = true;
    for (i, toks) in together.iter().enumerate() {
        let alone = decode_shared_prefix(&mut alone_ctx, &prefix, &mut requests(1, i), &is_end)?;
        let same = alone[0] == *toks;
        all_same &= same;
        let text: String = toks
            .iter()
            .map(|&t| String::from_utf8_lossy(&tok.token_to_piece(t, false)).into_owned())
            .collect();
        println!("[{i}] {} ->{text}", QUESTIONS[i]);
        println!(
            "    same tokens as decoded alone: {}",
            if same { "yes" } else { "NO" }
        );
    }
    eprintln!(
        "{n_seq} sequences, {n_tokens} tokens generated together in {dt:.2} s ({:.1} tokens/s)",
        n_tokens as f64 / dt
    );
    anyhow::ensure!(
        all_same,
        "a sequence decoded together differs from decoding it alone"
    );
    Ok(())
}
