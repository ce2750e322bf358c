//! `wgllm chat`: an interactive conversation rendered with the model's chat template.
//! Each turn only the text the template adds since the last turn is tokenized and decoded.

use super::run::{SamplingArgs, ShiftArgs};
use super::{load_model, new_context, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use std::io::{BufRead, Write};
use wgllm::generate::{generate, Feeder, Stop, Timings, Utf8Stream};
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
}

pub fn chat(a: &ChatArgs) -> Result<()> {
    let loaded = load_model(&a.model)?;
    let tok = &loaded.tokenizer;
    if tok.chat_template().is_none() {
        log::warn!("the model has no chat template; using ChatML, as llama.cpp does");
    }
    let mut ctx = new_context(&loaded.model, &a.model)?;
    let mut sampler = a.sampling.sampler(tok)?;
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(ChatMessage::new("system", s.clone()));
    }
    let mut shown = String::new(); // the formatted conversation already in the cache
                                   // --keep counts tokens of the first turn (-1: all of it), fixed once it is known.
    let mut feeder = Feeder::new(&mut ctx, a.shift.policy(usize::MAX, false)?)?;
    let mut timings = Timings {
        load: loaded.load_time,
        ..Default::default()
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!(
        "chatting with {} — type a message, Ctrl-D to quit",
        loaded.model.name
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
        messages.push(ChatMessage::new("user", line));
        let formatted = tok.apply_chat_template(&messages, true)?;
        let new_text = formatted
            .strip_prefix(shown.as_str())
            .unwrap_or(&formatted)
            .to_string();
        let first_turn = feeder.n_past == 0 && feeder.ops.is_empty();
        let tokens = tok.encode(&new_text, first_turn, true);
        if first_turn {
            feeder.policy = a.shift.policy(tokens.len(), tok.add_bos())?;
        }
        let mut stream = Utf8Stream::default();
        let mut reply = String::new();
        let (_, stop) = generate(
            &mut feeder,
            tok,
            &mut sampler,
            &tokens,
            a.n_predict,
            &mut timings,
            &mut |t| {
                let text = stream.push(&tok.token_to_piece(t, false));
                reply.push_str(&text);
                print!("{text}");
                out.flush().is_ok()
            },
        )?;
        let tail = stream.finish();
        reply.push_str(&tail);
        println!("{tail}");
        if let Stop::ContextFull(reason) = stop {
            bail!("the context is full and {reason}; restart with a larger -c");
        }
        messages.push(ChatMessage::new("assistant", reply));
        // The cache now holds the prompt and the reply; the template's end-of-turn text
        // after the reply is fed at the start of the next turn.
        shown = formatted;
        let with_reply = tok.apply_chat_template(&messages, false)?;
        let reply_text = with_reply.strip_prefix(shown.as_str()).unwrap_or("");
        let consumed = reply_text
            .find(messages.last().unwrap().content.as_str())
            .map_or(0, |i| i + messages.last().unwrap().content.len());
        shown.push_str(&reply_text[..consumed]);
    }
    eprintln!("{}", timings.report());
    Ok(())
}
