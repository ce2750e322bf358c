//! `GET/POST /tools`: tools the server runs itself for a client such as llama-server's
//! web UI — the built-in ones (`--tools`, [`builtin`]) and those of the MCP servers it
//! starts (`--mcp-servers-config`, `--mcp-servers-json`, [`mcp`]). Both are off by
//! default, and `/tools` then answers llama-server's 403.
//!
//! The built-in tools read, write and run what the server's user may: anyone who can
//! reach the server can. `--tools-root DIR` (wgllm's own) keeps every file tool inside
//! DIR and takes the shell away; without it paths reach anywhere, as in llama-server.

pub mod builtin;
pub mod mcp;

use super::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_stream::StreamExt as _;

/// What `--tools`, `--tools-root` and the MCP flags asked for.
#[derive(Clone, Debug, Default)]
pub struct AgentOptions {
    /// Built-in tools switched on, in llama-server's order.
    pub builtin: Vec<&'static str>,
    /// Every file tool stays inside this directory (canonical).
    pub root: Option<PathBuf>,
    pub mcp: Vec<mcp::ServerConfig>,
}

impl AgentOptions {
    /// `/tools` is served (else it answers 403).
    pub fn enabled(&self) -> bool {
        !self.builtin.is_empty() || !self.mcp.is_empty()
    }
}

/// Reads `--tools` (names, comma separated, or `all`) as llama-server does. With a root,
/// the shell is left out of `all` and refused by name: a command reaches past any
/// directory.
pub fn builtin_names(list: &str, rooted: bool) -> Result<Vec<&'static str>, String> {
    let asked: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for name in &asked {
        if *name != "all" && !builtin::NAMES.contains(name) {
            return Err(format!(
                "unknown tool \"{name}\". available tools: {}",
                builtin::NAMES.join(", ")
            ));
        }
        if rooted && *name == "exec_shell_command" {
            return Err("--tools exec_shell_command cannot be confined by --tools-root (a shell command reaches any path): leave it out, or drop --tools-root".into());
        }
    }
    let all = asked.contains(&"all");
    Ok(builtin::NAMES
        .into_iter()
        .filter(|n| all || asked.contains(n))
        .filter(|n| !(rooted && *n == "exec_shell_command"))
        .collect())
}

/// A tool as `/tools` lists and calls it.
struct Entry {
    name: String,
    kind: Kind,
    listing: Value,
}

enum Kind {
    Builtin(&'static str),
    /// An index into the MCP servers' tools.
    Mcp(usize),
}

/// The tools this server offers.
pub struct Toolbox {
    root: Option<PathBuf>,
    mcp: mcp::Mcp,
    entries: Vec<Entry>,
}

impl Toolbox {
    /// Lists every MCP server's tools (each server started and closed once, before the
    /// server listens, as llama-server does).
    pub async fn start(opts: &AgentOptions) -> Toolbox {
        let mcp = mcp::Mcp::start(opts.mcp.clone()).await;
        let mut entries: Vec<Entry> = (opts.builtin.iter())
            .filter_map(|&name| {
                Some(Entry {
                    name: name.to_owned(),
                    kind: Kind::Builtin(name),
                    listing: json!({
                        "display_name": builtin::display_name(name),
                        "tool": name,
                        "type": "server",
                        "permissions": {"write": builtin::writes(name)},
                        "uses_cwd": builtin::uses_cwd(name),
                        "definition": builtin::definition(name)?,
                    }),
                })
            })
            .collect();
        for (i, t) in mcp.tools().iter().enumerate() {
            let name = format!("{}_{}", mcp.server_name(t.server), t.name);
            if entries.iter().any(|e| e.name == name) {
                log::warn!("MCP tool {name} has the name of another tool; skipped");
                continue;
            }
            let parameters = match &t.input_schema {
                Value::Object(_) => t.input_schema.clone(),
                _ => json!({}),
            };
            entries.push(Entry {
                listing: json!({
                    "display_name": name,
                    "tool": name,
                    "type": "mcp",
                    "permissions": {"write": false},
                    "uses_cwd": false,
                    "definition": {"type": "function", "function": {
                        "name": name,
                        "description": t.description,
                        "parameters": parameters,
                    }},
                }),
                name,
                kind: Kind::Mcp(i),
            });
        }
        if !opts.mcp.is_empty() {
            let n = entries
                .iter()
                .filter(|e| matches!(e.kind, Kind::Mcp(_)))
                .count();
            log::info!("{n} MCP tools offered at /tools");
        }
        Toolbox {
            root: opts.root.clone(),
            mcp,
            entries,
        }
    }

