//! Resumable streams, as llama-server serves them: a streamed generation whose request
//! carries `X-Conversation-Id` is also written, byte for byte, into a buffer kept under
//! that id, and runs on when its client goes away (a page reloaded, a laptop asleep).
//! `GET /v1/stream?conv_id=ID&from=N` replays the buffer from byte N and follows it live
//! until the generation ends; `DELETE /v1/stream?conv_id=ID` is the user's Stop (the
//! generation is cancelled, the buffer dropped); `POST /v1/streams/lookup` tells a client
//! which of the ids it names have a buffer. One id holds at most one stream: a new
//! request under the same id cancels the one before.
//!
//! The tee is a layer over the generation routes, so the formats (native, OpenAI,
//! Anthropic, Responses) know nothing of it. Like llama-server, a buffer keeps its last
//! 4 MiB and is forgotten 5 minutes after its generation ends. Unlike it, at most
//! [`MAX_STREAMS`] are kept (the oldest finished one makes room; with every one still
//! running a new one is refused), so the buffers together hold a bounded amount.

use super::error::ApiError;
use super::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;

/// The bytes a buffer keeps (its oldest are dropped beyond this).
const MAX_BYTES: usize = 4 << 20;
/// Streams kept at once: with [`MAX_BYTES`] each, at most 256 MiB in all.
pub const MAX_STREAMS: usize = 64;
/// The longest conversation id taken.
const MAX_ID_BYTES: usize = 256;
/// How long a finished stream stays replayable.
const TTL: Duration = Duration::from_secs(300);
/// The routes whose streamed replies are kept.
const GENERATION_PATHS: &[&str] = &[
    "/completion",
    "/completions",
    "/v1/completions",
    "/chat/completions",
    "/v1/chat/completions",
    "/responses",
    "/v1/responses",
    "/v1/messages",
    "/infill",
];

/// Every live stream, by conversation id.
#[derive(Default)]
pub struct StreamStore {
    streams: Mutex<HashMap<String, Arc<Stream>>>,
}

/// One generation's bytes as its client was sent them.
struct Stream {
    id: String,
    started_unix: u64,
    buf: Mutex<Buffer>,
    /// Bumped on every append and at the end: what readers wait on.
    changed: watch::Sender<()>,
    /// True once the stream is cancelled (the producer stops on it); a cancel also
    /// ends the stream, so readers only look at the end.
    cancel: watch::Sender<bool>,
}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    /// Bytes dropped from the front to stay under [`MAX_BYTES`].
    dropped: usize,
    /// When the generation ended: (for the TTL, for `completed_at`).
    ended: Option<(Instant, u64)>,
}

