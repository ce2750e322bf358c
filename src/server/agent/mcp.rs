//! MCP servers the server runs itself (`--mcp-servers-config FILE`, `--mcp-servers-json
//! JSON`), as llama-server runs them: stdio child processes speaking JSON-RPC, one JSON
//! message per line. Each is started once at startup to list its tools (and closed
//! again), then started on the first call of one of its tools and kept for the next.
//!
//! A server that cannot start, answers garbage, hangs or dies never takes this server
//! down: every call has a deadline (`timeout_ms`), a dead process is started again on
//! the next call (a failed start waits out a cooldown), and stopping the server cancels
//! calls in flight at once. Nothing waits for a child's pipes to close: a grandchild may
//! hold them open long after the child is gone.

use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The MCP protocol version this client speaks (llama-server's).
const PROTOCOL_VERSION: &str = "2024-11-05";
/// The longest startup listing of one server.
const WARMUP_LIMIT: Duration = Duration::from_secs(10);
/// How long a server that failed to start is not started again.
const COOLDOWN: Duration = Duration::from_secs(5);
/// A line longer than this is dropped (a server cannot make us hold unbounded memory).
const MAX_LINE: usize = 8 << 20;
/// Lines read ahead of the request waiting for them.
const LINES_QUEUED: usize = 1024;
/// A call's deadline when the config gives none.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// One entry of the `mcpServers` object.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Set on top of this process's environment (none: inherited as it is).
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Each request's deadline.
    pub timeout: Duration,
}

/// Reads a config in Cursor's `mcpServers` format. Entries without a `command` (URL
/// servers) are skipped with a warning: only stdio servers are run.
pub fn parse_config(text: &str) -> Result<Vec<ServerConfig>, String> {
    let bad = |e: String| format!("failed to parse MCP config JSON: {e}");
    let root: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let Some(servers) = root.get("mcpServers").and_then(Value::as_object) else {
        log::warn!("MCP config: no servers found (expected an \"mcpServers\" object)");
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (name, entry) in servers {
        let Some(command) = entry.get("command").and_then(Value::as_str) else {
            log::warn!("MCP server {name}: no \"command\"; only stdio servers are run, skipped");
            continue;
        };
        let strings = |key: &str| -> Result<Vec<String>, String> {
            match entry.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(str::to_owned))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad(format!("{name}.{key}: every item must be a string"))),
                Some(_) => Err(bad(format!("{name}.{key} must be an array of strings"))),
            }
        };
        let args = strings("args")?;
        let env = match entry.get("env") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(o)) => o
                .iter()
                .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(format!("{name}.env: every value must be a string")))?,
            Some(_) => return Err(bad(format!("{name}.env must be an object"))),
        };
        let timeout_ms = match entry.get("timeout_ms") {
            None | Some(Value::Null) => DEFAULT_TIMEOUT_MS,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| bad(format!("{name}.timeout_ms must be a whole number")))?,
        };
        out.push(ServerConfig {
            name: name.clone(),
            command: command.to_owned(),
            args,
            env,
            cwd: entry.get("cwd").and_then(Value::as_str).map(PathBuf::from),
            timeout: Duration::from_millis(timeout_ms),
        });
    }
    Ok(out)
}

/// The servers of `--mcp-servers-config FILE` then `--mcp-servers-json JSON`; a name
/// given twice keeps its first entry.
pub fn read_configs(
    file: Option<&std::path::Path>,
    inline: Option<&str>,
) -> Result<Vec<ServerConfig>, String> {
    let mut all: Vec<ServerConfig> = Vec::new();
    let mut texts = Vec::new();
    if let Some(f) = file {
        let text = std::fs::read_to_string(f)
            .map_err(|e| format!("failed to open MCP config file: {} ({e})", f.display()))?;
        texts.push(text);
    }
    texts.extend(inline.map(str::to_owned));
    for text in texts {
        for c in parse_config(&text)? {
            if all.iter().any(|a| a.name == c.name) {
                log::warn!(
                    "MCP server {} is configured twice; the first entry is used",
                    c.name
                );
            } else {
                all.push(c);
            }
        }
    }
    Ok(all)
}

