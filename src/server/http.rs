//! What every request passes through: the routes, the API key (compared in constant
//! time; `/health` and the model list are public, as in llama-server), CORS, the body
//! read whole within the size limit and the timeout, and JSON errors for everything
//! refused, whichever layer refuses it.

use super::error::ApiError;
use super::{
    agent, anthropic, cors_proxy, embeddings, gcp, infill, metrics, native, openai, rerank,
    responses, resumable, AppState,
};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use std::sync::Arc;

/// Every route, in the order llama-server registers them where it matters (the first
/// path of a GCP `@requestFormat` alias wins).
fn routes() -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
    vec![
        ("/health", get(native::health)),
        ("/v1/health", get(native::health)),
        ("/metrics", get(metrics::metrics)),
        ("/props", get(native::props).post(native::set_props)),
        ("/models", get(openai::models)),
        ("/v1/models", get(openai::models)),
        ("/completion", post(native::completion)),
        ("/completions", post(native::completion)),
        ("/v1/completions", post(openai::completions)),
        ("/chat/completions", post(openai::chat_completions)),
        ("/v1/chat/completions", post(openai::chat_completions)),
        (
            "/chat/completions/input_tokens",
            post(openai::chat_input_tokens),
        ),
        (
            "/v1/chat/completions/input_tokens",
            post(openai::chat_input_tokens),
        ),
        ("/responses", post(responses::responses)),
        ("/v1/responses", post(responses::responses)),
        ("/responses/input_tokens", post(responses::input_tokens)),
        ("/v1/responses/input_tokens", post(responses::input_tokens)),
        ("/v1/messages", post(anthropic::messages)),
        ("/v1/messages/count_tokens", post(anthropic::count_tokens)),
        ("/tokenize", post(native::tokenize)),
        ("/detokenize", post(native::detokenize)),
        ("/apply-template", post(native::apply_template)),
        ("/slots", get(native::slots)),
        ("/slots/{id}", post(native::slot_action)),
        (
            "/lora-adapters",
            get(native::lora_adapters).post(native::set_lora_adapters),
        ),
        ("/embedding", post(embeddings::native)),
        ("/embeddings", post(embeddings::native)),
        ("/v1/embeddings", post(embeddings::openai)),
        ("/rerank", post(rerank::rerank)),
        ("/reranking", post(rerank::rerank)),
        ("/v1/rerank", post(rerank::rerank)),
        ("/v1/reranking", post(rerank::rerank)),
        ("/infill", post(infill::infill)),
        ("/v1/systemone", post(native::systemone)),
        ("/v1/stream", get(resumable::replay).delete(resumable::stop)),
        ("/v1/streams/lookup", post(resumable::lookup)),
        (
            "/cors-proxy",
            get(cors_proxy::proxy).post(cors_proxy::proxy),
        ),
        ("/tools", get(agent::list).post(agent::call)),
    ]
}

/// The paths the server answers (before any GCP route).
pub fn route_paths() -> Vec<&'static str> {
    routes().into_iter().map(|(p, _)| p).collect()
}

/// The server's routes with what every request passes through; with Vertex AI's
/// prediction protocol on (`AIP_MODE=PREDICTION`), also its predict route, which
/// answers each instance through the others (see [`gcp`]).
pub fn router(state: Arc<AppState>) -> Router {
    let table = routes();
    let mut r = Router::new();
    for (path, m) in &table {
        r = r.route(path, m.clone());
    }
    if let Some(g) = &state.opts.gcp {
        let paths: Vec<&str> = table.iter().map(|(p, _)| *p).collect();
        let inner = Arc::new(gcp::Predictor::new(
            &paths,
            layered(r.clone(), state.clone()),
        ));
        r = r.route(
            &g.predict_route,
            post(move |req: Request| gcp::predict(inner.clone(), req)),
        );
        if let Some(h) = &g.health_route {
            r = r.route(h, get(native::health));
        }
    }
    layered(r, state)
}

/// A router's front: the API key, CORS and the body read within its limits, before any
/// model's routes (which check no key of their own).
pub(super) fn front_layers(routes: Router, state: Arc<AppState>) -> Router {
    let max_body = state.opts.max_body;
    routes
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            body_and_errors,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), api_key))
        .layer(middleware::from_fn_with_state(state, cors))
}

fn layered(routes: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    let max_body = state.opts.max_body;
    routes
        .fallback(unknown)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            body_and_errors,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), wake))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            resumable::tee,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), api_key))
        .layer(middleware::from_fn_with_state(state.clone(), cors))
        .with_state(state)
}

async fn unknown(req: Request) -> ApiError {
    ApiError::not_found(format!("File Not Found: {}", req.uri().path()))
}

async fn wrong_method(req: Request) -> ApiError {
    ApiError::with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} does not take {} requests",
            req.uri().path(),
            req.method()
        ),
    )
}

