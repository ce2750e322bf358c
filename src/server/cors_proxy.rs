//! `/cors-proxy?url=URL` (`--ui-mcp-proxy`): llama-server's web UI reaches MCP servers
//! that send no CORS headers through this. A GET or POST goes on to URL with the
//! request's body and its `X-Llama-Server-Proxy-Header-NAME` headers as `NAME` (no
//! other header of the client's goes on), and the reply comes back as it arrives. Off by
//! default, and then a 403: it lets whoever may call the server reach any address the
//! server can, so it is for a trusted client on a trusted network only.

use super::error::ApiError;
use super::forward::{forward, Forward, Upstream};
use super::AppState;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Arc;

const HEADER_PREFIX: &str = "x-llama-server-proxy-header-";

/// llama-server's refusal while the proxy is off.
fn disabled() -> Response {
    (
        StatusCode::FORBIDDEN,
        axum::Json(serde_json::json!({"error": {
            "message": "this feature is disabled (start the server with --ui-mcp-proxy)",
            "type": "feature_disabled",
        }})),
    )
        .into_response()
}

/// The target, checked as llama-server checks it: http or https, with a host, without a
/// password.
fn target(url: &str) -> Result<String, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("invalid target URL {url:?}: {e}"))?;
    let scheme = uri.scheme_str().unwrap_or("");
    if scheme != "http" && scheme != "https" {
        return Err(format!("unsupported URL scheme in target URL: {scheme}"));
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if userinfo.is_some_and(|u| u.contains(':')) {
        return Err("authentication in target URL is not supported".into());
    }
    if host.is_empty() || host.starts_with(':') {
        return Err("invalid target URL: missing host".into());
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let path = if path.is_empty() { "/" } else { path };
    Ok(format!("{scheme}://{host}{path}"))
}

pub async fn proxy(
    State(s): State<Arc<AppState>>,
    method: Method,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !s.opts.cors_proxy {
        return disabled();
    }
    let Some(url) = q.get("url") else {
        return ApiError::invalid("cors-proxy: give the target as ?url=URL").into_response();
    };
    let url = match target(url) {
        Ok(u) => u,
        Err(e) => return ApiError::server(e).into_response(),
    };
    let mut pass = Vec::new();
    for (k, v) in &headers {
        let Some(name) = k.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        // This hop's own headers are set by the client that passes the request on.
        if matches!(
            name,
            "host" | "content-length" | "transfer-encoding" | "connection"
        ) {
            continue;
        }
        if let (false, Ok(name)) = (name.is_empty(), HeaderName::from_bytes(name.as_bytes())) {
            pass.push((name, v.clone()));
        }
    }
    log::info!("cors-proxy: {method} {url}");
    forward(
        Forward {
            method,
            url,
            headers: pass,
            body,
        },
        Upstream::Outside,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::target;

    #[test]
    fn targets_as_llama_server_checks_them() {
        assert_eq!(target("http://example.com").unwrap(), "http://example.com/");
        assert_eq!(
            target("https://a.b:8443/x/y?z=1").unwrap(),
            "https://a.b:8443/x/y?z=1"
        );
        assert_eq!(target("http://user@h/p").unwrap(), "http://h/p");
        assert!(target("http://u:p@h/")
            .unwrap_err()
            .contains("authentication"));
        assert!(target("ftp://h/").unwrap_err().contains("scheme"));
        assert!(target("file:///etc/passwd").is_err());
        assert!(target("/relative").is_err());
    }
}