/// A tool an MCP server lists.
#[derive(Clone, Debug)]
pub struct Tool {
    /// The index of its server in [`Mcp`]'s list.
    pub server: usize,
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// Why a request got no reply.
#[derive(Debug, PartialEq)]
enum RpcError {
    Cancelled,
    TimedOut,
    Closed,
}

impl RpcError {
    fn message(&self) -> &'static str {
        match self {
            RpcError::Cancelled => "cancelled",
            RpcError::TimedOut => "request timed out",
            RpcError::Closed => "transport closed",
        }
    }
}

/// Splits a byte stream into lines: `\r\n` or `\n` ends a line, empty lines are skipped,
/// and a line over [`MAX_LINE`] bytes is dropped whole.
#[derive(Default)]
struct LineSplitter {
    buf: Vec<u8>,
    /// The current line grew too long: drop bytes up to its end.
    skipping: bool,
}

impl LineSplitter {
    fn push(&mut self, mut bytes: &[u8], out: &mut Vec<String>) {
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            if !self.skipping {
                self.buf.extend_from_slice(&bytes[..nl]);
                if self.buf.last() == Some(&b'\r') {
                    self.buf.pop();
                }
                if !self.buf.is_empty() {
                    out.push(String::from_utf8_lossy(&self.buf).into_owned());
                }
            }
            self.buf.clear();
            self.skipping = false;
            bytes = &bytes[nl + 1..];
        }
        if !self.skipping {
            self.buf.extend_from_slice(bytes);
            if self.buf.len() > MAX_LINE {
                log::warn!("MCP server sent a line over {MAX_LINE} bytes; dropped");
                self.buf = Vec::new();
                self.skipping = true;
            }
        }
    }
}

/// Reads `pipe` to its end as lines (see [`LineSplitter`]), each given to `line` until it
/// returns false. True when the pipe ended (or failed), false when `line` stopped it.
fn read_lines(mut pipe: impl Read, mut line: impl FnMut(String) -> bool) -> bool {
    let mut split = LineSplitter::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut lines = Vec::new();
    while let Ok(n @ 1..) = pipe.read(&mut buf) {
        split.push(&buf[..n], &mut lines);
        for l in lines.drain(..) {
            if !line(l) {
                return false;
            }
        }
    }
    true
}

/// A running server process and its pipes.
struct Session {
    child: Child,
    /// Messages for the writer thread (which may block on a full pipe; we never do).
    to_child: std::sync::mpsc::Sender<Vec<u8>>,
    /// Lines the reader thread got; closed when stdout ends.
    lines: tokio::sync::mpsc::Receiver<String>,
    /// Cleared when stdout ends or a write fails.
    alive: Arc<AtomicBool>,
    next_id: u64,
}

