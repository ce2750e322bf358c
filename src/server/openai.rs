//! OpenAI's API as llama-server serves it: `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions` (streamed as chunks ending with `[DONE]`).

use super::chat::ChatRequest;
use super::error::{ApiError, ApiResult};
use super::gen::{self, Item, Piece};
use super::params::{self, Fields, GenParams};
use super::tools;
use super::wire::{body_json, futures_join, now, reply_id, timings_json, token_json};
use super::AppState;
use crate::engine::service::Finished;
use crate::tokenizer::Tokenizer;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

const DONE: &str = "data: [DONE]\n\n";

/// llama-server's `b<build>` form, which clients check.
fn fingerprint() -> String {
    format!("b{}-wgllm", env!("CARGO_PKG_VERSION"))
}

/// One streamed chunk (or whole reply) of OpenAI's shape.
fn oai_chunk(object: &str, id: &str, created: u64, model: &str, choices: Value) -> Value {
    json!({
        "choices": choices,
        "created": created,
        "id": id,
        "model": model,
        "system_fingerprint": fingerprint(),
        "object": object,
    })
}

pub async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    let name = s.model_name();
    let meta = s.service().ok().map(|svc| {
        let i = svc.info();
        json!({
            "n_vocab": i.n_vocab,
            "n_ctx_train": i.n_ctx_train,
            "n_embd": i.n_embd,
            "n_ctx": i.n_ctx_slot,
            "size": i.model_bytes,
        })
    });
    let vision = (s.service().ok()).is_some_and(|svc| svc.image_prep().is_some());
    let capabilities = match vision {
        true => json!(["completion", "multimodal"]),
        false => json!(["completion"]),
    };
    Json(json!({
        "object": "list",
        "data": [{
            "id": name,
            "object": "model",
            "created": now(),
            "owned_by": "llamacpp",
            "aliases": if s.opts.aliases.is_empty() { vec![name.clone()] } else { s.opts.aliases.clone() },
            "tags": s.opts.tags,
            "meta": meta,
        }],
        "models": [{
            "name": name,
            "model": name,
            "type": "model",
            "capabilities": capabilities,
        }],
    }))
}

fn usage(end: &Finished) -> Value {
    usage_json(end.n_prompt, end.n_generated, end.n_cached)
}

/// OpenAI's `usage` object.
fn usage_json(n_prompt: usize, n_gen: usize, n_cached: usize) -> Value {
    json!({
        "completion_tokens": n_gen,
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + n_gen,
        "prompt_tokens_details": {"cached_tokens": n_cached},
    })
}

/// `n_probs` from OpenAI's `logprobs` (a count for completions, `true` + `top_logprobs`
/// for chat).
pub(super) fn oai_n_probs(body: &Value, p: &mut GenParams, chat: bool) -> ApiResult<()> {
    let f = Fields::of(body)?;
    let n = if chat {
        if f.bool("logprobs")?.unwrap_or(false) {
            Some(f.i64("top_logprobs")?.unwrap_or(0).clamp(0, 20) as usize)
        } else {
            None
        }
    } else {
        match f.value("logprobs") {
            Some(Value::Bool(true)) => Some(1),
            Some(Value::Bool(false)) | None => None,
            Some(_) => Some(f.i64("logprobs")?.unwrap_or(0).clamp(0, 20) as usize),
        }
    };
    if let Some(n) = n {
        // The chosen token's probability needs the distribution even with no alternatives.
        p.n_probs = n.max(1);
        p.request.params.n_probs = p.n_probs;
        p.show_top = n > 0;
    }
    Ok(())
}

fn logprob_entry(tok: &Tokenizer, pc: &Piece, top: bool) -> Option<Value> {
    let (pr, token) = (pc.probs.as_ref()?, pc.token?);
    let (text, bytes) = token_json(tok, token);
    let tops: Vec<Value> = if top {
        pr.top
            .iter()
            .map(|&(t, p)| {
                let (text, bytes) = token_json(tok, t);
                json!({"id": t, "token": text, "bytes": bytes, "logprob": (p as f64).ln()})
            })
            .collect()
    } else {
        Vec::new()
    };
    Some(json!({
        "id": token,
        "token": text,
        "bytes": bytes,
        "logprob": (pr.prob as f64).ln(),
        "top_logprobs": tops,
    }))
}