    /// Ends calls in flight and the MCP server processes.
    pub async fn shutdown(&self) {
        self.mcp.shutdown().await;
    }
}

/// llama-server's answer while the feature is off.
fn disabled() -> Response {
    (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"error": {
            "message": "this feature is disabled",
            "type": "feature_disabled",
        }})),
    )
        .into_response()
}

/// A refusal as `/tools` writes it: the error object on its own, not under `error`
/// (llama-server's shape for this endpoint). An unknown tool is a 404 whose body says
/// 400, as there.
fn refusal(status: StatusCode, message: impl Into<String>) -> Response {
    let (code, kind) = match status {
        StatusCode::INTERNAL_SERVER_ERROR => (500, "server_error"),
        StatusCode::NOT_IMPLEMENTED => (501, "not_supported_error"),
        _ => (400, "invalid_request_error"),
    };
    let body = json!({"code": code, "message": message.into(), "type": kind});
    (status, axum::Json(body)).into_response()
}

pub async fn list(State(s): State<Arc<AppState>>) -> Response {
    let Some(tb) = s.tools.get() else {
        return disabled();
    };
    let all: Vec<&Value> = tb.entries.iter().map(|e| &e.listing).collect();
    axum::Json(all).into_response()
}

/// The header's value, if set and not empty.
fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    (headers.get(name).and_then(|v| v.to_str().ok())).filter(|v| !v.is_empty())
}

/// Checks an `x-tool-runtime` as llama-server does. Its isolates (a docker or podman
/// container, an ssh host) are not built here: a valid one is refused with a 501.
fn check_runtime(spec: &str) -> Result<(), (StatusCode, String)> {
    let server = |m: String| Err((StatusCode::INTERNAL_SERVER_ERROR, m));
    for engine in ["docker", "podman"] {
        if let Some(id) = spec.strip_prefix(&format!("{engine}-container:")) {
            let valid = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
            if !valid {
                return server(format!("invalid container id: {id}"));
            }
            return Err(isolates_not_built(spec));
        }
        if spec.starts_with(&format!("{engine}:")) {
            return server(format!(
                "tool runtime must name a running container: {spec}"
            ));
        }
    }
    if let Some(target) = spec.strip_prefix("ssh:") {
        let valid = !target.is_empty()
            && !target.starts_with('-')
            && target
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'));
        if !valid {
            return server(format!("invalid ssh target: {target}"));
        }
        return Err(isolates_not_built(spec));
    }
    server(format!("unknown tool runtime: {spec}"))
}

fn isolates_not_built(spec: &str) -> (StatusCode, String) {
    (
        StatusCode::NOT_IMPLEMENTED,
        format!("tool runtime {spec}: wgllm runs its tools on the server's own host only (containers and ssh targets are not built); send no x-tool-runtime header"),
    )
}

pub async fn call(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(tb) = s.tools.get().cloned() else {
        return disabled();
    };
    // A page on another site can send a simple POST without asking (no preflight): CORS
    // would only hide the answer, so a call from an origin CORS does not allow is
    // refused before it runs (llama-server runs it).
    if let Some(origin) = header(&headers, "origin") {
        // The server's own pages (the web UI) are always welcome.
        let same_site = origin.split_once("://").map(|(_, h)| h) == header(&headers, "host");
        if !same_site && !super::origins::origin_allowed(&s.opts.cors_origins, origin) {
            let m = format!("origin {origin} may not call tools (allow it with --cors-origins)");
            return (
                StatusCode::FORBIDDEN,
                axum::Json(json!({"error": {"message": m, "type": "authentication_error"}})),
            )
                .into_response();
        }
    }
    let bad = |m: String| refusal(StatusCode::BAD_REQUEST, m);
    // A body may be up to the server's limit: read off the async runtime's threads.
    let parsed = super::off_runtime(|| serde_json::from_slice::<Value>(&body)).await;
    let body: Value = match parsed {
        Ok(v) => v,
        Err(e) => return bad(format!("the body is not JSON: {e}")),
    };
    let Some(name) = body.get("tool").and_then(Value::as_str) else {
        return bad("\"tool\" must be given: the name of a tool that GET /tools lists".into());
    };
    let mut params = match body.get("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return bad("\"params\" must be an object".into()),
    };
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // Only the headers set these (a model's arguments never do).
    for key in ["cwd", "runtime", "resp_type"] {
        params.remove(key);
    }
    let cwd = header(&headers, "x-tool-cwd");
    let runtime = header(&headers, "x-tool-runtime");
    let resp_type = header(&headers, "x-resp-type");
    let Some(entry) = tb.entries.iter().find(|e| e.name == name) else {
        return refusal(StatusCode::NOT_FOUND, format!("unknown tool \"{name}\""));
    };
    if stream && !matches!(entry.kind, Kind::Builtin("exec_shell_command")) {
        let m = format!("tool \"{name}\" does not support stream = true");
        return refusal(StatusCode::NOT_FOUND, m);
    }
    let tool = match entry.kind {
        Kind::Mcp(i) => {
            // llama-server hands the header values on as arguments too.
            for (k, v) in [("cwd", cwd), ("runtime", runtime), ("resp_type", resp_type)] {
                if let Some(v) = v {
                    params.insert(k.into(), v.into());
                }
            }
            let t = tb.mcp.tools()[i].clone();
            return axum::Json(tb.mcp.call(&t, params).await).into_response();
        }
        Kind::Builtin(t) => t,
    };
    if let Some(spec) = runtime {
        if let Err((status, message)) = check_runtime(spec) {
            return refusal(status, message);
        }
    }
    let place = match place(cwd, &tb.root) {
        Ok(p) => p,
        Err(e) => return axum::Json(json!({"error": e})).into_response(),
    };
    if stream {
        return streamed(params, place);
    }
    let base64 = resp_type == Some("base64");
    let run = tokio::task::spawn_blocking(move || builtin::call(tool, &params, &place, base64));
    match run.await {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(builtin::BadRequest(m))) => bad(m),
        Err(e) => refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the tool failed: {e}"),
        ),
    }
}

