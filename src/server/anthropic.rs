//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) as llama-server
//! serves it: the request is read as a chat completion (its `system` first, content
//! blocks of text, `tool_use` blocks as the assistant's calls, `tool_result` blocks as
//! tool messages after the rest of their message, `tools` and `tool_choice`,
//! `stop_sequences`), the reply written as a message with text and `tool_use` blocks.

use super::chat::ChatRequest;
use super::error::{ApiError, ApiResult};
use super::gen::{self, Item};
use super::params::{self, Fields};
use super::tools::Reply;
use super::wire::{body_json, reply_id};
use super::AppState;
use crate::engine::service::{Finished, StopReason};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// The request as a chat completion body: the system prompt as the first message and
/// text blocks joined.
pub(super) fn as_chat(body: &Value) -> ApiResult<Value> {
    let f = Fields::of(body)?;
    let mut messages = Vec::new();
    if let Some(sys) = f.value("system") {
        let text = match sys {
            Value::String(s) => s.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            _ => {
                return Err(ApiError::invalid(
                    "\"system\" must be a string or text blocks",
                ))
            }
        };
        messages.push(json!({"role": "system", "content": text}));
    }
    match f.value("messages") {
        Some(Value::Array(m)) => {
            for msg in m {
                if msg.get("role").and_then(Value::as_str).is_none() {
                    return Err(ApiError::invalid("Missing 'role' in message"));
                }
                messages.extend(message(msg));
            }
        }
        // llama-server answers this one as a server error.
        None => return Err(ApiError::server("'messages' is required")),
        Some(_) => return Err(ApiError::invalid("Expected 'messages' to be an array")),
    }
    let mut chat = body.clone();
    chat["messages"] = Value::Array(messages);
    // Extended thinking's budget is the thinking budget (10000 tokens unless given).
    let thinking = f.value("thinking");
    if thinking.and_then(|t| t.get("type")).and_then(Value::as_str) == Some("enabled") {
        let n = (thinking.and_then(|t| t.get("budget_tokens")))
            .and_then(Value::as_i64)
            .unwrap_or(10000);
        chat["thinking_budget_tokens"] = json!(n);
    }
    if let Some(s) = f.value("stop_sequences") {
        chat["stop"] = s.clone();
    }
    if let Some(Value::Array(tools)) = f.value("tools") {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or(json!("")),
                    "parameters": t.get("input_schema").cloned().unwrap_or(json!({})),
                }})
            })
            .collect();
        chat["tools"] = Value::Array(tools);
    }
    if let Some(tc) = f.value("tool_choice") {
        chat["tool_choice"] = match tc.get("type").and_then(Value::as_str) {
            Some("auto") | None => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": tc.get("name")}}),
            Some(t) => {
                return Err(ApiError::invalid(format!(
                    "tool_choice type must be auto, any, tool or none, got {t:?}"
                )))
            }
        };
    }
    if let Some(obj) = chat.as_object_mut() {
        obj.remove("system");
        obj.remove("stop_sequences");
    }
    Ok(chat)
}

/// One Anthropic message as OpenAI messages: its text and image blocks (images as
/// `image_url` parts, which text-only models refuse), its `tool_use` blocks as
/// `tool_calls`, then each `tool_result` block as a tool message.
fn message(msg: &Value) -> Vec<Value> {
    let role = msg.get("role").and_then(Value::as_str).unwrap_or("");
    let Some(Value::Array(blocks)) = msg.get("content") else {
        // Text content, or none (an assistant message without content is dropped).
        return if msg.get("content").is_none() && role == "assistant" {
            Vec::new()
        } else {
            vec![msg.clone()]
        };
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut reasoning = String::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(b.clone()),
            Some("image") => parts.push(image_part(b)),
            Some("tool_use") => calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(json!("")),
                "type": "function",
                "function": {
                    "name": b.get("name").cloned().unwrap_or(json!("")),
                    "arguments": b.get("input").cloned().unwrap_or(json!({})).to_string(),
                },
            })),
            Some("tool_result") => {
                let content = match b.get("content") {
                    Some(Value::String(s)) => json!(s),
                    Some(Value::Array(items)) => {
                        let mut text = String::new();
                        let mut parts = Vec::new();
                        for c in items {
                            match c.get("type").and_then(Value::as_str) {
                                Some("text") => {
                                    let t = c.get("text").and_then(Value::as_str).unwrap_or("");
                                    text.push_str(t);
                                    parts.push(json!({"type": "text", "text": t}));
                                }
                                Some("image") => parts.push(image_part(c)),
                                _ => {}
                            }
                        }
                        if parts.iter().any(|p| p["type"] == "image_url") {
                            Value::Array(parts)
                        } else {
                            json!(text)
                        }
                    }
                    _ => json!(""),
                };
                results.push(json!({
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(json!("")),
                    "content": content,
                }));
            }
            // Earlier turns' thinking, for templates that render `reasoning_content`.
            Some("thinking") => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""));
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if !parts.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut m = json!({"role": role, "content": if parts.is_empty() { json!("") } else { Value::Array(parts) }});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        if !reasoning.is_empty() {
            m["reasoning_content"] = json!(reasoning);
        }
        out.push(m);
    }
    out.extend(results);
    out
}

