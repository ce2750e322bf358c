//! Errors as llama-server and OpenAI give them: a status code and
//! `{"error": {"code", "message", "type"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Fields added to the error object (`n_prompt_tokens`, `n_ctx` for a prompt that
    /// does not fit).
    pub extra: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: None,
        }
    }
    /// An error with any status, its type named after the status's class (a refusal by
    /// a layer below the handlers: the body's size or read time, a malformed path).
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::REQUEST_TIMEOUT => "timeout_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            StatusCode::NOT_IMPLEMENTED => "not_supported_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        Self::new(status, kind, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    pub fn auth() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Invalid API Key",
        )
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        )
    }
    pub fn not_supported(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", message)
    }
    pub fn exceeds_context(message: impl Into<String>, n_prompt: usize, n_ctx: u32) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "exceed_context_size_error",
            message,
        );
        let mut m = serde_json::Map::new();
        m.insert("n_prompt_tokens".into(), n_prompt.into());
        m.insert("n_ctx".into(), n_ctx.into());
        e.extra = Some(m);
        e
    }

    /// The error object (without the outer `error` key).
    pub fn object(&self) -> serde_json::Value {
        let mut o = json!({
            "code": self.status.as_u16(),
            "message": self.message,
            "type": self.kind,
        });
        if let (Some(extra), Some(map)) = (&self.extra, o.as_object_mut()) {
            map.extend(extra.clone());
        }
        o
    }
}

impl From<crate::engine::service::RequestError> for ApiError {
    fn from(e: crate::engine::service::RequestError) -> Self {
        use crate::engine::service::RequestError;
        match e {
            RequestError::Invalid(m) => ApiError::invalid(m),
            RequestError::ExceedsContext { n_prompt, n_ctx } => {
                ApiError::exceeds_context(e_msg(n_prompt, n_ctx), n_prompt, n_ctx)
            }
            RequestError::Server(m) => ApiError::server(m),
            RequestError::Unavailable(m) => ApiError::unavailable(m),
        }
    }
}

fn e_msg(n_prompt: usize, n_ctx: u32) -> String {
    crate::engine::service::RequestError::ExceedsContext { n_prompt, n_ctx }.to_string()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
            log::error!("{}: {}", self.status, self.message);
        } else {
            log::debug!("{}: {}", self.status, self.message);
        }
        (self.status, axum::Json(json!({ "error": self.object() }))).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
