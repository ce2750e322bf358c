//! Vertex AI's custom-container prediction protocol, as llama-server speaks it when
//! started with `AIP_MODE=PREDICTION`: `POST {AIP_PREDICT_ROUTE}` (default `/predict`)
//! takes `{"instances": [...]}`, each instance a request body naming its endpoint in
//! `@requestFormat` — a path (`/v1/chat/completions`) or its camelCase alias
//! (`chatCompletions`) — and answers `{"predictions": [...]}` in the same order, each
//! the endpoint's JSON reply (an error reply inline, as `{"error": {...}}`). The
//! instances run at once, each through the server's own routes, never streamed.

use super::error::ApiError;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tower::ServiceExt;

/// Most instances one prediction request may carry (llama-server's bound).
pub const MAX_INSTANCES: usize = 128;

/// Where the protocol's routes are (read from `AIP_*` by the command line).
#[derive(Clone, Debug)]
pub struct GcpOptions {
    /// `AIP_PREDICT_ROUTE`, with its leading `/`.
    pub predict_route: String,
    /// `AIP_HEALTH_ROUTE`: a second path answering as `/health`.
    pub health_route: Option<String>,
}

/// The server's routes, and the aliases instances may name them by.
pub struct Predictor {
    routes: Router,
    /// camelCase alias → path (the first path of an alias wins).
    aliases: HashMap<String, &'static str>,
    paths: Vec<&'static str>,
}

impl Predictor {
    pub fn new(paths: &[&'static str], routes: Router) -> Self {
        let mut aliases = HashMap::new();
        for p in paths {
            aliases.entry(alias(p)).or_insert(*p);
        }
        Predictor {
            routes,
            aliases,
            paths: paths.to_vec(),
        }
    }

    /// The path an instance's `@requestFormat` names.
    fn path(&self, format: &str) -> Option<&'static str> {
        (self.aliases.get(format).copied())
            .or_else(|| self.paths.iter().copied().find(|p| *p == format))
    }
}

/// A route's camelCase alias: `/v1` and the leading `/` dropped, each `/`, `-` or `_`
/// dropped with the next letter capitalised, up to a path parameter (llama-server's
/// rule): `/v1/chat/completions` → `chatCompletions`, `/apply-template` →
/// `applyTemplate`.
pub fn alias(path: &str) -> String {
    let p = path
        .strip_prefix("/v1")
        .filter(|_| path.len() > 3)
        .unwrap_or(path);
    let p = p.strip_prefix('/').unwrap_or(p);
    let mut out = String::new();
    let mut cap = false;
    for c in p.chars() {
        if c == ':' || c == '{' {
            break;
        }
        if matches!(c, '/' | '-' | '_') {
            cap = true;
        } else {
            out.push(if cap { c.to_ascii_uppercase() } else { c });
            cap = false;
        }
    }
    out
}

/// A path the protocol's variables may name (Vertex AI's look like
/// `/v1/endpoints/E/deployedModels/M:predict`): printable, without the router's
/// parameter syntax (`{x}`, or a segment starting with `:` or `*`).
pub fn valid_route(p: &str) -> bool {
    p.starts_with('/')
        && p.len() > 1
        && p.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.' | '~' | ':' | '@')
        })
        && !p.split('/').any(|seg| seg.starts_with([':', '*']))
}

fn invalid(msg: impl Into<String>) -> Value {
    error_item(StatusCode::BAD_REQUEST, "invalid_request_error", msg)
}

fn error_item(status: StatusCode, kind: &str, msg: impl Into<String>) -> Value {
    json!({"error": {"code": status.as_u16(), "message": msg.into(), "type": kind}})
}