/// What a reader at some offset finds.
enum Read {
    Bytes(Bytes),
    /// Nothing new; the generation goes on.
    Wait,
    End,
    /// The offset was dropped from the front.
    Lost,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Stream {
    fn new(id: &str) -> Stream {
        Stream {
            id: id.to_string(),
            started_unix: unix_now(),
            buf: Mutex::new(Buffer::default()),
            changed: watch::channel(()).0,
            cancel: watch::channel(false).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buf.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn append(&self, data: &[u8]) {
        {
            let mut b = self.lock();
            if b.ended.is_some() {
                return;
            }
            b.bytes.extend_from_slice(data);
            if b.bytes.len() > MAX_BYTES {
                let over = b.bytes.len() - MAX_BYTES;
                b.bytes.drain(..over);
                b.dropped += over;
            }
        }
        self.changed.send_replace(());
    }

    fn finish(&self) {
        {
            let mut b = self.lock();
            if b.ended.is_some() {
                return;
            }
            b.ended = Some((Instant::now(), unix_now()));
        }
        self.changed.send_replace(());
    }

    fn cancel(&self) {
        self.cancel.send_replace(true);
        self.finish();
    }

    fn read(&self, offset: usize) -> Read {
        let b = self.lock();
        if offset < b.dropped {
            return Read::Lost;
        }
        let end = b.dropped + b.bytes.len();
        if offset < end {
            return Read::Bytes(Bytes::copy_from_slice(&b.bytes[offset - b.dropped..]));
        }
        if b.ended.is_some() {
            Read::End
        } else {
            Read::Wait
        }
    }

    fn expired(&self, now: Instant) -> bool {
        self.lock()
            .ended
            .is_some_and(|(at, _)| now.duration_since(at) >= TTL)
    }

    fn summary(&self) -> Value {
        let b = self.lock();
        json!({
            "conversation_id": self.id,
            "is_done": b.ended.is_some(),
            "total_bytes": b.dropped + b.bytes.len(),
            "started_at": self.started_unix,
            "completed_at": b.ended.map_or(0, |(_, unix)| unix),
        })
    }
}

impl StreamStore {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        let mut m = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        m.retain(|_, s| !s.expired(now));
        m
    }

    /// A fresh stream under `id`; the one it replaces is cancelled. With
    /// [`MAX_STREAMS`] kept, the one that finished first is dropped to make room; with
    /// none finished, the new one is refused.
    fn start(&self, id: &str) -> Result<Arc<Stream>, ApiError> {
        if id.len() > MAX_ID_BYTES {
            return Err(ApiError::invalid(format!(
                "X-Conversation-Id is {} bytes long; at most {MAX_ID_BYTES} are taken",
                id.len()
            )));
        }
        let mut m = self.map();
        if !m.contains_key(id) && m.len() >= MAX_STREAMS {
            let oldest = (m.iter())
                .filter_map(|(k, st)| st.lock().ended.map(|(at, _)| (at, k.clone())))
                .min();
            match oldest {
                Some((_, k)) => {
                    m.remove(&k);
                }
                None => {
                    return Err(ApiError::with_status(
                        axum::http::StatusCode::TOO_MANY_REQUESTS,
                        format!("{MAX_STREAMS} resumable streams are running (requests with X-Conversation-Id); send this one without the header, or when one has finished"),
                    ))
                }
            }
        }
        let s = Arc::new(Stream::new(id));
        if let Some(old) = m.insert(id.to_string(), s.clone()) {
            old.cancel();
        }
        Ok(s)
    }

    fn get(&self, id: &str) -> Option<Arc<Stream>> {
        self.map().get(id).cloned()
    }

    /// Drops `s` if it is still the stream under its id.
    fn forget(&self, s: &Arc<Stream>) {
        let mut m = self.map();
        if m.get(&s.id).is_some_and(|cur| Arc::ptr_eq(cur, s)) {
            m.remove(&s.id);
        }
    }

    fn cancel(&self, id: &str) -> bool {
        let s = self.map().remove(id);
        if let Some(s) = &s {
            s.cancel();
        }
        s.is_some()
    }
}

/// The `X-Conversation-Id` header's value, if set and not empty.
pub(super) fn conversation_id(h: &HeaderMap) -> Option<String> {
    let v = h.get("x-conversation-id")?.to_str().ok()?;
    (!v.is_empty()).then(|| v.to_string())
}

/// The layer over the generation routes: a streamed reply to a request with a
/// conversation id is copied into its stream and outlives its client.
pub async fn tee(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let id = (req.method() == Method::POST && GENERATION_PATHS.contains(&req.uri().path()))
        .then(|| conversation_id(req.headers()))
        .flatten();
    let Some(id) = id else {
        return next.run(req).await;
    };
    let stream = match s.streams.start(&id) {
        Ok(st) => st,
        Err(e) => return e.into_response(),
    };
    // A client that leaves before its reply starts drops this future: the stream it
    // made must not stay behind as one that runs forever.
    let unclaimed = Unclaimed {
        store: &s.streams,
        stream: Some(stream.clone()),
    };
    let resp = next.run(req).await;
    let stream = unclaimed.claim();
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        // An error, or a reply that was not streamed: nothing to resume.
        s.streams.forget(&stream);
        stream.finish();
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(pump(body, stream, tx));
    Response::from_parts(
        parts,
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
}

/// A stream made for a request whose reply has not come back yet: dropped unclaimed (the
/// request's future dropped), it is finished and forgotten.
struct Unclaimed<'a> {
    store: &'a StreamStore,
    stream: Option<Arc<Stream>>,
}

impl Unclaimed<'_> {
    fn claim(mut self) -> Arc<Stream> {
        self.stream.take().expect("claimed once")
    }
}

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        if let Some(st) = self.stream.take() {
            self.store.forget(&st);
            st.finish();
        }
    }
}

/// Reads the generation's reply to its end (or to a cancel), into the stream and, while
/// it is there, to the client. Dropping the reply's body cancels the generation.
async fn pump(body: Body, stream: Arc<Stream>, tx: mpsc::Sender<Result<Bytes, axum::Error>>) {
    let mut data = body.into_data_stream();
    let mut cancel = stream.cancel.subscribe();
    let mut client = Some(tx);
    loop {
        let chunk = tokio::select! {
            c = data.next() => c,
            _ = cancel.wait_for(|c| *c) => break,
        };
        let bytes = match chunk {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                log::debug!("stream {}: the reply failed: {e}", stream.id);
                break;
            }
            None => break,
        };
        stream.append(&bytes);
        if let Some(t) = &client {
            let sent = tokio::select! {
                r = t.send(Ok(bytes)) => r.is_ok(),
                _ = cancel.wait_for(|c| *c) => break,
            };
            if !sent {
                log::debug!(
                    "stream {}: the client went away; the generation goes on",
                    stream.id
                );
                client = None;
            }
        }
    }
    stream.finish();
}

/// `conv_id` from the query, or the error llama-server gives without it.
fn query_id(q: &HashMap<String, String>) -> Result<&str, ApiError> {
    q.get("conv_id")
        .map(String::as_str)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| ApiError::invalid("Missing conversation id in path"))
}

