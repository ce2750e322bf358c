//! OpenAI's Responses API (`/v1/responses`, `/v1/responses/input_tokens`) as
//! llama-server serves it: the request is read as a chat completion (`instructions` as
//! the system message, `input` as text or message items, `max_output_tokens`), the
//! reply written as a `response` object with one output message, or streamed as
//! `response.*` events. Nothing is stored: `previous_response_id` is refused, as
//! llama-server refuses it.

use super::chat::ChatRequest;
use super::error::{ApiError, ApiResult};
use super::gen::{self, Item};
use super::native::StreamClock;
use super::params::{self, Fields};
use super::wire::{body_json, now, reply_id, timings_json};
use super::AppState;
use crate::engine::service::Finished;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// One input item's text parts as chat content parts.
fn content_parts(item: &Value, output: bool) -> ApiResult<Vec<Value>> {
    let parts = match item.get("content") {
        Some(Value::String(s)) => return Ok(vec![json!({"type": "text", "text": s})]),
        Some(Value::Array(parts)) => parts,
        None if output => return Ok(Vec::new()),
        _ => return Err(ApiError::invalid("a message item needs \"content\"")),
    };
    parts
        .iter()
        .map(|p| {
            let text = |name: &str| {
                p.get("text")
                    .filter(|t| t.is_string())
                    .map(|t| json!({"type": "text", "text": t}))
                    .ok_or_else(|| ApiError::invalid(format!("'{name}' requires 'text'")))
            };
            match (p.get("type").and_then(Value::as_str), output) {
                (Some("input_text"), false) => text("Input text"),
                (Some("output_text" | "input_text"), true) => text("Output text"),
                (Some("refusal"), true) => Ok(json!({"type": "text", "text":
                    p.get("refusal").and_then(Value::as_str).ok_or_else(|| ApiError::invalid("'Refusal' requires 'refusal'"))?})),
                // Passed on as an image part, which the chat reader refuses with its reason.
                (Some("input_image"), false) => {
                    Ok(json!({"type": "image_url", "image_url": {"url": p.get("image_url")}}))
                }
                (Some("input_file"), false) => Err(ApiError::invalid(
                    "'input_file' is not supported: wgllm reads text input only",
                )),
                (_, false) => Err(ApiError::invalid(
                    "'type' must be one of 'input_text', 'input_image', or 'input_file'",
                )),
                (_, true) => Err(ApiError::invalid(
                    "'type' must be one of 'output_text' or 'refusal'",
                )),
            }
        })
        .collect()
}