impl Session {
    fn spawn(cfg: &ServerConfig) -> std::io::Result<Session> {
        let mut cmd = Command::new(&cfg.command);
        cmd.args(&cfg.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &cfg.env {
            cmd.env(k, v);
        }
        if let Some(d) = &cfg.cwd {
            cmd.current_dir(d);
        }
        // A group of its own, so that ending it ends what it started too (`npx` and the
        // like run the real server as a grandchild).
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn()?;
        let alive = Arc::new(AtomicBool::new(true));
        let name = cfg.name.clone();
        let (mut stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(std::io::Error::other("the child's pipes were not opened"));
                }
            };
        // The threads are never joined: a grandchild may keep the pipes open, and a read
        // blocked on them must not hold anything up. Each ends with its pipe, or at the
        // first send after the session is gone.
        let (to_child, from_us) = std::sync::mpsc::channel::<Vec<u8>>();
        let writer_alive = alive.clone();
        std::thread::Builder::new()
            .name(format!("mcp-{name}-in"))
            .spawn(move || {
                for msg in from_us {
                    if stdin.write_all(&msg).and_then(|_| stdin.flush()).is_err() {
                        writer_alive.store(false, Ordering::Relaxed);
                        break;
                    }
                }
            })?;
        // Bounded: a server that talks between requests waits for us, not our memory.
        let (lines_tx, lines) = tokio::sync::mpsc::channel(LINES_QUEUED);
        let reader_alive = alive.clone();
        std::thread::Builder::new()
            .name(format!("mcp-{name}-out"))
            .spawn(move || {
                if read_lines(stdout, |l| lines_tx.blocking_send(l).is_ok()) {
                    reader_alive.store(false, Ordering::Relaxed);
                }
            })?;
        let err_name = name.clone();
        // Drained to its end whatever it holds (a full pipe would block the child).
        std::thread::Builder::new()
            .name(format!("mcp-{name}-err"))
            .spawn(move || {
                read_lines(stderr, |l| {
                    log::debug!("MCP server {err_name}: {l}");
                    true
                });
            })?;
        Ok(Session {
            child,
            to_child,
            lines,
            alive,
            next_id: 1,
        })
    }

    fn is_alive(&mut self) -> bool {
        self.alive.load(Ordering::Relaxed) && matches!(self.child.try_wait(), Ok(None))
    }

    fn send(&self, msg: &Value) -> Result<(), RpcError> {
        let mut line = serde_json::to_vec(msg).map_err(|_| RpcError::Closed)?;
        line.push(b'\n');
        self.to_child.send(line).map_err(|_| RpcError::Closed)
    }

    /// Sends a request and waits for the reply with its id, skipping notifications,
    /// lines that are not JSON and late replies to requests that timed out.
    async fn request(
        &mut self,
        method: &str,
        params: Value,
        deadline: Instant,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<Value, RpcError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let deadline = tokio::time::Instant::from_std(deadline);
        loop {
            let line = tokio::select! {
                l = self.lines.recv() => l.ok_or(RpcError::Closed)?,
                _ = tokio::time::sleep_until(deadline) => return Err(RpcError::TimedOut),
                _ = stop.wait_for(|s| *s) => return Err(RpcError::Cancelled),
            };
            let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                log::debug!("MCP: a line that is not JSON skipped");
                continue;
            };
            if msg.get("id").and_then(Value::as_u64) == Some(id) {
                return Ok(msg);
            }
        }
    }

    /// `initialize`, then the `initialized` notification.
    async fn initialize(
        &mut self,
        deadline: Instant,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), String> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "wgllm", "version": env!("CARGO_PKG_VERSION")},
        });
        let reply = (self.request("initialize", params, deadline, stop).await)
            .map_err(|e| e.message().to_owned())?;
        if reply.get("result").is_none() {
            return Err(rpc_error_text(&reply).unwrap_or("no result".into()));
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.send(&note).map_err(|e| e.message().to_owned())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The child's group is killed and the child reaped at once; nothing waits for the
        // pipes, which a process that left the group may still hold.
        #[cfg(unix)]
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on the group this session created; no memory is involved.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rpc_error_text(reply: &Value) -> Option<String> {
    let e = reply.get("error")?;
    Some(
        e.get("message")
            .and_then(Value::as_str)
            .map_or_else(|| e.to_string(), str::to_owned),
    )
}

/// A `tools/call` reply as `/tools` answers it: the text parts joined, or an error.
fn call_reply(reply: &Value) -> Value {
    if let Some(e) = rpc_error_text(reply) {
        return json!({"error": e});
    }
    let Some(result) = reply.get("result") else {
        return json!({"error": "invalid response from MCP server"});
    };
    let text: Vec<&str> = (result.get("content").and_then(Value::as_array))
        .into_iter()
        .flatten()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    let text = text.join("\n");
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let msg = if text.is_empty() {
            "MCP tool returned an error".to_owned()
        } else {
            text
        };
        return json!({"error": msg});
    }
    json!({"plain_text_response": text})
}