/// An Anthropic image block as an OpenAI `image_url` part.
fn image_part(b: &Value) -> Value {
    let src = b.get("source").cloned().unwrap_or(json!({}));
    let url = match src.get("type").and_then(Value::as_str) {
        Some("url") => src
            .get("url")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => format!(
            "data:{};base64,{}",
            src.get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/jpeg"),
            src.get("data").and_then(Value::as_str).unwrap_or("")
        ),
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

fn stop_reason(end: &Finished) -> (&'static str, Value) {
    match &end.stop {
        StopReason::Word(w) => ("stop_sequence", json!(w)),
        StopReason::Limit | StopReason::ContextFull(_) => ("max_tokens", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

fn event(name: &str, v: Value) -> String {
    gen::event(name, &v)
}

pub async fn messages(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    let service = s.service()?;
    let body = super::off_runtime(|| as_chat(&body_json(&body)?)).await?;
    let tok = service.tokenizer();
    let p = super::off_runtime(|| params::gen_params(&body, &s.opts.defaults, tok)).await?;
    let input = s.image_input(service);
    let (chat, req) = super::off_runtime(|| {
        ChatRequest::request(&body, &p.request, tok, &input, &s.opts.defaults.reasoning)
    })
    .await?;
    let n_prompt = req.prompt.len();
    let model = s.model_name();
    let id = reply_id("msg-");
    if p.stream {
        let start = gen::start_stream(service, req).await?;
        let mut first = true;
        let mut n_out = 0usize;
        // Thinking (block 0 when there is any) and text are streamed as they are split
        // out; with tools the text is one JSON object, read back whole at the end.
        let mut split = chat.splitter();
        let hold = chat.tools.is_some();
        let mut blocks = StreamBlocks::default();
        return Ok(gen::sse(
            start,
            move |item| {
                let mut out = String::new();
                if std::mem::take(&mut first) {
                    out.push_str(&event("message_start", json!({
                        "type": "message_start",
                        "message": {
                            "id": id, "type": "message", "role": "assistant", "content": [],
                            "model": model, "stop_reason": Value::Null, "stop_sequence": Value::Null,
                            "usage": {"cache_read_input_tokens": 0, "input_tokens": n_prompt, "output_tokens": 0},
                        },
                    })));
                }
                match item {
                    Item::Progress(_) => {}
                    Item::Piece(pc) => {
                        if pc.token.is_some() {
                            n_out += 1;
                        }
                        let d = split.push(&pc.text);
                        out.push_str(&blocks.add(&d.reasoning, if hold { "" } else { &d.content }));
                    }
                    Item::End(end) => {
                        let (mut reason, seq) = stop_reason(end);
                        let d = split.finish();
                        out.push_str(&blocks.add(&d.reasoning, if hold { "" } else { &d.content }));
                        out.push_str(&blocks.close_thinking());
                        if hold {
                            let mut r = chat.reply(split.text());
                            r.reasoning.clear();
                            let list = content_blocks(&r);
                            if list.iter().any(|b| b["type"] == "tool_use") {
                                reason = "tool_use";
                            }
                            for (i, b) in list.into_iter().enumerate() {
                                out.push_str(&block_events(blocks.next + i, b));
                            }
                        } else {
                            out.push_str(&blocks.close_text());
                        }
                        out.push_str(&event(
                            "message_delta",
                            json!({
                                "type": "message_delta",
                                "delta": {"stop_reason": reason, "stop_sequence": seq},
                                "usage": {"output_tokens": end.n_generated.max(n_out)},
                            }),
                        ));
                        out.push_str(&event("message_stop", json!({"type": "message_stop"})));
                    }
                    Item::Error(e) => out.push_str(&event(
                        "error",
                        json!({
                            "type": "error",
                            "error": {"type": e.kind, "message": e.message},
                        }),
                    )),
                }
                out
            },
            None,
        ));
    }
    let c = gen::complete(service, req).await?;
    let (mut reason, seq) = stop_reason(&c.end);
    let blocks = content_blocks(&chat.reply(&c.text));
    if blocks.iter().any(|b| b["type"] == "tool_use") {
        reason = "tool_use";
    }
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": blocks,
        "model": model,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": {
            "cache_read_input_tokens": c.end.n_cached,
            "input_tokens": c.end.n_prompt - c.end.n_cached,
            "output_tokens": c.end.n_generated,
        },
    }))
    .into_response())
}

