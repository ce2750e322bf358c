//! Running one request on the engine service: waiting for all of it (a JSON reply) or
//! turning its events into server-sent events as they come. The formats (native,
//! OpenAI, Anthropic) only say how a piece of text and the end are written.

use super::error::ApiError;
use crate::engine::service::{EngineService, Finished, Request, RequestEvent, StopReason, Ticket};
use crate::engine::TokenProbs;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use tokio::sync::mpsc;

/// A generated token as a reply shows it.
#[derive(Clone, Debug)]
pub struct Piece {
    /// `None` for the text held back until the end (see [`Finished::tail`]).
    pub token: Option<u32>,
    pub text: String,
    pub probs: Option<Box<TokenProbs>>,
}

/// A whole reply.
#[derive(Debug)]
pub struct Completion {
    pub text: String,
    pub pieces: Vec<Piece>,
    pub end: Box<Finished>,
}

/// Waits for a request's whole reply.
pub async fn complete(service: &EngineService, req: Request) -> Result<Completion, ApiError> {
    let mut t = service.submit(req);
    let mut text = String::new();
    let mut pieces = Vec::new();
    while let Some(ev) = t.events.recv().await {
        match ev {
            RequestEvent::Token {
                token,
                text: s,
                probs,
            } => {
                text.push_str(&s);
                pieces.push(Piece {
                    token: Some(token),
                    text: s,
                    probs,
                });
            }
            RequestEvent::Finished(end) => {
                text.push_str(&end.tail);
                return Ok(Completion { text, pieces, end });
            }
            RequestEvent::Failed(e) => return Err(e.into()),
            _ => {}
        }
    }
    Err(ApiError::server(
        "the engine stopped before the request finished",
    ))
}

/// What a stream needs to know first.
pub struct StreamStart {
    pub ticket: Ticket,
    pub n_prompt: usize,
    pub n_cached: usize,
    pub started: std::time::Instant,
}

/// Submits a request and waits for it to start (so that an error before the first
/// token, such as a prompt too long, is a status code rather than an event).
pub async fn start_stream(service: &EngineService, req: Request) -> Result<StreamStart, ApiError> {
    let mut ticket = service.submit(req);
    loop {
        match ticket.events.recv().await {
            Some(RequestEvent::Started {
                n_prompt, n_cached, ..
            }) => {
                return Ok(StreamStart {
                    ticket,
                    n_prompt,
                    n_cached,
                    started: std::time::Instant::now(),
                })
            }
            Some(RequestEvent::Failed(e)) => return Err(e.into()),
            Some(_) => {}
            None => return Err(ApiError::server("the engine stopped")),
        }
    }
}

/// Prompt progress: `processed` of `total` prompt tokens are in the cache (`cache` of
/// them reused), after `ms` milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub total: usize,
    pub cache: usize,
    pub processed: usize,
    pub ms: f64,
}

impl Progress {
    /// llama-server's `prompt_progress` object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.ms,
        })
    }
}

/// One item of a stream, as a format writes it.
pub enum Item<'a> {
    /// The first comes when the slot starts.
    Progress(Progress),
    Piece(&'a Piece),
    End(&'a Finished),
    Error(&'a ApiError),
}

/// Server-sent events from a started request: `write` turns each item into zero or more
/// events' text (each `data: ...\n\n`), `done` is written after the end. The request is
/// cancelled as soon as the client goes away (the body, and with it the ticket, is
/// dropped).
pub fn sse<F>(start: StreamStart, mut write: F, done: Option<&'static str>) -> Response
where
    F: FnMut(Item<'_>) -> String + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let StreamStart {
        mut ticket,
        n_prompt,
        n_cached,
        started,
    } = start;
    // The first report is the slot's start: no prompt time has passed yet.
    let progress = move |done: usize| {
        Item::Progress(Progress {
            total: n_prompt,
            cache: n_cached,
            processed: n_cached + done,
            ms: if done == 0 {
                0.0
            } else {
                started.elapsed().as_secs_f64() * 1e3
            },
        })
    };
    let first = write(progress(0));
    tokio::spawn(async move {
        if !first.is_empty() && tx.send(Ok(Bytes::from(first))).await.is_err() {
            return;
        }
        loop {
            // A client that leaves is noticed even while nothing is written (text held
            // for a tool call or a stop string, a prompt whose progress is not sent):
            // dropping the ticket cancels the request.
            let ev = tokio::select! {
                ev = ticket.events.recv() => ev,
                _ = tx.closed() => return,
            };
            let Some(ev) = ev else { return };
            let out = match ev {
                RequestEvent::Progress { done, .. } => write(progress(done)),
                RequestEvent::Token { token, text, probs } => write(Item::Piece(&Piece {
                    token: Some(token),
                    text,
                    probs,
                })),
                RequestEvent::Finished(end) => {
                    let mut s = String::new();
                    if !end.tail.is_empty() {
                        s.push_str(&write(Item::Piece(&Piece {
                            token: None,
                            text: end.tail.clone(),
                            probs: None,
                        })));
                    }
                    s.push_str(&write(Item::End(&end)));
                    if let Some(d) = done {
                        s.push_str(d);
                    }
                    let _ = tx.send(Ok(Bytes::from(s))).await;
                    return;
                }
                RequestEvent::Failed(e) => {
                    let e: ApiError = e.into();
                    let _ = tx.send(Ok(Bytes::from(write(Item::Error(&e))))).await;
                    return;
                }
                _ => continue,
            };
            if !out.is_empty() && tx.send(Ok(Bytes::from(out))).await.is_err() {
                // The client is gone: dropping the ticket cancels the request.
                return;
            }
        }
    });
    sse_response(rx)
}

/// A `text/event-stream` reply whose body is what comes through `rx`.
pub fn sse_response(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("X-Accel-Buffering", "no")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap()
}

/// `event: NAME\ndata: JSON\n\n` (Anthropic's and the Responses API's streams).
pub fn event(name: &str, v: &serde_json::Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// `data: JSON\n\n`.
pub fn data(v: &serde_json::Value) -> String {
    format!("data: {v}\n\n")
}

/// llama-server's `stop_type`.
pub fn stop_type(s: &StopReason) -> &'static str {
    match s {
        StopReason::Eos => "eos",
        StopReason::Limit | StopReason::ContextFull(_) => "limit",
        StopReason::Word(_) => "word",
        StopReason::Cancelled => "none",
    }
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(s: &StopReason) -> &'static str {
    match s {
        StopReason::Limit | StopReason::ContextFull(_) => "length",
        _ => "stop",
    }
}
