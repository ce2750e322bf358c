//! `wgllm chat`: an interactive conversation rendered with the model's chat template, on
//! the engine service (each turn decodes only what the slot's cache does not hold yet).

use super::run::{SamplingArgs, ShiftArgs};
use super::{load_engine, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use std::io::{BufRead, Write};
use wgllm::engine::service::{EngineService, Request, RequestError, RequestEvent, StopReason};
use wgllm::engine::{SessionParams, Timings};
use wgllm::tokenizer::ChatMessage;

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
    #[command(flatten)]
    pub spec: super::speculative::SpecArgs,
}

pub fn chat(a: &ChatArgs) -> Result<()> {
    let policy = a.shift.policy()?;
    a.spec.speculation()?;
    let mut opts = a.model.options()?;
    opts.swa_keep = a.shift.swa_keep();
    let mut engine = load_engine(&a.model, &opts)?;
    a.spec.attach(&mut engine)?;
    if engine.tokenizer.chat_template().is_none() {
        log::warn!("the model has no chat template; using ChatML, as llama.cpp does");
    }
    let params = SessionParams {
        sampling: a.sampling.params(&engine)?,
        n_predict: a.n_predict,
        shift: policy,
        prompt_cache: None,
        ..Default::default()
    };
    let (name, load_time) = (engine.model.name.clone(), engine.load_time);
    // The conversation is rendered whole each turn and submitted to one slot, whose cells
    // of the earlier turns are reused (the desktop app's chats work the same way).
    let service = EngineService::spawn(engine)?;
    let tok = service.tokenizer();
    let mut messages: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!("chatting with {name} — type a message, Ctrl-D to quit");
    let mut timings = Timings::default();
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
        messages.push(ChatMessage::new("user", line));
        let prompt = tok.encode(&tok.apply_chat_template(&messages, true)?, true, true);
        let mut ticket = service.submit(Request {
            prompt,
            params: params.clone(),
            cache_prompt: true,
            slot: Some(0),
            stop: Vec::new(),
            n_indent: 0,
        });
        let mut reply = String::new();
        let end = loop {
            let text = match ticket.events.blocking_recv() {
                Some(RequestEvent::Token { text, .. }) => text,
                Some(RequestEvent::Finished(end)) => break end,
                Some(RequestEvent::Failed(RequestError::ExceedsContext { n_prompt, n_ctx })) => {
                    bail!("the conversation ({n_prompt} tokens) no longer fits the context ({n_ctx} tokens); restart with a larger -c")
                }
                Some(RequestEvent::Failed(e)) => return Err(e.into()),
                Some(_) => continue,
                None => bail!("the engine stopped during the reply"),
            };
            write!(out, "{text}")?;
            out.flush()?;
            reply.push_str(&text);
        };
        write!(out, "{}", end.tail)?;
        writeln!(out)?;
        reply.push_str(&end.tail);
        messages.push(ChatMessage::new("assistant", reply));
        timings.add(&end.timings);
        if let StopReason::ContextFull(reason) = end.stop {
            bail!("the context is full and {reason}; restart with a larger -c");
        }
    }
    timings.load = load_time;
    eprintln!("{}", timings.report());
    Ok(())
}
