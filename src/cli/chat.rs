//! `wgllm chat`: an interactive conversation rendered with the model's chat template (the
//! engine keeps the conversation and decodes only what each turn adds).

use super::run::{drive, SamplingArgs, ShiftArgs};
use super::{load_engine, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use std::io::{BufRead, Write};
use wgllm::engine::{SessionParams, Stop};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt (default: none; the template may add its own).
    #[arg(long = "system-prompt", visible_alias = "sys")]
    pub system: Option<String>,
    /// Most tokens per reply (-1: until end of turn).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub shift: ShiftArgs,
}

pub fn chat(a: &ChatArgs) -> Result<()> {
    let policy = a.shift.policy()?;
    let mut opts = a.model.options()?;
    opts.swa_keep = a.shift.swa_keep();
    let mut engine = load_engine(&a.model, &opts)?;
    if engine.tokenizer.chat_template().is_none() {
        log::warn!("the model has no chat template; using ChatML, as llama.cpp does");
    }
    let id = engine.open_session(SessionParams {
        sampling: a.sampling.params(&engine)?,
        n_predict: a.n_predict,
        shift: policy,
        prompt_cache: None,
        ..Default::default()
    })?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!(
        "chatting with {} — type a message, Ctrl-D to quit",
        engine.model.name
    );
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(out)?;
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            continue;
        }
        engine.chat_with_system(id, a.system.as_deref(), line)?;
        let stop = drive(&mut engine, id, false, &mut |text| {
            write!(out, "{text}").and_then(|_| out.flush())
        })?;
        writeln!(out)?;
        if let Stop::ContextFull(reason) = stop {
            bail!("the context is full and {reason}; restart with a larger -c");
        }
    }
    let mut timings = engine.session(id)?.timings().clone();
    timings.load = engine.load_time;
    eprintln!("{}", timings.report());
    Ok(())
}