/// The request as a chat completion body (llama-server's conversion; items wgllm has
/// no use for, tool calls and reasoning, are refused with the reason).
pub(super) fn as_chat(body: &Value) -> ApiResult<Value> {
    let f = Fields::of(body)?;
    let input = f
        .value("input")
        .ok_or_else(|| ApiError::invalid("'input' is required"))?;
    if f.str("previous_response_id")?
        .is_some_and(|s| !s.is_empty())
    {
        return Err(ApiError::invalid(
            "'previous_response_id' is not supported: wgllm keeps no responses; send the whole conversation as 'input'",
        ));
    }
    let mut messages: Vec<Value> = Vec::new();
    if let Some(sys) = f.str("instructions")? {
        messages.push(json!({"role": "system", "content": sys}));
    }
    match input {
        Value::String(s) => messages.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            for item in items {
                let role = item.get("role").and_then(Value::as_str);
                let kind = item.get("type").and_then(Value::as_str);
                match (role, kind) {
                    (Some("user" | "system" | "developer"), _) => messages.push(json!({
                        "role": role, "content": content_parts(item, false)?,
                    })),
                    (Some("assistant"), Some("message") | None) => {
                        let parts = content_parts(item, true)?;
                        // Consecutive assistant items are one message, as llama-server merges them.
                        match messages.last_mut() {
                            Some(prev) if prev["role"] == "assistant" => {
                                if let Some(c) = prev["content"].as_array_mut() {
                                    c.extend(parts)
                                }
                            }
                            _ => messages.push(json!({"role": "assistant", "content": parts})),
                        }
                    }
                    (_, Some("function_call" | "function_call_output")) => {
                        return Err(ApiError::invalid(
                            "function call items are not supported: wgllm does not parse tool calls out of the model's output",
                        ))
                    }
                    // Earlier thinking: the next assistant message's `reasoning_content`.
                    (_, Some("reasoning")) => {
                        let text: String = (item.get("content").and_then(Value::as_array))
                            .into_iter()
                            .flatten()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect();
                        messages.push(json!({
                            "role": "assistant", "content": [], "reasoning_content": text,
                        }));
                    }
                    _ => return Err(ApiError::invalid("Cannot determine type of 'item'")),
                }
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "'input' must be a string or array of objects",
            ))
        }
    }
    let mut chat: Map<String, Value> = f.0.clone();
    // `reasoning.effort` is the chat's `reasoning_effort`.
    let effort = (f.value("reasoning"))
        .and_then(|r| r.get("effort"))
        .filter(|e| e.is_string())
        .cloned();
    for k in ["input", "instructions", "max_output_tokens", "reasoning"] {
        chat.remove(k);
    }
    if let Some(e) = effort {
        chat.insert("reasoning_effort".into(), e);
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(n) = f.value("max_output_tokens") {
        chat.insert("max_tokens".into(), n.clone());
    }
    // Function calls are read back on the chat and Messages endpoints only; here they
    // would come out as text.
    if f.value("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
    {
        return Err(ApiError::invalid(
            "\"tools\" are not supported on /v1/responses: wgllm reads tool calls back on /v1/chat/completions and /v1/messages",
        ));
    }
    chat.remove("tools");
    Ok(Value::Object(chat))
}

fn usage(end: &Finished) -> Value {
    json!({
        "input_tokens": end.n_prompt,
        "output_tokens": end.n_generated,
        "total_tokens": end.n_prompt + end.n_generated,
        "input_tokens_details": {"cached_tokens": end.n_cached},
    })
}

/// The output text as a content part.
fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

/// The thinking as an output item.
fn reasoning_item(id: &str, text: &str) -> Value {
    json!({
        "id": id, "summary": [], "type": "reasoning",
        "content": [{"text": text, "type": "reasoning_text"}],
        "encrypted_content": "", "status": "completed",
    })
}

/// The reply as output items: its thinking, its message (none for empty ones, as
/// llama-server).
fn output_items(reasoning_id: &str, id: &str, reasoning: &str, text: &str) -> Vec<Value> {
    let mut items = Vec::new();
    if !reasoning.is_empty() {
        items.push(reasoning_item(reasoning_id, reasoning));
    }
    if !text.is_empty() {
        items.push(json!({
            "type": "message", "status": "completed", "id": id, "role": "assistant",
            "content": [text_part(text)],
        }));
    }
    items
}

/// An event named by its `type`.
fn event(v: Value) -> String {
    gen::event(v["type"].as_str().unwrap_or("message"), &v)
}

pub async fn responses(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    let service = s.service()?;
    let body = super::off_runtime(|| as_chat(&body_json(&body)?)).await?;
    let tok = service.tokenizer();
    let p = super::off_runtime(|| params::gen_params(&body, &s.opts.defaults, tok)).await?;
    let f = Fields::of(&body)?;
    let return_progress = f.bool("return_progress")?.unwrap_or(false);
    let per_token = f.bool("timings_per_token")?.unwrap_or(false);
    let mut req = p.request.clone();
    let input = s.image_input(service);
    let (chat, prompt) = super::off_runtime(|| {
        let chat = ChatRequest::read(&body, tok, &s.opts.defaults.reasoning)?;
        let prompt = chat.prompt(tok, &input)?;
        Ok::<_, ApiError>((chat, prompt))
    })
    .await?;
    req.prompt = prompt.tokens;
    req.images = prompt.images;
    let model = s.model_name();
    let resp_id = reply_id("resp_");
    let msg_id = reply_id("msg_");
    let rs_id = reply_id("rs_");
    if !p.stream {
        let c = gen::complete(service, req).await?;
        let r = chat.reply(&c.text);
        let t = now();
        return Ok(Json(json!({
            "completed_at": t,
            "created_at": t,
            "id": resp_id,
            "model": model,
            "object": "response",
            "output": output_items(&rs_id, &msg_id, &r.reasoning, &r.content),
            "status": "completed",
            "usage": usage(&c.end),
        }))
        .into_response());
    }
    let start = gen::start_stream(service, req).await?;
    let n_prompt = start.n_prompt;
    let mut created = false;
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut split = chat.splitter();
    let mut clock = StreamClock::default();
    let stub = json!({"id": resp_id, "object": "response", "status": "in_progress"});
    Ok(gen::sse(
        start,
        move |item| {
            let mut events: Vec<Value> = Vec::new();
            match item {
                // The first item is the slot's start (see `gen::sse`): it opens the response.
                Item::Progress(pr) => {
                    clock.progress(&pr);
                    let opening = !std::mem::replace(&mut created, true);
                    if opening {
                        events.push(json!({"type": "response.created", "response": stub}));
                    }
                    if opening || return_progress {
                        let mut e = json!({"type": "response.in_progress", "response": stub});
                        if return_progress {
                            e["prompt_progress"] = pr.json();
                        }
                        events.push(e);
                    }
                }
                Item::Piece(pc) => {
                    clock.piece(pc);
                    let d = split.push(&pc.text);
                    if !d.reasoning.is_empty() {
                        if reasoning.is_empty() {
                            events.push(json!({"type": "response.output_item.added", "item": {
                                "id": rs_id, "summary": [], "type": "reasoning", "content": [],
                                "encrypted_content": "", "status": "in_progress",
                            }}));
                        }
                        reasoning.push_str(&d.reasoning);
                        events.push(json!({"type": "response.reasoning_text.delta", "delta": d.reasoning, "item_id": rs_id}));
                    }
                    if !d.content.is_empty() {
                        // The message opens with its first text.
                        if text.is_empty() {
                            events.push(json!({"type": "response.output_item.added", "item": {
                                "content": [], "id": msg_id, "role": "assistant", "status": "in_progress", "type": "message",
                            }}));
                            events.push(
                                json!({"type": "response.content_part.added", "item_id": msg_id,
                                "part": {"type": "output_text", "text": ""}}),
                            );
                        }
                        text.push_str(&d.content);
                        let mut e = json!({"type": "response.output_text.delta", "item_id": msg_id, "delta": d.content});
                        if per_token {
                            e["timings"] = clock.gen_timings(n_prompt);
                        }
                        events.push(e);
                    }
                }
                Item::End(end) => {
                    // What was held back (a tag that never closed) comes last.
                    let d = split.finish();
                    for (piece, kind, id) in [
                        (&d.reasoning, "response.reasoning_text.delta", &rs_id),
                        (&d.content, "response.output_text.delta", &msg_id),
                    ] {
                        if !piece.is_empty() {
                            events.push(json!({"type": kind, "delta": piece, "item_id": id}));
                        }
                    }
                    reasoning.push_str(&d.reasoning);
                    text.push_str(&d.content);
                    if !text.is_empty() {
                        events.push(json!({"type": "response.output_text.done", "item_id": msg_id, "text": text}));
                        events.push(json!({"type": "response.content_part.done", "item_id": msg_id, "part": text_part(&text)}));
                    }
                    let output = output_items(&rs_id, &msg_id, &reasoning, &text);
                    for item in &output {
                        events.push(json!({"type": "response.output_item.done", "item": item}));
                    }
                    events.push(json!({
                        "type": "response.completed",
                        "response": {
                            "id": resp_id, "object": "response", "created_at": now(), "status": "completed",
                            "model": model, "output": output, "usage": usage(end),
                        },
                        "timings": timings_json(&end.timings, end.n_cached, end.n_generated),
                    }));
                }
                Item::Error(e) => return gen::data(&json!({"error": e.object()})),
            }
            events.into_iter().map(event).collect()
        },
        None,
    ))
}

pub async fn input_tokens(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let n = super::openai::chat_prompt_len(&s, &body, as_chat).await?;
    Ok(Json(
        json!({"input_tokens": n, "object": "response.input_tokens"}),
    ))
}
