//! Using wgllm as a library: load a GGUF, tokenize, decode greedily, print the text.
//! `cargo run --release --example generate -- MODEL.gguf "The capital of France is"`

use std::sync::Arc;
use wgllm::context::{Context, ContextParams};
use wgllm::generate::{generate, Feeder, ShiftPolicy, Timings, Utf8Stream};
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::model::Model;
use wgllm::sample::{Sampler, SamplerParams};
use wgllm::tokenizer::Tokenizer;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(prompt)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: generate MODEL.gguf PROMPT");
    };
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let gpu = Gpu::new(&GpuOptions::default())?;
    let model = Arc::new(Model::load(gpu, &file, &mut |_, _| {})?);
    let mut ctx = Context::new(model, ContextParams::new(512, 512, 512))?;
    let mut sampler = Sampler::new(SamplerParams::greedy(), tok.n_vocab());
    let tokens = tok.encode(&prompt, true, true);
    let mut stream = Utf8Stream::default();
    let mut text = String::new();
    let mut timings = Timings::default();
    let mut feeder = Feeder::new(&mut ctx, ShiftPolicy::default())?;
    generate(
        &mut feeder,
        &tok,
        &mut sampler,
        &tokens,
        32,
        &mut timings,
        &mut |t| {
            text.push_str(&stream.push(&tok.token_to_piece(t, false)));
            true
        },
    )?;
    text.push_str(&stream.finish());
    println!("{prompt}{text}");
    eprintln!("{}", timings.report());
    Ok(())
}