/// Where a call runs: the header's directory (relative to the server's own), or the
/// server's; with a root, it must lie inside it (the root when no header is sent).
fn place(cwd: Option<&str>, root: &Option<PathBuf>) -> Result<builtin::Place, String> {
    let here = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let dir = match (cwd, root) {
        (Some(c), _) => here.join(c),
        (None, Some(r)) => r.clone(),
        (None, None) => here,
    };
    if let Some(r) = root {
        let real = (dir.canonicalize())
            .map_err(|e| format!("cannot use the directory {}: {e}", dir.display()))?;
        if !real.starts_with(r) {
            return Err(format!(
                "path is outside the tools root ({}): {}",
                r.display(),
                dir.display()
            ));
        }
    }
    Ok(builtin::Place {
        cwd: dir,
        root: root.clone(),
    })
}

/// exec_shell_command's output as it comes: `data: {"chunk": TEXT}` events, then
/// `data: {"done": true}` (with `error` if it failed). A client that leaves ends the
/// command.
fn streamed(params: Map<String, Value>, place: builtin::Place) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Value>(64);
    tokio::task::spawn_blocking(move || {
        let mut chunk = |text: &str| tx.blocking_send(json!({"chunk": text})).is_ok();
        let end = match builtin::exec_streamed(&params, &place, &mut chunk) {
            Ok(v) => match v.get("error") {
                Some(e) => json!({"done": true, "error": e}),
                None => json!({"done": true}),
            },
            Err(builtin::BadRequest(m)) => json!({"done": true, "error": m}),
        };
        let _ = tx.blocking_send(end);
    });
    let events = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|v| Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {v}\n\n"))));
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(axum::body::Body::from_stream(events))
        .unwrap_or_else(|e| refusal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_flag_reads_as_llama_server_reads_it() {
        assert_eq!(builtin_names("all", false).unwrap(), builtin::NAMES);
        assert_eq!(
            builtin_names("get_info,read_file", false).unwrap(),
            ["read_file", "get_info"]
        );
        let e = builtin_names("read_file,rm_rf", false).unwrap_err();
        assert!(
            e.starts_with("unknown tool \"rm_rf\". available tools: read_file, "),
            "{e}"
        );
        let rooted = builtin_names("all", true).unwrap();
        assert!(!rooted.contains(&"exec_shell_command"));
        assert!(builtin_names("exec_shell_command", true).is_err());
    }

    #[test]
    fn runtimes_are_checked_before_anything_runs() {
        let status = |spec: &str| check_runtime(spec).unwrap_err().0;
        assert_eq!(
            status("fake:does-not-exist"),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status("ssh:-oProxyCommand=touch /tmp/pwned"),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status("docker-container:--privileged"),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(status("podman:busybox"), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            status("docker-container:abc123"),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(status("ssh:me@host"), StatusCode::NOT_IMPLEMENTED);
    }

    #[test]
    fn a_rooted_place_stays_inside_its_root() {
        let root = std::env::temp_dir().canonicalize().unwrap();
        let inside = place(Some(root.to_str().unwrap()), &Some(root.clone())).unwrap();
        assert_eq!(inside.cwd, root);
        assert_eq!(place(None, &Some(root.clone())).unwrap().cwd, root);
        let e = place(Some("/"), &Some(root.clone())).unwrap_err();
        assert!(e.contains("outside the tools root"), "{e}");
        let up = format!("{}/..", root.display());
        assert!(place(Some(&up), &Some(root)).is_err());
    }
}