fn logprobs_json(tok: &Tokenizer, pieces: &[Piece], p: &GenParams) -> Value {
    if p.n_probs == 0 {
        return Value::Null;
    }
    json!({
        "content": pieces.iter().filter_map(|pc| logprob_entry(tok, pc, p.show_top)).collect::<Vec<_>>(),
    })
}

pub async fn completions(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    let service = s.service()?;
    let body = super::off_runtime(|| body_json(&body)).await?;
    let tok = service.tokenizer();
    let mut p = super::off_runtime(|| params::gen_params(&body, &s.opts.defaults, tok)).await?;
    oai_n_probs(&body, &mut p, false)?;
    let input = s.image_input(service);
    let mut reqs =
        super::off_runtime(|| params::completion_requests(&body, &p, tok, &input)).await?;
    params::check_replies(&reqs, &p, service.info().n_ctx_slot)?;
    let model = s.model_name();
    let id = reply_id("chatcmpl-");
    if p.stream {
        let req = reqs.remove(0);
        let start = gen::start_stream(service, req).await?;
        let tok = tok.clone();
        let created = now();
        return Ok(gen::sse(
            start,
            move |item| {
                let chunk =
                    |choices: Value| oai_chunk("text_completion", &id, created, &model, choices);
                match item {
                    Item::Progress(_) => String::new(),
                    Item::Piece(pc) => gen::data(&chunk(json!([{
                        "text": pc.text,
                        "index": 0,
                        "logprobs": if p.n_probs > 0 { logprobs_json(&tok, std::slice::from_ref(pc), &p) } else { Value::Null },
                        "finish_reason": Value::Null,
                    }]))),
                    Item::End(end) => {
                        let mut c = chunk(json!([{
                            "text": "",
                            "index": 0,
                            "logprobs": Value::Null,
                            "finish_reason": gen::finish_reason(&end.stop),
                        }]));
                        c["timings"] = timings_json(&end.timings, end.n_cached, end.n_generated);
                        let mut out = gen::data(&c);
                        if p.include_usage {
                            let mut u = chunk(json!([]));
                            u["usage"] = usage(end);
                            out.push_str(&gen::data(&u));
                        }
                        out
                    }
                    Item::Error(e) => gen::data(&json!({"error": e.object()})),
                }
            },
            Some(DONE),
        ));
    }
    let runs = reqs.into_iter().map(|req| {
        let service = service.clone();
        async move { gen::complete(&service, req).await }
    });
    let mut choices = Vec::new();
    let (mut n_prompt, mut n_gen, mut n_cached) = (0, 0, 0);
    let mut timings = Value::Null;
    for (i, r) in futures_join(runs).await.into_iter().enumerate() {
        let c = r?;
        n_prompt += c.end.n_prompt;
        n_gen += c.end.n_generated;
        n_cached += c.end.n_cached;
        timings = timings_json(&c.end.timings, c.end.n_cached, c.end.n_generated);
        choices.push(json!({
            "text": c.text,
            "index": i,
            "logprobs": logprobs_json(tok, &c.pieces, &p),
            "finish_reason": gen::finish_reason(&c.end.stop),
        }));
    }
    Ok(Json(json!({
        "choices": choices,
        "created": now(),
        "model": model,
        "system_fingerprint": fingerprint(),
        "object": "text_completion",
        "usage": usage_json(n_prompt, n_gen, n_cached),
        "id": id,
        "timings": timings,
    }))
    .into_response())
}

/// A chat request's prompt: its tokens (template rendered on the caller's side) and
/// images.
pub fn chat_prompt(
    body: &Value,
    tok: &Tokenizer,
    input: &super::media::ImageInput,
    r: &super::params::ReasoningDefaults,
) -> ApiResult<crate::engine::MediaPrompt> {
    ChatRequest::read(body, tok, r)?.prompt(tok, input)
}

