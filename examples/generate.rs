//! Using wgllm as a library: load a GGUF into an engine, open a session, stream its text.
//! `cargo run --release --example generate -- MODEL.gguf "The capital of France is"`

use wgllm::engine::{Engine, EngineOptions, Event, SessionParams};
use wgllm::sample::SamplerParams;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(prompt)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: generate MODEL.gguf PROMPT");
    };
    let opts = EngineOptions {
        n_ctx: 512,
        ..Default::default()
    };
    let mut engine = Engine::load(path.as_ref(), &opts, &mut |_, _| {})?;
    let id = engine.open_session(SessionParams {
        sampling: SamplerParams::greedy(),
        n_predict: 32,
        ..Default::default()
    })?;
    engine.prompt_text(id, &prompt)?;
    print!("{prompt}");
    while engine.is_busy() {
        for event in engine.step()? {
            match event {
                Event::Token { text, .. } => print!("{text}"),
                Event::Finished { tail, timings, .. } => {
                    println!("{tail}");
                    eprintln!("{}", timings.report());
                }
                Event::Error { error, .. } => return Err(error.into()),
                _ => {}
            }
        }
    }
    Ok(())
}