/// One configured server: its tools as listed at startup, and its process once a call
/// started it.
struct Server {
    cfg: ServerConfig,
    /// Held for a whole request: one request at a time per server, as llama-server does.
    session: tokio::sync::Mutex<Option<Session>>,
    /// A start failed: no new start before this.
    cooldown_until: Mutex<Option<Instant>>,
}

/// Every configured MCP server.
pub struct Mcp {
    servers: Vec<Server>,
    tools: Vec<Tool>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Mcp {
    /// Starts each server once to list its tools, then closes it. A server that fails
    /// here is logged and keeps no tools (so none of its tools can be called), as with
    /// llama-server.
    pub async fn start(configs: Vec<ServerConfig>) -> Mcp {
        let (stop, _) = tokio::sync::watch::channel(false);
        let mut tools = Vec::new();
        for (i, cfg) in configs.iter().enumerate() {
            let began = Instant::now();
            match list_tools(cfg, &mut stop.subscribe()).await {
                Ok(list) => {
                    log::info!(
                        "MCP server {}: {} tools ({:.1} s)",
                        cfg.name,
                        list.len(),
                        began.elapsed().as_secs_f32()
                    );
                    tools.extend(list.into_iter().map(|mut t| {
                        t.server = i;
                        t
                    }));
                }
                Err(e) => log::warn!("MCP server {}: {e}; its tools are not offered", cfg.name),
            }
        }
        Mcp {
            servers: configs
                .into_iter()
                .map(|cfg| Server {
                    cfg,
                    session: Default::default(),
                    cooldown_until: Default::default(),
                })
                .collect(),
            tools,
            stop,
        }
    }

    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    pub fn server_name(&self, i: usize) -> &str {
        &self.servers[i].cfg.name
    }

    /// Calls `tool` with `arguments`; every failure is an `{"error"}` reply.
    pub async fn call(&self, tool: &Tool, arguments: Map<String, Value>) -> Value {
        let server = &self.servers[tool.server];
        let mut stop = self.stop.subscribe();
        if *stop.borrow() {
            return json!({"error": "cancelled"});
        }
        let mut slot = tokio::select! {
            s = server.session.lock() => s,
            _ = stop.wait_for(|s| *s) => return json!({"error": "cancelled"}),
        };
        let deadline = Instant::now() + server.cfg.timeout;
        if slot.as_mut().is_some_and(|s| !s.is_alive()) {
            log::info!(
                "MCP server {}: the process ended; starting it again",
                server.cfg.name
            );
            *slot = None;
        }
        if slot.is_none() {
            let cooling =
                (server.cooldown_until.lock().unwrap()).is_some_and(|t| Instant::now() < t);
            if cooling {
                return json!({"error": format!("MCP server unavailable: {}", server.cfg.name)});
            }
            let mut session = match Session::spawn(&server.cfg) {
                Ok(s) => s,
                Err(e) => {
                    log::warn!("MCP server {}: cannot start: {e}", server.cfg.name);
                    *server.cooldown_until.lock().unwrap() = Some(Instant::now() + COOLDOWN);
                    return json!({"error": format!("MCP server unavailable: {}", server.cfg.name)});
                }
            };
            if let Err(e) = session.initialize(deadline, &mut stop).await {
                return json!({"error": format!("initialize failed: {e}")});
            }
            *slot = Some(session);
        }
        let Some(session) = slot.as_mut() else {
            return json!({"error": "transport closed"});
        };
        let params = json!({"name": tool.name, "arguments": arguments});
        match session
            .request("tools/call", params, deadline, &mut stop)
            .await
        {
            Ok(reply) => call_reply(&reply),
            Err(e) => {
                if e == RpcError::Closed {
                    *slot = None;
                }
                json!({"error": e.message()})
            }
        }
    }

    /// Cancels the calls in flight and ends every server process (without waiting for
    /// their pipes).
    pub async fn shutdown(&self) {
        // Stored even with no call waiting (`send` would drop it then).
        self.stop.send_replace(true);
        for s in &self.servers {
            // A call in flight ends within moments of the flag; do not wait longer.
            if let Ok(mut slot) =
                tokio::time::timeout(Duration::from_secs(1), s.session.lock()).await
            {
                slot.take();
            }
        }
    }
}

/// Starts a server, asks it for its tools and closes it again.
async fn list_tools(
    cfg: &ServerConfig,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<Tool>, String> {
    let deadline = Instant::now() + cfg.timeout.min(WARMUP_LIMIT);
    let mut session =
        Session::spawn(cfg).map_err(|e| format!("cannot start {:?}: {e}", cfg.command))?;
    session
        .initialize(deadline, stop)
        .await
        .map_err(|e| format!("initialize failed: {e}"))?;
    let reply = (session
        .request("tools/list", json!({}), deadline, stop)
        .await)
        .map_err(|e| format!("tools/list: {}", e.message()))?;
    if let Some(e) = rpc_error_text(&reply) {
        return Err(format!("tools/list: {e}"));
    }
    let list = (reply.pointer("/result/tools").and_then(Value::as_array))
        .ok_or("tools/list: the reply has no result.tools")?;
    Ok(list
        .iter()
        .filter_map(|t| {
            Some(Tool {
                server: 0,
                name: t.get("name")?.as_str()?.to_owned(),
                description: (t.get("description").and_then(Value::as_str))
                    .unwrap_or_default()
                    .to_owned(),
                input_schema: t.get("inputSchema").cloned().unwrap_or(json!({})),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_read_as_llama_server_reads_them() {
        let c = parse_config(
            r#"{"mcpServers": {
                "a": {"command": "python3", "args": ["s.py", "-v"], "env": {"K": "V"}, "timeout_ms": 500},
                "web": {"url": "http://x/mcp"},
                "b": {"command": "b", "cwd": "/tmp"}}}"#,
        )
        .unwrap();
        assert_eq!(c.len(), 2, "the URL server is skipped");
        assert_eq!(c[0].args, ["s.py", "-v"]);
        assert_eq!(c[0].env, [("K".to_string(), "V".to_string())]);
        assert_eq!(c[0].timeout, Duration::from_millis(500));
        assert_eq!(c[1].timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert_eq!(c[1].cwd.as_deref(), Some(std::path::Path::new("/tmp")));
        assert!(parse_config("{}").unwrap().is_empty());
        let e = parse_config("not valid json").unwrap_err();
        assert!(e.starts_with("failed to parse MCP config JSON"), "{e}");
        let e = parse_config(r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#);
        assert!(e.is_err());
        let e = read_configs(Some(std::path::Path::new("/nonexistent/path.json")), None);
        assert!(e.unwrap_err().starts_with("failed to open MCP config file"));
        let both = read_configs(
            None,
            Some(r#"{"mcpServers": {"a": {"command": "x"}, "a2": {"command": "y"}}}"#),
        )
        .unwrap();
        assert_eq!(both.len(), 2);
    }

    #[test]
    fn lines_split_across_reads_bursts_and_crlf() {
        let mut s = LineSplitter::default();
        let mut out = Vec::new();
        s.push(b"{\"a\":1}\n{\"b\"", &mut out);
        assert_eq!(out, ["{\"a\":1}"]);
        s.push(b":2}\r\n\n{\"c\":3}\n", &mut out);
        assert_eq!(out, ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"]);
        out.clear();
        s.push(&vec![b'x'; MAX_LINE + 10], &mut out);
        s.push(b"yyy\nok\n", &mut out);
        assert_eq!(out, ["ok"], "the long line is dropped whole");
    }

    #[test]
    fn call_replies_take_text_parts_and_errors() {
        let r = call_reply(&json!({"id": 1, "result": {"content": [
            {"type": "text", "text": "a"}, {"type": "image", "data": "…"}, {"type": "text", "text": "b"}]}}));
        assert_eq!(r, json!({"plain_text_response": "a\nb"}));
        let r = call_reply(&json!({"id": 1, "result": {"content": [], "isError": true}}));
        assert_eq!(r, json!({"error": "MCP tool returned an error"}));
        let r =
            call_reply(&json!({"id": 1, "error": {"code": -32000, "message": "transient error"}}));
        assert_eq!(r, json!({"error": "transient error"}));
        let r = call_reply(&json!({"id": 1}));
        assert_eq!(r, json!({"error": "invalid response from MCP server"}));
    }

    /// A tiny MCP server in sh: answers initialize, tools/list and tools/call by id
    /// (ids are small integers), after a notification; `sleep` tools never answer.
    #[cfg(unix)]
    fn script_server(name: &str, timeout_ms: u64) -> ServerConfig {
        let script = r#"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
  [ -z "$id" ] && continue
  case "$line" in
    *'"initialize"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"capabilities":{}}}\n' "$id" ;;
    *'"tools/list"'*) printf 'garbage\n{"jsonrpc":"2.0","method":"notifications/progress"}\n{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"echo","description":"Echo","inputSchema":{"type":"object","properties":{}}},{"name":"sleep"}]}}\n' "$id" ;;
    *'"sleep"'*) sleep 30 ;;
    *'"die"'*) exit 3 ;;
    *) printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"echoed %s"}]}}\n' "$id" "$id" ;;
  esac
done
"#;
        ServerConfig {
            name: name.into(),
            command: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            cwd: None,
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_stdio_server_lists_calls_times_out_and_restarts() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let bad = ServerConfig {
                command: "this_executable_does_not_exist_12345".into(),
                ..script_server("bad", 1000)
            };
            let mcp = Mcp::start(vec![script_server("s", 1500), bad]).await;
            let names: Vec<&str> = mcp.tools().iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, ["echo", "sleep"], "the bad server lists nothing");
            let echo = mcp.tools()[0].clone();
            // A new process per server: initialize is id 1, so the first call is id 2.
            let r = mcp.call(&echo, Map::new()).await;
            assert_eq!(r, json!({"plain_text_response": "echoed 2"}));
            let r = mcp.call(&echo, Map::new()).await;
            assert_eq!(
                r,
                json!({"plain_text_response": "echoed 3"}),
                "the process is kept"
            );
            // A dead process is replaced by a new one at the next call.
            let die = Tool {
                name: "die".into(),
                ..echo.clone()
            };
            let r = mcp.call(&die, Map::new()).await;
            assert_eq!(r, json!({"error": "transport closed"}));
            let r = mcp.call(&echo, Map::new()).await;
            assert_eq!(
                r,
                json!({"plain_text_response": "echoed 2"}),
                "a new process"
            );
            let sleep = mcp.tools()[1].clone();
            let t = Instant::now();
            let r = mcp.call(&sleep, Map::new()).await;
            assert_eq!(r, json!({"error": "request timed out"}));
            assert!(t.elapsed() < Duration::from_secs(5));
            // Stopping cancels a call in flight at once.
            let mcp = Arc::new(mcp);
            let m = mcp.clone();
            let pending = tokio::spawn(async move { m.call(&sleep, Map::new()).await });
            tokio::time::sleep(Duration::from_millis(200)).await;
            let t = Instant::now();
            mcp.shutdown().await;
            let r = pending.await.unwrap();
            assert_eq!(r, json!({"error": "cancelled"}));
            assert!(t.elapsed() < Duration::from_secs(2));
        });
    }
}