/// The token count of a chat prompt, the body first read by `convert` (an endpoint's
/// own shape as a chat completion's): the input-token endpoints.
pub(super) async fn chat_prompt_len(
    s: &AppState,
    body: &Bytes,
    convert: fn(&Value) -> ApiResult<Value>,
) -> ApiResult<usize> {
    let service = s.service()?;
    let input = s.image_input(service);
    let r = &s.opts.defaults.reasoning;
    super::off_runtime(|| {
        let chat = convert(&body_json(body)?)?;
        Ok(chat_prompt(&chat, service.tokenizer(), &input, r)?
            .tokens
            .len())
    })
    .await
}

/// `/chat/completions/input_tokens`: the prompt's token count, nothing generated.
pub async fn chat_input_tokens(
    State(s): State<Arc<AppState>>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let n = chat_prompt_len(&s, &body, |v| Ok(v.clone())).await?;
    Ok(Json(
        json!({"input_tokens": n, "object": "response.input_tokens"}),
    ))
}

pub async fn chat_completions(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    let service = s.service()?;
    let body = super::off_runtime(|| body_json(&body)).await?;
    let tok = service.tokenizer();
    let mut p = super::off_runtime(|| params::gen_params(&body, &s.opts.defaults, tok)).await?;
    oai_n_probs(&body, &mut p, true)?;
    let f = Fields::of(&body)?;
    let n_choices = f.i64("n")?.unwrap_or(1);
    let n_slots = service.info().n_slots as i64;
    if !(1..=n_slots.max(1)).contains(&n_choices) && n_choices != 1 {
        return Err(ApiError::invalid(format!(
            "\"n\" must be between 1 and the number of slots ({n_slots})"
        )));
    }
    let verbose = f.bool("verbose")?.unwrap_or(s.opts.verbose);
    let return_progress = f.bool("return_progress")?.unwrap_or(false);
    let input = s.image_input(service);
    let (chat, req) = super::off_runtime(|| {
        ChatRequest::request(&body, &p.request, tok, &input, &s.opts.defaults.reasoning)
    })
    .await?;
    if !p.stream {
        let n_ctx = service.info().n_ctx_slot;
        let n_predict = p.request.params.n_predict;
        let n = n_choices as usize;
        super::budget::check_generation(n, n_predict, p.n_probs, n_ctx, req.prompt.len())?;
    }
    // `verbose` echoes the prompt as rendered.
    let rendered = if verbose {
        chat.render(tok)?
    } else {
        String::new()
    };
    let model = s.model_name();
    let id = reply_id("chatcmpl-");
    let created = now();
    if p.stream {
        let start = gen::start_stream(service, req).await?;
        let tok = tok.clone();
        let mut first = true;
        // Thinking is streamed as it is split out; with tools the rest is one JSON
        // object, read back whole at the end.
        let mut split = chat.splitter();
        let hold = chat.tools.is_some();
        return Ok(gen::sse(
            start,
            move |item| {
                let chunk = |choices: Value| {
                    oai_chunk("chat.completion.chunk", &id, created, &model, choices)
                };
                let mut out = String::new();
                // A stream's first item is the slot's start (see `gen::sse`): it opens the
                // reply with the role chunk, which carries the first progress report.
                let opening = std::mem::take(&mut first);
                match item {
                    Item::Progress(pr) => {
                        if opening || return_progress {
                            let mut c = chunk(json!([{
                                "finish_reason": Value::Null,
                                "index": 0,
                                "delta": {"role": "assistant", "content": Value::Null},
                            }]));
                            if return_progress {
                                c["prompt_progress"] = pr.json();
                            }
                            out.push_str(&gen::data(&c));
                        }
                    }
                    Item::Piece(pc) if pc.text.is_empty() && pc.probs.is_none() => {}
                    Item::Piece(pc) => {
                        let d = split.push(&pc.text);
                        let mut delta = |delta: Value, last: bool| {
                            let mut choice = json!({
                                "finish_reason": Value::Null,
                                "index": 0,
                                "delta": delta,
                            });
                            if p.n_probs > 0 && last {
                                choice["logprobs"] =
                                    logprobs_json(&tok, std::slice::from_ref(pc), &p);
                            }
                            out.push_str(&gen::data(&chunk(json!([choice]))));
                        };
                        // A token's probabilities go with the last chunk it made.
                        let text = !hold && (!d.content.is_empty() || pc.text.is_empty());
                        if !d.reasoning.is_empty() {
                            delta(json!({"reasoning_content": d.reasoning}), !text);
                        }
                        if text {
                            delta(json!({"content": d.content}), true);
                        }
                    }
                    Item::End(end) => {
                        let mut reason = gen::finish_reason(&end.stop);
                        let d = split.finish();
                        let mut delta = |delta: Value| {
                            out.push_str(&gen::data(&chunk(json!([{
                                "finish_reason": Value::Null,
                                "index": 0,
                                "delta": delta,
                            }]))))
                        };
                        if !d.reasoning.is_empty() {
                            delta(json!({"reasoning_content": d.reasoning}));
                        }
                        if !hold && !d.content.is_empty() {
                            delta(json!({"content": d.content}));
                        }
                        if hold {
                            let r = chat.reply(split.text());
                            let delta = if r.calls.is_empty() {
                                json!({"content": r.content})
                            } else {
                                reason = "tool_calls";
                                let mut calls = tools::openai_calls(&r.calls);
                                for (i, c) in calls.as_array_mut().into_iter().flatten().enumerate()
                                {
                                    c["index"] = json!(i);
                                }
                                json!({"tool_calls": calls})
                            };
                            out.push_str(&gen::data(&chunk(json!([{
                                "finish_reason": Value::Null,
                                "index": 0,
                                "delta": delta,
                            }]))));
                        }
                        let mut c = chunk(json!([{
                            "finish_reason": reason,
                            "index": 0,
                            "delta": {},
                        }]));
                        let timings = timings_json(&end.timings, end.n_cached, end.n_generated);
                        if p.include_usage {
                            out.push_str(&gen::data(&c));
                            let mut u = chunk(json!([]));
                            u["usage"] = usage(end);
                            u["timings"] = timings;
                            out.push_str(&gen::data(&u));
                        } else {
                            c["timings"] = timings;
                            out.push_str(&gen::data(&c));
                        }
                    }
                    Item::Error(e) => out.push_str(&gen::data(&json!({"error": e.object()}))),
                }
                out
            },
            Some(DONE),
        ));
    }
    // `n` choices: the same prompt on as many requests, each with the next seed.
    let runs = (0..n_choices).map(|i| {
        let mut r = req.clone();
        let seed = r.params.sampling.seed;
        if seed != crate::sample::SamplerParams::RANDOM_SEED {
            r.params.sampling.seed = (seed + i as u64) & 0xFFFF_FFFF;
        }
        let service = service.clone();
        async move { gen::complete(&service, r).await }
    });
    let mut choices = Vec::new();
    let mut last = None;
    let (mut n_prompt, mut n_gen, mut n_cached) = (0, 0, 0);
    for (i, r) in futures_join(runs).await.into_iter().enumerate() {
        let c = r?;
        let reply = chat.reply(&c.text);
        let mut message = json!({"role": "assistant", "content": reply.content});
        if !reply.reasoning.is_empty() {
            message["reasoning_content"] = json!(reply.reasoning);
        }
        let mut reason = gen::finish_reason(&c.end.stop);
        if !reply.calls.is_empty() {
            reason = "tool_calls";
            if reply.content.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = tools::openai_calls(&reply.calls);
        }
        let mut choice = json!({
            "finish_reason": reason,
            "index": i,
            "message": message,
        });
        if p.n_probs > 0 {
            choice["logprobs"] = logprobs_json(tok, &c.pieces, &p);
        }
        choices.push(choice);
        n_prompt = c.end.n_prompt;
        n_gen += c.end.n_generated;
        n_cached += c.end.n_cached;
        last = Some(c);
    }
    let c = last.ok_or_else(|| ApiError::server("no choice was generated"))?;
    let mut v = json!({
        "choices": choices,
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "object": "chat.completion",
        "usage": usage_json(n_prompt, n_gen, n_cached),
        "id": id,
        "timings": timings_json(&c.end.timings, c.end.n_cached, c.end.n_generated),
    });
    if verbose {
        v["__verbose"] = json!({"prompt": rendered, "content": c.text});
    }
    Ok(Json(v).into_response())
}