/// The blocks of a streamed reply as they open: thinking first, then text.
#[derive(Default)]
struct StreamBlocks {
    thinking: Option<usize>,
    text: Option<usize>,
    /// The index the next block opens at.
    next: usize,
}

impl StreamBlocks {
    /// The events for what a piece added to the thinking and to the text.
    fn add(&mut self, reasoning: &str, text: &str) -> String {
        let mut out = String::new();
        if !reasoning.is_empty() {
            let index = *self.thinking.get_or_insert_with(|| {
                self.next += 1;
                out.push_str(&event(
                    "content_block_start",
                    json!({
                        "type": "content_block_start", "index": self.next - 1,
                        "content_block": {"type": "thinking", "thinking": ""},
                    }),
                ));
                self.next - 1
            });
            out.push_str(&event(
                "content_block_delta",
                json!({
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "thinking_delta", "thinking": reasoning},
                }),
            ));
        }
        if !text.is_empty() {
            let index = self.open_text(&mut out);
            out.push_str(&event(
                "content_block_delta",
                json!({
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": text},
                }),
            ));
        }
        out
    }

    fn open_text(&mut self, out: &mut String) -> usize {
        *self.text.get_or_insert_with(|| {
            self.next += 1;
            out.push_str(&text_start(self.next - 1));
            self.next - 1
        })
    }

    /// A thinking block ends with its (empty: nothing signs a local model's thinking)
    /// signature.
    fn close_thinking(&mut self) -> String {
        let Some(index) = self.thinking else {
            return String::new();
        };
        let mut out = event(
            "content_block_delta",
            json!({
                "type": "content_block_delta", "index": index,
                "delta": {"type": "signature_delta", "signature": ""},
            }),
        );
        out.push_str(&event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        out
    }

    /// The text block's end (an empty block where the reply had no text).
    fn close_text(&mut self) -> String {
        let mut out = String::new();
        let index = self.open_text(&mut out);
        out.push_str(&event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        out
    }
}

/// A reply's content blocks: its thinking, its text (also when empty and there are no
/// calls), then a `tool_use` block per call.
fn content_blocks(r: &Reply) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !r.reasoning.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": r.reasoning, "signature": ""}));
    }
    if !r.content.is_empty() || r.calls.is_empty() {
        blocks.push(json!({"type": "text", "text": r.content}));
    }
    for c in &r.calls {
        blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}));
    }
    blocks
}

fn text_start(index: usize) -> String {
    event(
        "content_block_start",
        json!({
            "type": "content_block_start", "index": index,
            "content_block": {"type": "text", "text": ""},
        }),
    )
}

/// A whole content block as stream events: its start, its content as one delta (the
/// arguments of a call as `input_json_delta`), its stop.
fn block_events(index: usize, b: Value) -> String {
    let (start, delta) = if b["type"] == "tool_use" {
        let args = b["input"].to_string();
        let mut start = b.clone();
        start["input"] = json!({});
        (
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": start}),
            ),
            json!({"type": "input_json_delta", "partial_json": args}),
        )
    } else {
        (
            text_start(index),
            json!({"type": "text_delta", "text": b["text"]}),
        )
    };
    let mut out = start;
    out.push_str(&event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": delta}),
    ));
    out.push_str(&event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    ));
    out
}

pub async fn count_tokens(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let n = super::openai::chat_prompt_len(&s, &body, as_chat).await?;
    Ok(Json(json!({ "input_tokens": n })))
}
