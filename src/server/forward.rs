//! Passing a request on to another HTTP server and its reply back as it arrives (the
//! web UI's CORS proxy; the router's children): the upstream call runs on a blocking
//! thread of its own, its reply's head comes back first and its body follows in chunks,
//! so a streamed reply (server-sent events) streams through. A client that goes away
//! drops the body's reader, which ends the upstream call.

use super::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use std::io::Read;
use std::sync::OnceLock;
use std::time::Duration;

/// One request to pass on.
pub struct Forward {
    pub method: Method,
    /// `http://` or `https://`, with its query.
    pub url: String,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

/// Where a forwarded call goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// Anywhere, through the system's proxy settings (`HTTP_PROXY`, ...).
    Outside,
    /// A server on this host: never through a proxy.
    Loopback,
}

/// Seconds to wait for an upstream's reply head (llama-server's proxy waits 10 minutes).
const HEAD_TIMEOUT: Duration = Duration::from_secs(600);

fn agent(to: Upstream) -> &'static ureq::Agent {
    static OUTSIDE: OnceLock<ureq::Agent> = OnceLock::new();
    static LOOPBACK: OnceLock<ureq::Agent> = OnceLock::new();
    let cell = match to {
        Upstream::Outside => &OUTSIDE,
        Upstream::Loopback => &LOOPBACK,
    };
    cell.get_or_init(|| {
        let mut c = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(HEAD_TIMEOUT))
            .user_agent(format!("wgllm/{}", env!("CARGO_PKG_VERSION")));
        if to == Upstream::Loopback {
            c = c.proxy(None);
        }
        ureq::Agent::new_with_config(c.build())
    })
}

/// Reply headers that describe this hop rather than the content, which the reply
/// written here sets itself.
fn hop_header(name: &str) -> bool {
    matches!(
        name,
        "server" | "transfer-encoding" | "content-length" | "keep-alive" | "connection" | "date"
    ) || name.starts_with("access-control-")
}

/// Passes `f` on; the upstream's reply streams back, or a 500 says why there was none
/// (llama-server's status for a proxy that reached nothing).
pub async fn forward(f: Forward, to: Upstream) -> Response {
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let (body_tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let url = f.url.clone();
    tokio::task::spawn_blocking(move || {
        let mut req = ureq::http::Request::builder()
            .method(f.method.as_str())
            .uri(&f.url);
        for (k, v) in &f.headers {
            req = req.header(k.as_str(), v.as_bytes());
        }
        let resp = req
            .body(f.body.to_vec())
            .map_err(|e| e.to_string())
            .and_then(|r| agent(to).run(r).map_err(|e| e.to_string()));
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                let _ = head_tx.send(Err(e));
                return;
            }
        };
        let (parts, body) = resp.into_parts();
        let mut head = HeaderMap::new();
        for (k, v) in &parts.headers {
            let name = k.as_str();
            // ureq has already decoded a gzip body.
            let gzip = name == "content-encoding" && v.as_bytes().eq_ignore_ascii_case(b"gzip");
            if hop_header(name) || gzip {
                continue;
            }
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(v.as_bytes()),
            ) {
                head.append(k, v);
            }
        }
        if head_tx.send(Ok((parts.status.as_u16(), head))).is_err() {
            return;
        }
        let mut reader = body.into_reader();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if body_tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        // The client is gone: dropping the reply ends the upstream call.
                        return;
                    }
                }
                Err(e) => {
                    let _ = body_tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    let (status, headers) = match head_rx.await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return ApiError::server(format!("proxy error: {url}: {e}")).into_response(),
        Err(_) => return ApiError::server(format!("proxy error: {url}: no reply")).into_response(),
    };
    let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    *resp.headers_mut() = headers;
    if status == 204 || status == 304 {
        *resp.body_mut() = Body::empty();
        resp.headers_mut().remove(header::CONTENT_TYPE);
    }
    resp
}
