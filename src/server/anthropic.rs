//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) as llama-server
//! serves it: the request is read as a chat completion (its `system` first, content
//! blocks of text, `stop_sequences`), the reply written as a message with text blocks.

use super::error::{ApiError, ApiResult};
use super::gen::{self, Item};
use super::native::body_json;
use super::openai::{chat_prompt, reply_id};
use super::params::{self, Fields};
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
fn as_chat(body: &Value) -> ApiResult<Value> {
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
        Some(Value::Array(m)) => messages.extend(m.iter().cloned()),
        // llama-server answers this one as a server error.
        None => return Err(ApiError::server("'messages' is required")),
        Some(_) => return Err(ApiError::invalid("Expected 'messages' to be an array")),
    }
    let mut chat = body.clone();
    chat["messages"] = Value::Array(messages);
    if let Some(s) = f.value("stop_sequences") {
        chat["stop"] = s.clone();
    }
    if let Some(obj) = chat.as_object_mut() {
        obj.remove("system");
        obj.remove("stop_sequences");
    }
    Ok(chat)
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
    let body = as_chat(&body_json(&body)?)?;
    let tok = service.tokenizer();
    let p = params::gen_params(&body, &s.opts.defaults, tok)?;
    let mut req = p.request.clone();
    req.prompt = chat_prompt(&body, tok)?;
    let n_prompt = req.prompt.len();
    let model = s.model_name();
    let id = reply_id("msg-");
    if p.stream {
        let start = gen::start_stream(service, req).await?;
        let mut first = true;
        let mut n_out = 0usize;
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
                    out.push_str(&event(
                        "content_block_start",
                        json!({
                            "type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""},
                        }),
                    ));
                }
                match item {
                    Item::Progress(_) => {}
                    Item::Piece(pc) => {
                        if pc.token.is_some() {
                            n_out += 1;
                        }
                        if !pc.text.is_empty() {
                            out.push_str(&event(
                                "content_block_delta",
                                json!({
                                    "type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": pc.text},
                                }),
                            ));
                        }
                    }
                    Item::End(end) => {
                        let (reason, seq) = stop_reason(end);
                        out.push_str(&event(
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": 0}),
                        ));
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
    let (reason, seq) = stop_reason(&c.end);
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": c.text}],
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

pub async fn count_tokens(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let service = s.service()?;
    let body = as_chat(&body_json(&body)?)?;
    let n = chat_prompt(&body, service.tokenizer())?.len();
    Ok(Json(json!({ "input_tokens": n })))
}