/// Refuses every request with a 503 once the server is shutting down. Reads the
/// request's body whole before any handler runs, taking its room among the bodies held
/// as its bytes arrive (see `AppState::bodies`; a 503 where there is none; the room is
/// held until the handler has answered): a body over the limit gets a
/// 413 once the limit is read (answering before the body is sent would leave a client
/// that is still writing it with a broken pipe instead of the answer), one that does not
/// arrive within the server's timeout (`-to`) a 408, so a slow client holds its
/// connection for a bounded time. Then any refusal below that is not already a JSON error (axum's extractors answer
/// in plain text) is rewritten as one, with its status.
async fn body_and_errors(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if s.stopping() {
        return ApiError::unavailable("the server is shutting down").into_response();
    }
    let max = s.opts.max_body;
    let too_large = || {
        ApiError::with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than this server takes: at most {max} bytes (--max-body-mib)"
            ),
        )
        .into_response()
    };
    let (parts, body) = req.into_parts();
    let timeout = std::time::Duration::from_secs(s.opts.timeout_s.max(1));
    // The body's room in memory, taken as its bytes arrive (a client that declares a
    // size and sends nothing holds none) and never waited for: where there is none, a
    // 503 at once (waiting for room part way could wait on others doing the same).
    enum Refused {
        TooLarge,
        NoRoom,
        Read(String),
    }
    let mut room: Option<tokio::sync::SemaphorePermit<'_>> = None;
    let read = async {
        use tokio_stream::StreamExt;
        let mut stream = body.into_data_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Refused::Read(e.to_string()))?;
            if buf.len() + chunk.len() > max {
                return Err(Refused::TooLarge);
            }
            let held = room.as_ref().map_or(0, |p| p.num_permits());
            let need = (buf.len() + chunk.len())
                .div_ceil(1024)
                .saturating_sub(held);
            if need > 0 {
                let more = s
                    .bodies
                    .try_acquire_many(need as u32)
                    .map_err(|_| Refused::NoRoom)?;
                match room.as_mut() {
                    Some(r) => r.merge(more),
                    None => room = Some(more),
                }
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    let bytes = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(Refused::TooLarge)) => return too_large(),
        Ok(Err(Refused::NoRoom)) => {
            return ApiError::unavailable(format!(
                "the server holds as many request bodies as it takes at once ({} of up to {} MiB); try again shortly",
                super::BODIES_IN_FLIGHT,
                max >> 20
            ))
            .into_response()
        }
        Ok(Err(Refused::Read(e))) => {
            return ApiError::invalid(format!("reading the request body: {e}")).into_response()
        }
        Err(_) => {
            return ApiError::with_status(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (-to/--timeout)",
                    timeout.as_secs()
                ),
            )
            .into_response()
        }
    };
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    as_json_error(resp).await
}

/// `resp` itself, or for an error reply that is not JSON (nor an event stream), the same
/// status with its text as our error object.
async fn as_json_error(resp: Response) -> Response {
    let status = resp.status();
    let kind = (resp.headers().get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if status.as_u16() < 400
        || kind.starts_with("application/json")
        || kind.starts_with("text/event-stream")
    {
        return resp;
    }
    let text = match axum::body::to_bytes(resp.into_body(), 64 << 10).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).into_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("the request was refused")
            .to_string(),
    };
    ApiError::with_status(status, text).into_response()
}

/// What a sleeping server answers without waking (llama-server's read-only routes):
/// its health, its properties and model list, and the metrics as they were when it fell
/// asleep.
fn answers_asleep(method: &Method, path: &str) -> bool {
    path == "/cors-proxy"
        || method == Method::GET
            && matches!(
                path,
                "/health" | "/v1/health" | "/props" | "/models" | "/v1/models" | "/metrics"
            )
}

/// Wakes a sleeping server (loading the model again) before any request that may need
/// the model (`--sleep-idle-seconds`); a load that fails is the request's 500.
async fn wake(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Ok(service) = s.service() {
        if service.is_sleeping() && !answers_asleep(req.method(), req.uri().path()) {
            if let Err(e) = service.wake().await {
                return ApiError::from(e).into_response();
            }
        }
    }
    next.run(req).await
}

/// Paths any client may read (GET) without a key.
const PUBLIC: &[&str] = &["/health", "/v1/health", "/models", "/v1/models"];

async fn api_key(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let keys = &s.opts.api_keys;
    let public = req.method() == Method::GET && PUBLIC.contains(&req.uri().path());
    if keys.is_empty() || req.method() == Method::OPTIONS || public {
        return next.run(req).await;
    }
    let given = bearer(req.headers());
    let ok = given.is_some_and(|g| {
        // Every key is compared, each in constant time, so the time taken does not
        // tell which key (or how much of one) matched.
        keys.iter().fold(false, |hit, k| {
            hit | bool::from(subtle::ConstantTimeEq::ct_eq(k.as_bytes(), g.as_bytes()))
        })
    });
    if ok {
        next.run(req).await
    } else {
        ApiError::auth().into_response()
    }
}

/// The key of `Authorization: Bearer KEY` or `X-Api-Key: KEY`.
fn bearer(h: &HeaderMap) -> Option<&str> {
    if let Some(a) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return a.strip_prefix("Bearer ").map(str::trim);
    }
    h.get("x-api-key").and_then(|v| v.to_str().ok())
}

/// Answers preflights and marks replies to allowed origins.
async fn cors(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let allowed = origin.as_ref().filter(|o| {
        o.to_str()
            .is_ok_and(|o| super::origins::origin_allowed(&s.opts.cors_origins, o))
    });
    let preflight = req.method() == Method::OPTIONS;
    let mut resp = if preflight {
        StatusCode::OK.into_response()
    } else {
        next.run(req).await
    };
    if let Some(o) = allowed {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o.clone());
        h.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("*"),
        );
    }
    resp
}