/// `POST {predict route}`.
pub async fn predict(p: Arc<Predictor>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    // The body was read whole, within the server's limit, before any handler runs.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::invalid(format!("reading the request body: {e}")).into_response()
        }
    };
    let data: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return ApiError::invalid(format!("the request body is not JSON: {e}")).into_response()
        }
    };
    let Some(obj) = data.as_object() else {
        return ApiError::invalid("request body must be a JSON object").into_response();
    };
    let Some(instances) = obj.get("instances").and_then(Value::as_array) else {
        return ApiError::invalid("request body must include an array field named instances")
            .into_response();
    };
    if instances.len() > MAX_INSTANCES {
        return ApiError::invalid(format!(
            "instances array exceeds maximum size of {MAX_INSTANCES}"
        ))
        .into_response();
    }
    let mut runs = tokio::task::JoinSet::new();
    for (i, inst) in instances.iter().enumerate() {
        let p = p.clone();
        let inst = inst.clone();
        let headers = parts.headers.clone();
        let query = parts.uri.query().map(str::to_string);
        runs.spawn(async move { (i, one(&p, &inst, headers, query).await) });
    }
    let mut predictions = vec![Value::Null; instances.len()];
    while let Some(done) = runs.join_next().await {
        match done {
            Ok((i, v)) => predictions[i] = v,
            Err(e) => {
                return ApiError::server(format!("an instance's handler failed: {e}"))
                    .into_response()
            }
        }
    }
    axum::Json(json!({ "predictions": predictions })).into_response()
}

/// One instance through the route it names.
async fn one(
    p: &Predictor,
    inst: &Value,
    headers: axum::http::HeaderMap,
    query: Option<String>,
) -> Value {
    let Some(fields) = inst.as_object() else {
        return invalid("each instance must be a JSON object");
    };
    let Some(format) = fields.get("@requestFormat").and_then(Value::as_str) else {
        return invalid("each instance must include a string @requestFormat");
    };
    let Some(path) = p.path(format) else {
        return invalid(format!(
            "no handler registered for @requestFormat: {format}"
        ));
    };
    let mut payload: Map<String, Value> = fields.clone();
    payload.remove("@requestFormat");
    if payload.contains_key("stream") {
        log::warn!("predict: an instance asked to stream; the predict route answers whole replies");
        payload.insert("stream".into(), Value::Bool(false));
    }
    let body = Value::Object(payload).to_string();
    let uri = match &query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    // A route that only reads (GET) is asked that way; the others with the payload.
    for method in [Method::POST, Method::GET] {
        let mut b = Request::builder().method(method.clone()).uri(&uri);
        for (k, v) in &headers {
            if k != header::CONTENT_LENGTH && k != header::TRANSFER_ENCODING {
                b = b.header(k, v);
            }
        }
        let req = match b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.clone()))
        {
            Ok(r) => r,
            Err(e) => {
                return error_item(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    e.to_string(),
                )
            }
        };
        let resp = match p.routes.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        if resp.status() == StatusCode::METHOD_NOT_ALLOWED && method == Method::POST {
            continue;
        }
        return reply_value(resp).await;
    }
    invalid(format!("{path} takes neither POST nor GET requests"))
}

/// A route's reply as a prediction: its JSON, else its text (`null` when empty).
async fn reply_value(resp: Response) -> Value {
    let streamed = (resp.headers().get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if streamed {
        return invalid("predict route does not support streaming responses");
    }
    match axum::body::to_bytes(resp.into_body(), usize::MAX).await {
        Ok(b) if b.is_empty() => Value::Null,
        Ok(b) => serde_json::from_slice(&b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into_owned())),
        Err(e) => error_item(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{alias, valid_route};

    #[test]
    fn aliases_as_llama_server_derives_them() {
        assert_eq!(alias("/v1/chat/completions"), "chatCompletions");
        assert_eq!(alias("/chat/completions"), "chatCompletions");
        assert_eq!(alias("/apply-template"), "applyTemplate");
        assert_eq!(alias("/completion"), "completion");
        assert_eq!(alias("/v1/messages/count_tokens"), "messagesCountTokens");
        assert_eq!(alias("/slots/{id}"), "slots");
        assert_eq!(alias("/v1"), "v1");
        assert!(
            valid_route("/predict") && valid_route("/v1/endpoints/1/deployedModels/x-y:predict")
        );
        for bad in ["predict", "/", "/a/{b}", "/a/:b", "/a/*b", "/a b"] {
            assert!(!valid_route(bad), "{bad}");
        }
    }
}
