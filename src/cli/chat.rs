//! `wgllm chat`: an interactive conversation rendered with the model's chat template, on
//! the engine service (each turn decodes only what the slot's cache does not hold yet).

use super::media::prepare_file;
use super::run::{SamplingArgs, ShiftArgs};
use super::{load_engine, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use std::io::{BufRead, Write};
use std::sync::Arc;
use wgllm::engine::private_marker;
use wgllm::engine::service::{EngineService, Request, RequestError, RequestEvent, StopReason};
use wgllm::engine::{MediaPrompt, PreparedImage, SessionParams, Timings};
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
    /// The vision encoder and images for the first message; `/image PATH` adds one later.
    #[command(flatten)]
    pub media: super::media::MediaArgs,
}

pub fn chat(a: &ChatArgs) -> Result<()> {
    let policy = a.shift.policy()?;
    a.spec.speculation()?;
    a.media.check()?;
    // With -hf the repository's mmproj comes too, as llama-cli takes it.
    let (mut model, mut media) = (a.model.clone(), a.media.clone());
    media.resolve(&mut model, true)?;
    let mut opts = model.options()?;
    opts.swa_keep = a.shift.swa_keep();
    let mut engine = load_engine(&model, &opts)?;
    a.spec.attach(&mut engine)?;
    media.attach(&mut engine)?;
    // Images wait for the next message, which gets their markers (llama-mtmd-cli's
    // `/image` does the same); the conversation keeps every image it was given.
    let mut waiting = media.prepare(&engine)?;
    let mut images: Vec<Arc<PreparedImage>> = Vec::new();
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
    let prep = service.image_prep().cloned();
    match prep {
        Some(_) => eprintln!(
            "chatting with {name} — type a message, /image PATH to add an image, Ctrl-D to quit"
        ),
        None => eprintln!("chatting with {name} — type a message, Ctrl-D to quit"),
    }
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
        if let Some(path) = image_command(line) {
            match &prep {
                None => eprintln!(
                    "no vision encoder is loaded: restart with --mmproj FILE to chat about images"
                ),
                Some(prep) => match prepare_file(prep, std::path::Path::new(path)) {
                    Ok(img) => {
                        waiting.push(img);
                        eprintln!("{path} loaded; it goes with your next message");
                    }
                    Err(e) => eprintln!("{e:#}"),
                },
            }
            continue;
        }
        // The images' places: a marker of this process's own, so that a `<__media__>`
        // typed (or written by the model) stays text.
        let content = format!("{}{line}", private_marker().repeat(waiting.len()));
        messages.push(ChatMessage::new("user", content));
        let rendered = tok.apply_chat_template(&messages, true)?;
        let turn_images: Vec<Arc<PreparedImage>> = images.iter().chain(&waiting).cloned().collect();
        let prompt = match &prep {
            Some(prep) if !turn_images.is_empty() => {
                match MediaPrompt::build(tok, prep, &rendered, private_marker(), &turn_images, true)
                {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("{e}");
                        messages.pop();
                        continue;
                    }
                }
            }
            _ => MediaPrompt::text(tok.encode(&rendered, true, true)),
        };
        images = turn_images;
        waiting.clear();
        let mut ticket = service.submit(Request {
            prompt: prompt.tokens,
            images: prompt.images,
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

/// The path of a `/image PATH` line (llama-mtmd-cli's chat command).
fn image_command(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("/image")?;
    let path = rest.strip_prefix(' ')?.trim();
    (!path.is_empty()).then_some(path)
}