/// `GET /v1/stream?conv_id=ID&from=N`: the stream's bytes from offset N, then live ones
/// until its generation ends.
pub async fn replay(
    State(s): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    s.service()?;
    let id = query_id(&q)?;
    let stream = s
        .streams
        .get(id)
        .ok_or_else(|| ApiError::not_found("Stream not found or expired"))?;
    let mut offset: usize = match q.get("from").filter(|f| !f.is_empty()) {
        None => 0,
        Some(f) => f
            .parse()
            .map_err(|_| ApiError::invalid("Invalid 'from' offset"))?,
    };
    if let Read::Lost = stream.read(offset) {
        return Err(ApiError::invalid("Stream offset lost, please restart"));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let mut changed = stream.changed.subscribe();
    tokio::spawn(async move {
        loop {
            changed.borrow_and_update();
            match stream.read(offset) {
                Read::Bytes(b) => {
                    offset += b.len();
                    if tx.send(Ok(b)).await.is_err() {
                        return;
                    }
                }
                Read::Wait => {
                    if changed.changed().await.is_err() {
                        return;
                    }
                }
                Read::End | Read::Lost => return,
            }
        }
    });
    Ok(super::gen::sse_response(rx))
}

/// `DELETE /v1/stream?conv_id=ID`: stops the generation and drops its stream; 204 whether
/// or not there was one.
pub async fn stop(
    State(s): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<StatusCode, ApiError> {
    let id = query_id(&q)?;
    if !s.streams.cancel(id) {
        log::debug!("stop for stream {id}, which is not (or no longer) kept");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/streams/lookup {"conversation_ids": [...]}`: the streams of the ids named
/// (each id matches itself and `ID::MODEL`); a client cannot list ids it does not know.
pub async fn lookup(State(s): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let v = super::off_runtime(|| super::wire::body_json(&body)).await?;
    // Each id once: a list of one id repeated would copy its summaries as often.
    let wanted: std::collections::BTreeSet<&str> =
        (v.get("conversation_ids").and_then(Value::as_array))
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
    if wanted.len() > MAX_STREAMS * 16 {
        return Err(ApiError::invalid(format!(
            "{} conversation ids: at most {} are looked up at once",
            wanted.len(),
            MAX_STREAMS * 16
        )));
    }
    let found: Vec<Value> = {
        let m = s.streams.map();
        wanted
            .iter()
            .flat_map(|w| {
                let prefix = format!("{w}::");
                m.values()
                    .filter(move |st| st.id == *w || st.id.starts_with(&prefix))
                    .map(|st| st.summary())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    Ok(Json(Value::Array(found)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_keeps_its_tail_and_reports_lost_offsets() {
        let s = Stream::new("c");
        s.append(&vec![b'a'; MAX_BYTES - 2]);
        s.append(b"bcde");
        assert!(matches!(s.read(0), Read::Lost));
        assert!(matches!(s.read(1), Read::Lost));
        match s.read(MAX_BYTES - 2) {
            Read::Bytes(b) => assert_eq!(&b[..], b"bcde"),
            _ => panic!("the newest bytes are kept"),
        }
        assert!(matches!(s.read(MAX_BYTES + 2), Read::Wait));
        s.finish();
        assert!(matches!(s.read(MAX_BYTES + 2), Read::End));
        s.append(b"late");
        assert!(matches!(s.read(MAX_BYTES + 2), Read::End));
    }

    #[test]
    fn a_new_stream_under_an_id_cancels_the_old() {
        let store = StreamStore::default();
        let a = store.start("x").unwrap();
        let b = store.start("x").unwrap();
        assert!(*a.cancel.borrow());
        assert!(!*b.cancel.borrow());
        store.forget(&a);
        assert!(store.get("x").is_some_and(|s| Arc::ptr_eq(&s, &b)));
        assert!(store.cancel("x"));
        assert!(store.get("x").is_none());
        assert!(!store.cancel("x"));
    }

    /// At most MAX_STREAMS are kept: the one that finished first makes room for a new
    /// id; with all of them running, a new id is refused (429) and an old id still
    /// replaces its own stream; over-long ids are refused.
    #[test]
    fn streams_are_capped_in_count() {
        let store = StreamStore::default();
        let all: Vec<_> = (0..MAX_STREAMS)
            .map(|i| store.start(&format!("c{i}")).unwrap())
            .collect();
        let Err(e) = store.start("one-more") else {
            panic!("a 65th running stream was kept");
        };
        assert_eq!(e.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert!(
            store.start("c3").is_ok(),
            "an id kept replaces its own stream"
        );
        all[7].finish();
        std::thread::sleep(Duration::from_millis(2));
        all[5].finish();
        assert!(store.start("one-more").is_ok());
        assert!(store.get("c7").is_none(), "the first to finish made room");
        assert!(store.get("c5").is_some());
        assert_eq!(store.map().len(), MAX_STREAMS);
        assert!(store.start(&"x".repeat(MAX_ID_BYTES + 1)).is_err());
        drop(all);
    }
}
