//! `wgllm serve` on SmolLM2 over real sockets (127.0.0.1 only): bad input gets its
//! status code and error object and the server keeps answering; hostile requests (deep
//! grammars and schemas, sizes that multiply, slots that do not exist, slow bodies) get
//! a bounded answer; API keys; streams end with `[DONE]`; a client that goes away
//! mid-stream frees its slot, also while nothing is being written to it.
//! (llama.cpp's own server suite runs against it in scripts/server-tests.sh.)

mod common;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(extra: &[&str]) -> Server {
    start_with_env(extra, &[])
}

fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
    start_model(&common::smollm2(), extra, env)
}

fn start_model(model: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
    start_at(free_port(), model, extra, env)
}

/// A server listening on `port`: given by --port, or where `env` has `AIP_HTTP_PORT`
/// (which must then be `port`), by that alone (--port names a port it must not use).
fn start_at(port: u16, model: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let aip = env.iter().any(|(k, _)| *k == "AIP_HTTP_PORT");
    let mut args = vec!["serve", "-m", model, "--port"];
    let p = if aip {
        "1".to_string()
    } else {
        port.to_string()
    };
    args.push(&p);
    args.extend_from_slice(extra);
    let child = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(&args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Server { child, port }.ready(Duration::from_secs(180))
}

impl Server {
    /// The server once `/health` answers 200 (it fails the test past `limit`).
    fn ready(self, limit: Duration) -> Server {
        let t0 = Instant::now();
        while self
            .try_request("GET", "/health", &[], "")
            .map(|r| r.0)
            .ok()
            != Some(200)
        {
            assert!(t0.elapsed() < limit, "the server did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        self
    }

    fn connect(&self) -> std::io::Result<TcpStream> {
        let c = TcpStream::connect(("127.0.0.1", self.port))?;
        c.set_read_timeout(Some(Duration::from_secs(300)))?;
        Ok(c)
    }

    fn send(
        &self,
        c: &mut TcpStream,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<()> {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        c.write_all(req.as_bytes())?;
        c.write_all(body.as_bytes())
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<(u16, String)> {
        let mut c = self.connect()?;
        self.send(&mut c, method, path, headers, body)?;
        let mut raw = Vec::new();
        c.read_to_end(&mut raw)?;
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let status = raw
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        };
        Ok((status, body))
    }

    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.try_request(method, path, &[], body).unwrap()
    }

    fn json(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let (st, b) = self.request(method, path, &body.to_string());
        (st, serde_json::from_str(&b).unwrap_or(Value::String(b)))
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn assert_error(st: u16, body: &Value, want: u16, kind: &str) {
    assert_eq!(st, want, "{body}");
    assert_eq!(body["error"]["code"], want, "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[test]
fn bad_input_gets_its_status_and_the_server_goes_on() {
    let dir = std::env::temp_dir().join(format!("wgllm-slots-{}", std::process::id()));
    let dirs = dir.to_string_lossy().into_owned();
    let s = start(&[
        "-c",
        "256",
        "-np",
        "1",
        "--slot-save-path",
        &dirs,
        "--max-body-mib",
        "1",
        "--metrics",
    ]);
    let (st, b) = s.request("POST", "/completion", "{\"prompt\": ");
    let b: Value = serde_json::from_str(&b).unwrap();
    assert_error(st, &b, 400, "invalid_request_error");
    // No architecture with a decision head loads: llama-server's answer for any other
    // model, whatever the request.
    for body in [
        json!({}),
        json!({"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}}}),
    ] {
        let (st, b) = s.json("POST", "/v1/systemone", body);
        assert_error(st, &b, 501, "not_supported_error");
        assert_eq!(b["error"]["message"], "This model is not a decision model");
    }
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "temperature": "hot"}),
    );
    assert_error(st, &b, 400, "invalid_request_error");
    assert!(b["error"]["message"]
        .as_str()
        .unwrap()
        .contains("temperature"));
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "n_predict": -5}),
    );
    assert_error(st, &b, 400, "invalid_request_error");
    let (st, b) = s.json("POST", "/completion", json!({"prompt": 42.5}));
    assert_error(st, &b, 400, "invalid_request_error");
    let (st, b) = s.json("POST", "/completion", json!({"prompt": [1, 99999999]}));
    assert_error(st, &b, 400, "invalid_request_error");
    let long = "word ".repeat(400);
    let (st, b) = s.json("POST", "/completion", json!({"prompt": long}));
    assert_eq!(st, 400, "{b}");
    assert!(b["error"]["message"]
        .as_str()
        .unwrap()
        .contains("exceeds the available context size"));
    let (st, b) = s.json("POST", "/v1/chat/completions", json!({"messages": "hello"}));
    assert_error(st, &b, 400, "invalid_request_error");
    for name in ["../escape.bin", "a/b.bin", "..", ".hidden", "a\\b"] {
        let (st, b) = s.json("POST", "/slots/0?action=save", json!({"filename": name}));
        assert_error(st, &b, 400, "invalid_request_error");
    }
    let (st, b) = s.json("POST", "/slots/7?action=erase", json!({}));
    assert_error(st, &b, 400, "invalid_request_error");
    // Over the body limit: a 413 as a JSON error, declared or not.
    let (st, b) = s.request(
        "POST",
        "/completion",
        &format!("{{\"prompt\": \"{}\"}}", "a".repeat(2 << 20)),
    );
    let b: Value = serde_json::from_str(&b).unwrap_or_else(|_| panic!("not JSON: {b}"));
    assert_error(st, &b, 413, "invalid_request_error");
    // A wrong method's error object carries the status it is sent with.
    let (st, b) = s.json("GET", "/completion", json!({}));
    assert_error(st, &b, 405, "invalid_request_error");
    let (st, b) = s.json("GET", "/no/such/endpoint", json!({}));
    assert_error(st, &b, 404, "not_found_error");
    let (st, b) = s.json("POST", "/v1/embeddings", json!({"input": "x"}));
    assert_error(st, &b, 501, "not_supported_error");
    // SmolLM2 has no fill-in-the-middle tokens.
    let (st, b) = s.json(
        "POST",
        "/infill",
        json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_error(st, &b, 501, "not_supported_error");
    // A huge n_predict ends where the slot's context does (no context shift).
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "n_predict": 1_000_000_000, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["truncated"], true);
    assert_eq!(b["stop_type"], "limit");
    let n_prompt = b["tokens_evaluated"].as_u64().unwrap();
    assert_eq!(b["tokens_predicted"].as_u64().unwrap() + n_prompt, 256);
    // Still answering, with slot files that do work.
    let (st, b) = s.json(
        "POST",
        "/slots/0?action=save",
        json!({"filename": "ok.bin"}),
    );
    assert_eq!(st, 200, "{b}");
    assert!(b["n_saved"].as_u64().unwrap() > 0);
    let (st, b) = s.json(
        "POST",
        "/slots/0?action=restore",
        json!({"filename": "ok.bin"}),
    );
    assert_eq!(st, 200, "{b}");
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "n_predict": 2}),
    );
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["tokens_predicted"], 2);
    let (st, m) = s.request("GET", "/metrics", "");
    assert_eq!(st, 200);
    for name in [
        "llamacpp:prompt_tokens_total",
        "llamacpp:requests_deferred",
        "llamacpp:requests_processing",
        "llamacpp:kv_cache_usage_ratio",
        "wgllm:gpu_buffer_bytes",
        "wgllm:prompt_cache_bytes",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics:\n{m}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn api_keys_streams_and_disconnects() {
    let s = start(&["-np", "1", "--api-key", "sk-right"]);
    let auth = [("Authorization", "Bearer sk-right")];
    let body = json!({"prompt": "Hi", "n_predict": 1}).to_string();
    for h in [
        &[][..],
        &[("Authorization", "Bearer sk-wrong")][..],
        &[("Authorization", "sk-right")][..],
    ] {
        let (st, b) = s.try_request("POST", "/completion", h, &body).unwrap();
        let b: Value = serde_json::from_str(&b).unwrap();
        assert_error(st, &b, 401, "authentication_error");
    }
    assert_eq!(s.try_request("GET", "/health", &[], "").unwrap().0, 200);
    assert_eq!(s.try_request("GET", "/v1/models", &[], "").unwrap().0, 200);
    let (st, b) = s.try_request("POST", "/completion", &auth, &body).unwrap();
    assert_eq!(st, 200, "{b}");
    let (st, b) = s
        .try_request("POST", "/completion", &[("X-Api-Key", "sk-right")], &body)
        .unwrap();
    assert_eq!(st, 200, "{b}");

    // A streamed chat ends with [DONE] after a finish_reason.
    let chat = json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "stream": true, "temperature": 0}).to_string();
    let (st, b) = s
        .try_request("POST", "/v1/chat/completions", &auth, &chat)
        .unwrap();
    assert_eq!(st, 200, "{b}");
    let events: Vec<&str> = b.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{b}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // A client that goes away mid-stream frees the only slot at once.
    let endless = json!({"prompt": "Once upon a time", "n_predict": 100000, "stream": true, "ignore_eos": true}).to_string();
    read_some_then_hang_up(&s, "/completion", &auth, &endless, 3);
    let t0 = Instant::now();
    let (st, b) = s.try_request("POST", "/completion", &auth, &body).unwrap();
    assert_eq!(st, 200, "{b}");
    // Queued behind the endless stream, it would never have been answered.
    assert!(t0.elapsed() < Duration::from_secs(120));
}

/// The text of a native stream's events, and whether one of them ended it.
fn stream_text(sse: &str) -> (String, bool) {
    let mut text = String::new();
    let mut ended = false;
    for e in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: Value = serde_json::from_str(e).unwrap();
        text.push_str(v["content"].as_str().unwrap_or(""));
        ended |= v["stop"] == true;
    }
    (text, ended)
}

/// Reads a stream's head and its first `n` events, then hangs up.
fn read_some_then_hang_up(s: &Server, path: &str, headers: &[(&str, &str)], body: &str, n: usize) {
    let mut c = s.connect().unwrap();
    s.send(&mut c, "POST", path, headers, body).unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    let mut n_data = 0;
    while n_data < n {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        n_data += line.starts_with("data: ") as usize;
    }
}

#[test]
fn a_stream_with_a_conversation_id_outlives_its_client() {
    let s = start(&["-np", "1"]);
    // An id with a model name in it, as llama-server's web UI sends: it travels escaped.
    let id = [("X-Conversation-Id", "conv-1::org/model:Q8_0")];
    let q = "conv_id=conv-1%3A%3Aorg%2Fmodel%3AQ8_0";
    let req = json!({"prompt": "The capital of France is", "n_predict": 24, "temperature": 0, "ignore_eos": true});
    let (st, alone) = s.json("POST", "/completion", req.clone());
    assert_eq!(st, 200, "{alone}");

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    read_some_then_hang_up(&s, "/completion", &id, &streamed.to_string(), 2);
    // The generation goes on without its client; the replay follows it to its end.
    let (st, replay) = s.request("GET", &format!("/v1/stream?{q}&from=0"), "");
    assert_eq!(st, 200, "{replay}");
    let (text, ended) = stream_text(&replay);
    assert!(ended, "{replay}");
    assert_eq!(text, alone["content"].as_str().unwrap());
    // From a later offset, the rest.
    let cut = replay.find("\n\n").unwrap() + 2;
    let (st, rest) = s.request("GET", &format!("/v1/stream?{q}&from={cut}"), "");
    assert_eq!(st, 200);
    assert_eq!(rest, replay[cut..]);
    let (st, found) = s.json(
        "POST",
        "/v1/streams/lookup",
        json!({"conversation_ids": ["conv-1", "conv-2"]}),
    );
    assert_eq!(st, 200, "{found}");
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
    assert_eq!(found[0]["is_done"], true);
    assert_eq!(found[0]["total_bytes"], replay.len());

    // Stop: 204, then the stream is gone; bad queries are 400s.
    assert_eq!(s.request("DELETE", &format!("/v1/stream?{q}"), "").0, 204);
    assert_eq!(
        s.request("GET", &format!("/v1/stream?{q}&from=0"), "").0,
        404
    );
    assert_eq!(s.request("DELETE", &format!("/v1/stream?{q}"), "").0, 204);
    assert_eq!(s.request("GET", "/v1/stream?from=0", "").0, 400);
    assert_eq!(s.request("DELETE", "/v1/stream", "").0, 400);

    // A stop cancels a generation that no client is reading: the only slot is free
    // again (else the next request would wait for 100 000 tokens).
    let endless = json!({"messages": [{"role": "user", "content": "Count to a million"}], "max_tokens": 100000, "stream": true, "ignore_eos": true}).to_string();
    read_some_then_hang_up(&s, "/v1/chat/completions", &id, &endless, 2);
    let (st, live) = s.json(
        "POST",
        "/v1/streams/lookup",
        json!({"conversation_ids": ["conv-1"]}),
    );
    assert_eq!(st, 200);
    assert_eq!(live[0]["is_done"], false, "{live}");
    assert_eq!(s.request("DELETE", &format!("/v1/stream?{q}"), "").0, 204);
    let t0 = Instant::now();
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "n_predict": 1}),
    );
    assert_eq!(st, 200, "{b}");
    assert!(t0.elapsed() < Duration::from_secs(120));

    // A request under an id whose client leaves before its reply starts (queued behind
    // a generation on the only slot) leaves no stream behind (64 such would have
    // refused every later id).
    let lookup = |id: &str| {
        s.json(
            "POST",
            "/v1/streams/lookup",
            json!({"conversation_ids": [id]}),
        )
        .1
    };
    read_some_then_hang_up(
        &s,
        "/v1/chat/completions",
        &[("X-Conversation-Id", "busy")],
        &endless,
        2,
    );
    let mut c = s.connect().unwrap();
    let queued = json!({"prompt": "Hi", "n_predict": 4, "stream": true}).to_string();
    s.send(
        &mut c,
        "POST",
        "/completion",
        &[("X-Conversation-Id", "gone")],
        &queued,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lookup("gone")[0]["is_done"], false, "kept while it waits");
    drop(c);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(lookup("gone"), json!([]), "forgotten once its client left");
    assert_eq!(s.request("DELETE", "/v1/stream?conv_id=busy", "").0, 204);
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a location",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                       "required": ["location"]}}})
}

/// The arguments of a call, which must be a JSON object with a string `location`.
fn assert_weather_args(args: &Value) {
    assert!(args["location"].is_string(), "{args}");
}

/// Asks for the weather with a required call; checks the reply is one `get_weather`
/// call with a location and returns it.
fn required_weather_call(s: &Server) -> Value {
    let ask = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let (st, b) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": ask, "tools": [weather_tool()], "tool_choice": "required", "max_tokens": 60}),
    );
    assert_eq!(st, 200, "{b}");
    let choice = &b["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{b}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert!(call["id"].as_str().is_some_and(|id| !id.is_empty()));
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_weather_args(&args);
    call.clone()
}

/// Tools on the chat and Messages endpoints: a required call comes back as OpenAI's
/// `tool_calls` (whole, or streamed as one delta before `finish_reason: "tool_calls"`) and
/// as an Anthropic `tool_use` block, whatever SmolLM2 would have written without the
/// grammar; earlier calls and results in the history render; what cannot be honoured is a
/// 400.
#[test]
fn tool_calls_come_back_as_calls() {
    let s = start(&["-np", "1"]);
    let ask = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    required_weather_call(&s);

    let stream = json!({"messages": ask, "tools": [weather_tool()], "tool_choice": "required",
                        "max_tokens": 60, "stream": true});
    let (st, b) = s.request("POST", "/v1/chat/completions", &stream.to_string());
    assert_eq!(st, 200, "{b}");
    let events: Vec<&str> = b.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{b}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let call = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .unwrap_or_else(|| panic!("no tool_calls delta in {b}"));
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["index"], 0);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );

    let anthropic = json!({"model": "m", "max_tokens": 60, "messages": ask,
        "tool_choice": {"type": "any"},
        "tools": [{"name": "get_weather", "description": "Weather",
                   "input_schema": weather_tool()["function"]["parameters"]}]});
    let (st, b) = s.json("POST", "/v1/messages", anthropic);
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["stop_reason"], "tool_use", "{b}");
    let block = &b["content"][0];
    assert_eq!(block["type"], "tool_use", "{b}");
    assert_eq!(block["name"], "get_weather");
    assert_weather_args(&block["input"]);

    // History with a call and its result (OpenAI's and Anthropic's forms) renders.
    let history = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 25 C"},
    ]);
    let (st, b) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": history, "max_tokens": 4}),
    );
    assert_eq!(st, 200, "{b}");
    assert!(b["choices"][0]["message"]["content"].is_string(), "{b}");
    let (st, b) = s.json("POST", "/v1/messages", json!({"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"location": "Paris"}}]},
        {"role": "user", "content": [{"type": "text", "text": "Results:"},
                                     {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}]},
    ]}));
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["content"][0]["type"], "text", "{b}");

    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": ask, "tools": [weather_tool()], "grammar": "root ::= \"a\""}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": ask, "tools": {"get_weather": {}}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": ask, "tools": [weather_tool()], "tool_choice": "sometimes"}),
        ),
        (
            "/v1/responses",
            json!({"input": "Weather?", "tools": [{"type": "function", "name": "get_weather"}]}),
        ),
        // A call cannot be continued as a prefill.
        (
            "/v1/chat/completions",
            json!({"messages": [ask[0].clone(), history[1].clone()]}),
        ),
    ] {
        let (st, b) = s.json("POST", path, body);
        assert_error(st, &b, 400, "invalid_request_error");
    }
    assert_eq!(s.request("GET", "/health", "").0, 200);
}

/// A template that renders tools itself (Qwen 2.5's) gets the tool list and the history's
/// calls and results as fields, and a required call comes back from its own
/// `<tool_call>` syntax, which the grammar holds SmolLM2 to.
#[test]
fn a_template_that_knows_tools_renders_them_and_its_calls_are_read_back() {
    let tpl = common::llamacpp_tests_dir().join("templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    let s = start(&["-np", "1", "--chat-template-file", tpl.to_str().unwrap()]);
    let history = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 25 C"},
    ]);
    let (st, b) = s.json(
        "POST",
        "/apply-template",
        json!({"messages": history, "tools": [weather_tool()]}),
    );
    assert_eq!(st, 200, "{b}");
    let prompt = b["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("<tools>") && prompt.contains("\"get_weather\""),
        "{prompt}"
    );
    assert!(
        prompt.contains(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}"
        ),
        "{prompt}"
    );
    assert!(
        prompt.contains("<tool_response>\nSunny, 25 C\n</tool_response>"),
        "{prompt}"
    );

    required_weather_call(&s);
}

/// A request that crashed, hung or exhausted the server before: each gets its 400 (or a
/// bounded answer) and the server answers the next one.
#[test]
fn hostile_requests_get_a_bounded_answer_and_the_server_goes_on() {
    let s = start(&["-c", "2048", "-np", "1", "-to", "3"]);
    let alive = |s: &Server| {
        let (st, b) = s.json(
            "POST",
            "/completion",
            json!({"prompt": "Hi", "n_predict": 2, "temperature": 0}),
        );
        assert_eq!(st, 200, "{b}");
        assert_eq!(b["tokens_predicted"], 2, "{b}");
    };
    let refused = |s: &Server, path: &str, body: Value, says: &str| {
        let t0 = Instant::now();
        let (st, b) = s.json("POST", path, body);
        assert_error(st, &b, 400, "invalid_request_error");
        let m = b["error"]["message"].as_str().unwrap();
        assert!(m.contains(says), "{says:?} not in {m:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "took {:?}",
            t0.elapsed()
        );
    };
    // A GBNF grammar of groups 100 000 deep overflowed a worker's stack (the process
    // aborted, every client with it).
    let deep = format!(
        "root ::= {}\"a\"{}",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "grammar": deep}),
        "nested more than",
    );
    // A chain of rules each starting with the next.
    let mut chain = String::from("root ::= r0\n");
    for i in 0..100_000 {
        chain.push_str(&format!("r{i} ::= r{} \"a\"\n", i + 1));
    }
    chain.push_str("r100000 ::= \"x\"\n");
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "grammar": chain}),
        "simplify",
    );
    // A repeated literal whose length times its count is gigabytes.
    let big = format!("root ::= ( \"{}\"{{2000}} ){{2000}}", "x".repeat(4000));
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "grammar": big}),
        "",
    );
    // JSON schemas: a $ref chain 10 000 long, and one that refers to itself through allOf.
    let mut defs = serde_json::Map::new();
    for i in 0..10_000 {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert("d10000".into(), json!({"type": "string"}));
    let schema = json!({"$ref": "#/$defs/d0", "$defs": defs});
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "json_schema": schema}),
        "deep",
    );
    let cyclic = json!({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}});
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "n_predict": 4, "json_schema": cyclic}),
    );
    assert!(st == 200 || st == 400, "{st} {b}");
    // An object whose properties refer back to it through allOf, without end.
    let looped = json!({"$ref": "#/$defs/d", "$defs": {"d": {"properties": {"x": {"allOf": [{"$ref": "#/$defs/d"}]}}}}});
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "json_schema": looped}),
        "deep",
    );
    // Optional properties by the thousand: linear work, not quadratic (nor recursion
    // that deep).
    let props: serde_json::Map<String, Value> = (0..3000)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let wide = json!({"type": "object", "properties": props});
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "{", "n_predict": 4, "json_schema": wide}),
    );
    assert_eq!(st, 200, "{b}");
    // An ambiguous grammar whose matcher doubles per character (and that allows only
    // 'a's until then) ends the generation with an error that says why.
    refused(
        &s,
        "/completion",
        json!({"prompt": "a", "n_predict": 64, "temperature": 0,
               "grammar": "root ::= \"a\" root \"b\" | \"a\" root \"c\""}),
        "ambiguous or deeply recursive grammar",
    );
    // A dozen repetitions stacked on one any-character (a fuzzer's find): each token
    // costs bounded work, and the generation goes on or ends as above.
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "n_predict": 16, "temperature": 0,
               "grammar": "root ::= (......*..++++++++++++)"}),
    );
    assert!(
        st == 200 || (st == 400 && b.to_string().contains("deeply recursive grammar")),
        "{st} {b}"
    );
    // Stop strings by the thousand, prompts by the thousand.
    let stops: Vec<String> = (0..1000).map(|i| format!("stop{i}")).collect();
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "stop": stops}),
        "stop",
    );
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "stop": ["x".repeat(100_000)]}),
        "stop string",
    );
    let prompts: Vec<String> = (0..5000).map(|i| format!("p{i}")).collect();
    refused(&s, "/completion", json!({"prompt": prompts}), "prompts");
    // A slot that does not exist: refused at once, not queued for ever.
    refused(
        &s,
        "/completion",
        json!({"prompt": "Hi", "id_slot": 5, "n_predict": 1}),
        "id_slot 5",
    );
    // A message without a role, as llama-server.
    refused(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"content": "hello"}]}),
        "Missing 'role' in message",
    );
    refused(
        &s,
        "/v1/messages",
        json!({"max_tokens": 4, "messages": [{"content": "hello"}]}),
        "Missing 'role' in message",
    );
    alive(&s);
    // A body that never arrives: a 408 after the timeout (-to 3), not a held connection.
    let mut c = s.connect().unwrap();
    c.write_all(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n{\"prompt\"")
        .unwrap();
    let t0 = Instant::now();
    let mut raw = String::new();
    let _ = c.read_to_string(&mut raw);
    assert!(raw.starts_with("HTTP/1.1 408"), "{raw}");
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let b: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {raw}"));
    assert_error(408, &b, 408, "timeout_error");
    assert!(t0.elapsed() < Duration::from_secs(60));
    // A streamed chat with tools holds every token back (it may be a call): its client
    // leaving must still stop it, though nothing is written after the first event.
    let held = json!({
        "messages": [{"role": "user", "content": "Tell me a long story"}],
        "tools": [weather_tool()], "stream": true, "max_tokens": 100000,
        "ignore_eos": true, "temperature": 0,
    })
    .to_string();
    read_some_then_hang_up(&s, "/v1/chat/completions", &[], &held, 1);
    let t0 = Instant::now();
    alive(&s);
    // Behind ~2000 held tokens on the only slot it would have waited minutes.
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "waited {:?}",
        t0.elapsed()
    );
}

/// A greedy chat turn's reply text.
fn chat_reply(s: &Server, messages: &Value) -> String {
    let (st, b) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": messages, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(st, 200, "{b}");
    b["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The GPU faults users meet, injected (WGLLM_FAULT): the device lost in the middle of a
/// streamed reply, and an allocation that does not fit. The client in flight gets an
/// error; the server goes on, its next answers equal to a fresh server's (greedy), a
/// conversation continued across the loss included (its prompt decoded again).
#[test]
fn gpu_faults_mid_generation_fail_the_request_and_the_server_goes_on() {
    let first = json!([{"role": "user", "content": "Name a colour."}]);
    let fresh = start(&["-c", "1024", "-np", "1"]);
    let a1 = chat_reply(&fresh, &first);
    let second = json!([{"role": "user", "content": "Name a colour."},
                        {"role": "assistant", "content": a1},
                        {"role": "user", "content": "And another one?"}]);
    let a2 = chat_reply(&fresh, &second);
    drop(fresh);

    // Lost at the 12th submission after loading: inside the streamed reply below.
    let s = start_with_env(
        &["-c", "1024", "-np", "1"],
        &[("WGLLM_FAULT", "device-lost@12")],
    );
    let body = json!({"prompt": "Once upon a time", "n_predict": 64, "stream": true,
                      "temperature": 0, "ignore_eos": true})
    .to_string();
    let (st, sse) = s.try_request("POST", "/completion", &[], &body).unwrap();
    assert_eq!(st, 200);
    // Some tokens, then llama-server's error event.
    assert!(sse.contains("data: "), "{sse}");
    let err: Value = sse
        .lines()
        .find_map(|l| l.strip_prefix("error: "))
        .and_then(|e| serde_json::from_str(e).ok())
        .unwrap_or_else(|| panic!("no error event: {sse}"));
    let msg = err["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{sse}"));
    assert!(msg.contains("device was lost"), "{msg}");
    // Reloaded: /health answers 200 again, and the conversation goes on as on a fresh
    // server (the slot's cache is gone; the whole prompt is decoded again).
    let t0 = Instant::now();
    while s.request("GET", "/health", "").0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(180), "not serving again");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(chat_reply(&s, &second), a2, "after the reload");
    drop(s);

    // The first allocation after loading fails as out of memory.
    let s = start_with_env(&["-c", "1024", "-np", "1"], &[("WGLLM_FAULT", "oom@1")]);
    let (st, b) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": first, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(st, 500, "{b}");
    let m = b["error"]["message"].as_str().unwrap();
    assert!(m.contains("out of GPU memory") && m.contains("-c"), "{m}");
    assert_eq!(chat_reply(&s, &first), a1, "after the failed allocation");
    assert_eq!(chat_reply(&s, &second), a2);
}

/// `/infill` against llama-server on the same files (tests/data/reference/infill.json,
/// recorded by scripts/record-infill-ref.py): synthetic llamas with StarCoder's
/// vocabulary, plain (extra files after a snippet line) and with repository tokens set
/// (`--override-kv`: the repository-level layout), in prefix-suffix-middle and
/// suffix-prefix-middle order, with prefixes, suffixes and extra files long enough to be
/// cut. The prompt laid out is the same (its text and token count), the first token's
/// distribution is the same (top-1 log-probability within 0.01), and greedy tokens are
/// the same (at a near-tie of llama.cpp's, top two within 0.02, either of the two, the
/// replies parting there if the other was taken). The models' weights are f32: with no
/// quantized products on either side the logits agree within a few thousandths, so
/// nearly every token is compared although a random model's choices are close. Bad
/// `input_extra`
/// items get a 400, as in llama.cpp's test_infill.py.
#[test]
fn infill_lays_out_prompts_as_llama_server() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/infill.json");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = common::llamacpp_tests_dir().join("vocab/ggml-vocab-starcoder.gguf");
    let dir = common::scratch_dir("infill");
    let mut compared = 0;
    for m in r["models"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let file = dir.join(format!("{name}.gguf"));
        let mut args = vec![
            "synth".to_string(),
            "--vocab-from".into(),
            vocab.to_string_lossy().into_owned(),
        ];
        args.extend(
            m["synth_args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string()),
        );
        args.extend(["-o".into(), file.to_string_lossy().into_owned()]);
        for kv in m["override_kv"].as_array().unwrap() {
            args.push("--override-kv".into());
            args.push(kv.as_str().unwrap().into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = common::wgllm(&args);
        assert_eq!(code, 0, "{err}");
        let sha = {
            use sha2::Digest;
            format!("{:x}", sha2::Sha256::digest(std::fs::read(&file).unwrap()))
        };
        assert_eq!(
            sha, m["model_sha256"],
            "{name}: synth wrote a different file than the one llama-server answered on"
        );
        let server_args: Vec<&str> = m["server_args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .take_while(|&a| a != "-ngl")
            .collect();
        for spm in [false, true] {
            let mut extra = server_args.clone();
            if spm {
                extra.push("--spm-infill");
            }
            let s = start_model(&file.to_string_lossy(), &extra, &[]);
            for c in m["cases"].as_array().unwrap().iter() {
                if c["spm"] != spm {
                    continue;
                }
                let mut body = c["request"].clone();
                for (k, v) in [
                    ("n_predict", json!(8)),
                    ("temperature", json!(0.0)),
                    ("return_tokens", json!(true)),
                    ("n_probs", json!(2)),
                    ("cache_prompt", json!(false)),
                ] {
                    body[k] = v;
                }
                let (st, b) = s.json("POST", "/infill", body);
                let what = format!("{name} spm {spm} {}", c["request"]);
                assert_eq!(st, 200, "{what}: {b}");
                assert_eq!(b["prompt"], c["prompt"], "{what}");
                assert_eq!(b["tokens_evaluated"], c["tokens_evaluated"], "{what}");
                let top1 = |v: &Value| v["top_logprobs"][0]["logprob"].as_f64().unwrap();
                let got0 = top1(&b["completion_probabilities"][0]);
                let want0 = c["top2"][0][0].as_f64().unwrap();
                assert!(
                    (got0 - want0).abs() < 0.01,
                    "{what}: first token's top log-probability {got0}, llama.cpp's {want0}"
                );
                // Equal while llama.cpp's choice is clear (f32 weights: both logits agree
                // within a few thousandths); at a near-tie, either of its top two, and the
                // two continuations part if the other was taken.
                for (i, (got, want)) in b["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .zip(c["tokens"].as_array().unwrap())
                    .enumerate()
                {
                    if got == want {
                        compared += 1;
                        continue;
                    }
                    let t = &c["top2"][i];
                    let margin = t[0].as_f64().unwrap() - t[1].as_f64().unwrap();
                    assert!(
                        margin < 0.3,
                        "{what}: token {i} is {got}, llama.cpp's {want} (margin {margin})"
                    );
                    assert_eq!(got, &c["top2_ids"][i][1], "{what}: token {i} at a near-tie");
                    break;
                }
            }
            if !spm {
                for bad in [
                    json!({}),
                    json!({"filename": "ok"}),
                    json!({"filename": 123}),
                    json!({"filename": 123, "text": "abc"}),
                    json!({"filename": 123, "text": 456}),
                ] {
                    let (st, b) = s.json(
                        "POST",
                        "/infill",
                        json!({"input_extra": [bad], "input_prefix": "a", "input_suffix": "b"}),
                    );
                    assert_error(st, &b, 400, "invalid_request_error");
                }
                let (st, b) = s.json("POST", "/infill", json!({"input_prefix": "a"}));
                assert_error(st, &b, 400, "invalid_request_error");
            }
        }
    }
    // The models' sharp outputs leave few near-ties: most greedy tokens were compared
    // (the reference has 127 in 16 replies).
    assert!(
        compared >= 100,
        "only {compared} greedy tokens were equal to llama.cpp's"
    );
}

/// `/rerank` against llama-server `--reranking` on the same files (references recorded by
/// scripts/record-rerank-ref.py): a synthetic BERT reranker (f32 weights, so that
/// llama.cpp's 8-bit activations do not blur the scores; classifier head over the first
/// token) and a synthetic Qwen3-Reranker (q8_0; its label tokens' softmax over the last
/// token, the prompt laid out by its rerank template). Jina's and TEI's shapes, top_n and
/// return_text give the same documents with the same token counts, each document's score
/// within 0.002 (BERT; measured within 0.0006) or 0.006 (Qwen3 q8_0; measured within
/// 0.0028, and within 5e-6 on an f32 file), best first. Bad requests get llama-server's
/// 400s, and a server without --reranking its 501.
#[test]
fn rerank_scores_as_llama_server() {
    let dir = common::scratch_dir("rerank");
    let bge = common::llamacpp_tests_dir().join("vocab/ggml-vocab-bert-bge.gguf");
    let smol = common::smollm2();
    let models = [
        (
            "rerank.json",
            "bert-rank",
            "f32",
            bge.to_string_lossy().into_owned(),
            0.002,
        ),
        ("rerank-qwen3.json", "qwen3-rank", "q8_0", smol, 0.006),
    ];
    let mut bert_file = String::new();
    for (reference, arch, ty, vocab, tol) in models {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/reference")
            .join(reference);
        let r: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let file = dir.join(format!("{arch}-{ty}.gguf"));
        let (code, _, err) = common::wgllm(&[
            "synth",
            "--vocab-from",
            &vocab,
            "--arch",
            arch,
            "--shape",
            "tiny",
            "--type",
            ty,
            "--trained-scale",
            "-o",
            &file.to_string_lossy(),
        ]);
        assert_eq!(code, 0, "{err}");
        let sha = {
            use sha2::Digest;
            format!("{:x}", sha2::Sha256::digest(std::fs::read(&file).unwrap()))
        };
        assert_eq!(sha, r["model_sha256"], "{arch}: synth wrote another file");
        let args: Vec<&str> = (r["server_args"].as_array().unwrap().iter())
            .map(|a| a.as_str().unwrap())
            .collect();
        let file = file.to_string_lossy().into_owned();
        let s = start_model(&file, &args, &[]);
        for (i, c) in r["cases"].as_array().unwrap().iter().enumerate() {
            let path = ["/rerank", "/v1/rerank", "/reranking", "/v1/reranking"][i % 4];
            let (st, got) = s.json("POST", path, c["request"].clone());
            assert_eq!(st, 200, "{got}");
            let want = &c["response"];
            let (got_rows, want_rows, label) = match want.as_array() {
                Some(w) => (got.as_array().unwrap(), w, "score"),
                None => {
                    assert_eq!(got["usage"], want["usage"], "{arch} {path}");
                    assert_eq!(got["object"], "list");
                    (
                        got["results"].as_array().unwrap(),
                        want["results"].as_array().unwrap(),
                        "relevance_score",
                    )
                }
            };
            assert_eq!(got_rows.len(), want_rows.len(), "{got}");
            let score = |v: &Value| v[label].as_f64().unwrap();
            for (g, w) in got_rows.iter().zip(want_rows) {
                // The same document at each place, unless a neighbour's score is too
                // close to tell apart at this tolerance.
                let w_at = |v: &Value| want_rows.iter().find(|x| x["index"] == v["index"]);
                let w = match w_at(g) {
                    Some(same) if (score(same) - score(w)).abs() < 2.0 * tol => same,
                    _ => w,
                };
                assert_eq!(g["index"], w["index"], "{arch}: {got} against {want}");
                assert_eq!(g["text"], w["text"]);
                let (gs, ws) = (score(g), score(w));
                assert!(
                    (gs - ws).abs() < tol,
                    "{arch}: score {gs}, llama-server's {ws}"
                );
            }
            assert!(got_rows.windows(2).all(|p| score(&p[0]) >= score(&p[1])));
        }
        for bad in [
            json!({"query": "q", "documents": []}),
            json!({"query": "q", "documents": null}),
            json!({"query": "q", "documents": 123}),
            json!({"query": "q", "documents": [1, 2, 3]}),
            json!({"documents": ["a"]}),
            json!({"query": 1, "documents": ["a"]}),
        ] {
            let (st, b) = s.json("POST", "/rerank", bad.clone());
            assert_error(st, &b, 400, "invalid_request_error");
        }
        // A query that would be copied into each of 1024 prompts, or (by the rerank
        // template's placeholders in it) multiply a long document, is measured once and
        // refused; the next request is served as before.
        let long_doc = "word ".repeat(20_000);
        for hostile in [
            json!({"query": "{document}".repeat(20_000), "documents": [long_doc]}),
            json!({"query": "query ".repeat(50_000), "documents": vec![""; 1024]}),
        ] {
            let (st, b) = s.json("POST", "/rerank", hostile);
            assert_error(st, &b, 400, "invalid_request_error");
            let msg = b["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("the query is"), "{msg}");
        }
        let first = &r["cases"][0];
        let (st, got) = s.json("POST", "/rerank", first["request"].clone());
        assert_eq!(st, 200, "{got}");
        if arch == "bert-rank" {
            bert_file = file;
        }
    }
    let s = start_model(
        &bert_file,
        &["--embeddings", "--pooling", "mean", "-c", "512"],
        &[],
    );
    let (st, b) = s.json("POST", "/rerank", json!({"query": "q", "documents": ["a"]}));
    assert_error(st, &b, 501, "not_supported_error");
}

/// `/lora-adapters` and a request's `lora`, as llama-server serves them: with
/// `--lora-init-without-apply` the adapter starts at 0; `POST /lora-adapters` sets the
/// scale later requests take; a request's own `lora` wins for it; requests of different
/// settings run side by side (never in one batch) and each gets what it gets alone;
/// malformed settings get a 400 and the server goes on.
#[test]
fn lora_adapters_as_llama_server() {
    let dir = common::scratch_dir("lora-server");
    let adapter = dir.join("adapter.gguf");
    let smol = common::smollm2();
    let (code, _, err) = common::wgllm(&[
        "synth",
        "--lora-for",
        &smol,
        "--lora-rank",
        "16",
        "--lora-strength",
        "0.3",
        "-o",
        &adapter.to_string_lossy(),
    ]);
    assert_eq!(code, 0, "{err}");
    let path = adapter.to_string_lossy().into_owned();
    let slot_dir = dir.join("slots");
    std::fs::create_dir_all(&slot_dir).unwrap();
    let slot_dir = slot_dir.to_string_lossy().into_owned();
    let s = start(&[
        "-np",
        "2",
        "--lora",
        &path,
        "--lora-init-without-apply",
        "--slot-save-path",
        &slot_dir,
    ]);
    let (st, list) = s.json("GET", "/lora-adapters", json!(null));
    assert_eq!(st, 200, "{list}");
    assert_eq!(list[0]["id"], 0);
    assert_eq!(list[0]["path"], path.as_str());
    assert_eq!(list[0]["scale"], 0.0);
    let complete = |lora: Option<Value>| -> String {
        let mut body = json!({"prompt": "Look in thy glass", "n_predict": 16, "temperature": 0.0});
        if let Some(l) = lora {
            body["lora"] = l;
        }
        let (st, r) = s.json("POST", "/completion", body);
        assert_eq!(st, 200, "{r}");
        r["content"].as_str().unwrap().to_string()
    };
    let plain = complete(None);
    let (st, r) = s.json("POST", "/lora-adapters", json!([{"id": 0, "scale": 1.0}]));
    assert_eq!((st, &r["success"]), (200, &json!(true)), "{r}");
    let (_, list) = s.json("GET", "/lora-adapters", json!(null));
    assert_eq!(list[0]["scale"], 1.0);
    let adapted = complete(None);
    assert_ne!(plain, adapted, "the adapter at scale 1 changes the reply");
    // A request's own setting wins (the slot's cells of the other setting are not reused).
    assert_eq!(complete(Some(json!([{"id": 0, "scale": 0.0}]))), plain);
    assert_eq!(
        complete(Some(json!([]))),
        adapted,
        "an empty list is the server's setting"
    );
    // Side by side: each as alone.
    let both = std::thread::scope(|sc| {
        let a = sc.spawn(|| complete(Some(json!([{"id": 0, "scale": 0.0}]))));
        let b = sc.spawn(|| complete(Some(json!([{"id": 0, "scale": 1.0}]))));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(both, (plain.clone(), adapted.clone()));
    for (path, body) in [
        ("/lora-adapters", json!({"id": 0, "scale": 1.0})),
        ("/lora-adapters", json!([{"id": 1, "scale": 1.0}])),
        ("/lora-adapters", json!([{"scale": 1.0}])),
        ("/completion", json!({"prompt": "Hi", "lora": "all"})),
        (
            "/completion",
            json!({"prompt": "Hi", "lora": [{"id": -1, "scale": 1.0}]}),
        ),
        (
            "/completion",
            json!({"prompt": "Hi", "lora": [{"id": 0, "scale": "x"}]}),
        ),
    ] {
        let (st, r) = s.json("POST", path, body.clone());
        assert_error(st, &r, 400, "invalid_request_error");
    }
    assert_eq!(
        complete(None),
        adapted,
        "the server goes on with its setting"
    );

    // A slot file keeps the setting its cells were computed with: saved after a request
    // at scale 1, restored after one at scale 0 on the same slot, the next request at
    // scale 0 reuses none of its cells and answers as a fresh server does (it took the
    // setting of the request before it, and reused cells of the other setting).
    let on_slot0 = |scale: f32| -> (String, u64) {
        let body = json!({"prompt": "Look in thy glass", "n_predict": 16, "temperature": 0.0,
            "id_slot": 0, "cache_prompt": true, "lora": [{"id": 0, "scale": scale}]});
        let (st, r) = s.json("POST", "/completion", body);
        assert_eq!(st, 200, "{r}");
        let cached = r["timings"]["cache_n"].as_u64().unwrap();
        (r["content"].as_str().unwrap().to_string(), cached)
    };
    assert_eq!(on_slot0(1.0).0, adapted);
    let slot = |action: &str| {
        let (st, r) = s.json(
            "POST",
            &format!("/slots/0?action={action}"),
            json!({"filename": "adapted.bin"}),
        );
        assert_eq!(st, 200, "{action}: {r}");
    };
    slot("save");
    let body = json!({"prompt": "Something else entirely", "n_predict": 4, "id_slot": 0,
        "lora": [{"id": 0, "scale": 0.0}]});
    assert_eq!(s.json("POST", "/completion", body).0, 200);
    slot("restore");
    let (text, cached) = on_slot0(0.0);
    assert_eq!(
        (text.as_str(), cached),
        (plain.as_str(), 0),
        "cells of scale 1 are not reused at scale 0"
    );
    slot("restore");
    let (text, cached) = on_slot0(1.0);
    assert!(
        cached > 0,
        "the restored cells are reused at their own scale"
    );
    assert_eq!(text, adapted);
}

/// Sends `sig` (TERM or INT) to the server's process.
fn signal(s: &Server, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

/// Waits up to `limit` for the server's process to exit; its exit code.
fn exit_code_within(s: &mut Server, limit: Duration) -> Option<i32> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(st) = s.child.try_wait().unwrap() {
            return Some(st.code().unwrap_or(-1));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A stream started and read up to its first token: the rest of the reader's lines come
/// back when the stream ends.
fn stream_in_flight(s: &Server) -> std::thread::JoinHandle<String> {
    let mut c = s.connect().unwrap();
    let body = json!({"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": true,
        "stream": true});
    s.send(&mut c, "POST", "/completion", &[], &body.to_string())
        .unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        rest
    })
}

/// SIGTERM with requests in flight: the listener closes, a stream that outlives the
/// grace period ends with an error event (503), a request waiting for its whole reply
/// gets a 503, and the process frees the device and exits 0 within the grace period and
/// a few seconds. A second signal exits at once (130) however long the grace period.
#[test]
fn a_signal_ends_requests_in_flight_and_the_server_exits() {
    let mut s = start(&["--shutdown-grace", "1", "-np", "2"]);
    let stream = stream_in_flight(&s);
    let port = s.port;
    let whole = std::thread::spawn(move || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body =
            json!({"prompt": "Tell me a story", "n_predict": 4000, "ignore_eos": true}).to_string();
        let req = format!(
            "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    });
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    signal(&s, "TERM");
    let code = exit_code_within(&mut s, Duration::from_secs(20));
    assert_eq!(code, Some(0), "exit status after SIGTERM");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let rest = stream.join().unwrap();
    assert!(
        rest.contains("error: ") && rest.contains("\"code\":503") && rest.contains("shutting down"),
        "the stream ends with an error event: {}",
        &rest[rest.len().saturating_sub(400)..]
    );
    let whole = whole.join().unwrap();
    assert!(
        whole.starts_with("HTTP/1.1 503") && whole.contains("shutting down"),
        "{whole}"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens any more"
    );

    let mut s = start(&["--shutdown-grace", "600"]);
    let _stream = stream_in_flight(&s);
    signal(&s, "INT");
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    signal(&s, "INT");
    assert_eq!(exit_code_within(&mut s, Duration::from_secs(5)), Some(130));
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

/// A request whose work would take more memory than `--request-budget-mib` gets a 400
/// naming the budget and its cost before the work (a body that swells when parsed, a
/// text too long to tokenize, a non-streamed reply of many probabilities); a field named
/// 100 000 times in `response_fields` is kept once; `/tokenize` writes the same reply
/// as a tree of values would; the server goes on.
#[test]
fn the_request_budget_refuses_before_the_work() {
    let s = start(&["--request-budget-mib", "16"]);
    let budget = |st: u16, r: &Value, what: &str| {
        assert_error(st, r, 400, "invalid_request_error");
        let m = r["error"]["message"].as_str().unwrap();
        assert!(
            m.contains(what) && m.contains("budget of 16 MiB per request"),
            "{m}"
        );
    };
    let zeros = format!("{{\"prompt\": [{}0]}}", "0,".repeat(3_000_000));
    let (st, b) = s.request("POST", "/completion", &zeros);
    budget(st, &serde_json::from_str(&b).unwrap(), "parsed");
    let (st, r) = s.json("POST", "/tokenize", json!({"content": "a".repeat(1 << 20)}));
    budget(st, &r, "tokenizing a text of 1048576 bytes");
    let many = json!({"prompt": vec!["Hi"; 20], "n_predict": 1000, "n_probs": 50});
    let (st, r) = s.json("POST", "/completion", many);
    budget(st, &r, "20 replies of up to");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("with 50 probabilities each"));
    let fields = json!({"prompt": "Hi", "n_predict": 2,
        "response_fields": vec!["generation_settings"; 100_000]});
    let (st, r) = s.json("POST", "/completion", fields);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r.as_object().unwrap().len(), 1, "{r}");
    let (st, r) = s.json(
        "POST",
        "/tokenize",
        json!({"content": "Hi \"there\"\n☃ 漢", "with_pieces": true}),
    );
    assert_eq!(st, 200, "{r}");
    // A piece that is not whole UTF-8 comes as its bytes.
    let pieces: Vec<u8> = (r["tokens"].as_array().unwrap().iter())
        .flat_map(|t| match &t["piece"] {
            Value::String(p) => p.as_bytes().to_vec(),
            bytes => (bytes.as_array().unwrap().iter())
                .map(|b| b.as_u64().unwrap() as u8)
                .collect(),
        })
        .collect();
    assert_eq!(pieces, "Hi \"there\"\n☃ 漢".as_bytes());
    let (st, r) = s.json(
        "POST",
        "/completion",
        json!({"prompt": "Hi", "n_predict": 4}),
    );
    assert_eq!(st, 200, "{r}");
}

/// Request bodies take their room in memory as they arrive, and keep it until their
/// handler has answered: with `--max-body-mib 1`, four completions of 1 MiB bodies fill
/// the room while they generate, so a fifth body finds none and gets a 503 saying why at
/// once; a request without a body (`/health`) is not held up; once the four have
/// answered, requests are answered again.
#[test]
fn bodies_in_memory_are_bounded_together() {
    let s = start(&["--max-body-mib", "1", "-to", "2", "-np", "4"]);
    let port = s.port;
    let big = |i: usize| {
        let mut body = json!({"prompt": format!("Story {i}:"), "n_predict": 128,
            "ignore_eos": true, "pad": ""});
        let room = (1 << 20) - body.to_string().len();
        body["pad"] = json!("x".repeat(room));
        body.to_string()
    };
    let holders: Vec<_> = (0..4)
        .map(|i| {
            let body = big(i);
            assert_eq!(body.len(), 1 << 20);
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let head = format!(
                    "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                c.write_all(head.as_bytes()).unwrap();
                c.write_all(body.as_bytes()).unwrap();
                let mut out = String::new();
                let _ = c.read_to_string(&mut out);
                out
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    let (st, r) = s.json("POST", "/tokenize", json!({"content": "Hi"}));
    assert_error(st, &r, 503, "unavailable_error");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let m = r["error"]["message"].as_str().unwrap();
    assert!(m.contains("request bodies"), "{m}");
    let (st, _) = s.request("GET", "/health", "");
    assert_eq!(st, 200, "a request without a body is not held up");
    for h in holders {
        let out = h.join().unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200"),
            "{}",
            &out[..out.len().min(300)]
        );
    }
    let (st, r) = s.json("POST", "/tokenize", json!({"content": "Hi"}));
    assert_eq!(st, 200, "{r}");
}

/// Images in requests, on Gemma-3-270M with the synthetic mmproj llama.cpp ran
/// (tests/data/reference/vision): an OpenAI `image_url` data URI, an Anthropic image
/// block, a `file://` URL under `--media-path` and `/completion`'s `multimodal_data` with
/// the marker `/props` gives all continue the prompt with llama-mtmd-cli's 16 greedy
/// tokens (those `wgllm run --image` gives, tests/vision.rs); the same image again is
/// reused from the cache; bad images get a 400 with the reason, a text-only server
/// llama-server's 500, and the server goes on.
#[test]
fn images_in_requests_read_as_llama_server_reads_them() {
    use base64::Engine as _;
    let dir = common::scratch_dir("server-images");
    let mm = common::mmproj_270m(&dir);
    let png = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vision/square-224.png"),
    )
    .unwrap();
    std::fs::write(dir.join("square.png"), &png).unwrap();
    // A link inside --media-path to a file outside it.
    std::os::unix::fs::symlink(std::env::current_exe().unwrap(), dir.join("link.png")).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let want = common::square_image_reply();
    let lm = common::model_path("WGLLM_GEMMA3", "gemma-3-270m-q4_k_m.gguf");
    let s = start_model(
        lm.to_str().unwrap(),
        &[
            "--mmproj",
            mm.to_str().unwrap(),
            "--media-path",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let question = "Count from one to twenty, in words.";
    let chat = |url: &str| {
        s.json(
            "POST",
            "/v1/chat/completions",
            json!({"temperature": 0, "max_tokens": 16, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": question},
            ]}]}),
        )
    };
    let data_uri = format!("data:image/png;base64,{b64}");
    let (st, b) = chat(&data_uri);
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["choices"][0]["message"]["content"], want.as_str(), "{b}");
    let n_prompt = b["usage"]["prompt_tokens"].as_u64().unwrap();
    // Asked again, everything but the last prompt token comes from the cache: the image's
    // cells are reused by its content.
    let (_, b) = chat(&data_uri);
    assert_eq!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"],
        n_prompt - 1
    );
    let (st, b) = chat("file://square.png");
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["choices"][0]["message"]["content"], want.as_str());
    let (st, b) = s.json(
        "POST",
        "/v1/messages",
        json!({"max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": question},
        ]}]}),
    );
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["content"][0]["text"], want.as_str(), "{b}");
    let (_, props) = s.json("GET", "/props", json!({}));
    assert_eq!(props["modalities"]["vision"], true);
    let marker = props["media_marker"].as_str().unwrap().to_string();
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"temperature": 0, "n_predict": 16, "prompt": {
            "prompt_string": format!("<start_of_turn>user\n{marker}{question}<end_of_turn>\n<start_of_turn>model\n"),
            "multimodal_data": [b64],
        }}),
    );
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["content"], want.as_str());
    let (_, models) = s.json("GET", "/v1/models", json!({}));
    assert_eq!(
        models["models"][0]["capabilities"],
        json!(["completion", "multimodal"])
    );
    // Bad images, each a 400 with its reason.
    let truncated = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png[..png.len() / 2])
    );
    for (url, why) in [
        ("data:text/html;base64,aGVsbG8=", "Invalid uri format"),
        ("malformed!", "base64"),
        ("https://ggml.ai/cat.png", "remote image URLs"),
        ("file://../square.png", "not allowed"),
        ("file://link.png", "outside --media-path"),
        (truncated.as_str(), "image 1 of the request"),
    ] {
        let (st, b) = chat(url);
        assert_error(st, &b, 400, "invalid_request_error");
        let msg = b["error"]["message"].as_str().unwrap();
        assert!(msg.contains(why), "{url:.40}: {msg}");
    }
    // More images than the context holds are refused before any is decoded.
    let pixel = json!({"type": "image_url", "image_url": {"url": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="}});
    let (st, b) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": vec![pixel; 300]}]}),
    );
    assert_eq!(st, 400, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("do not fit the context"),
        "{b}"
    );
    let (st, b) = chat(&data_uri);
    assert_eq!(st, 200, "the server goes on: {b}");
    drop(s);
    // A server without an mmproj answers as llama-server does.
    let s = start(&[]);
    let (st, b) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri}},
        ]}]}),
    );
    assert_error(st, &b, 500, "server_error");
    assert!(
        b["error"]["message"].as_str().unwrap().contains("mmproj"),
        "{b}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `wgllm serve ARGS` with `env` exits at once with an error saying `why`.
fn refused_at_start(args: &[&str], env: &[(&str, &str)], why: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .arg("serve")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(why), "{args:?}: {err}");
}

/// Resident anonymous memory of a process, in bytes (Linux): on a software device the
/// "GPU" buffers live there.
fn anon_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = (status.lines())
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/PID/status");
    kib << 10
}

fn metric(text: &str, name: &str) -> f64 {
    (text.lines())
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the metrics:\n{text}"))
}

fn is_sleeping(s: &Server) -> bool {
    let (st, props) = s.json("GET", "/props", json!(null));
    assert_eq!(st, 200, "{props}");
    props["is_sleeping"].as_bool().unwrap()
}

/// `--sleep-idle-seconds`: idle for a second, the server drops the model (its buffers go
/// back, the process's memory falls by at least the GPU bytes it held: a software device
/// keeps them in host memory), answers /health, /props, /models and /metrics asleep
/// without waking, and the next completion loads the model again and gives the same
/// greedy text as before. A value of 0 is refused, as llama-server refuses it.
#[test]
fn an_idle_server_sleeps_and_wakes_with_the_same_replies() {
    let s = start(&[
        "-c",
        "1024",
        "-np",
        "1",
        "--metrics",
        "--sleep-idle-seconds",
        "1",
    ]);
    let ask = json!({"prompt": "The capital of France is", "n_predict": 12, "temperature": 0});
    let (st, before) = s.json("POST", "/completion", ask.clone());
    assert_eq!(st, 200, "{before}");
    let (_, m) = s.request("GET", "/metrics", "");
    let gpu = metric(&m, "wgllm:gpu_buffer_bytes") as u64;
    assert!(gpu > 50 << 20, "{m}");
    let awake = anon_bytes(s.child.id());
    let t0 = Instant::now();
    while !is_sleeping(&s) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the server did not fall asleep"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let asleep = anon_bytes(s.child.id());
    assert!(
        awake.saturating_sub(asleep) >= gpu * 9 / 10,
        "asleep the process holds {} MiB, awake {} MiB, with {} MiB of GPU buffers",
        asleep >> 20,
        awake >> 20,
        gpu >> 20
    );
    // Read-only routes answer without waking it.
    for path in ["/health", "/props", "/models", "/v1/models", "/metrics"] {
        assert_eq!(s.request("GET", path, "").0, 200, "{path}");
    }
    assert!(is_sleeping(&s));
    let (st, after) = s.json("POST", "/completion", ask);
    assert_eq!(st, 200, "{after}");
    assert!(!is_sleeping(&s));
    assert_eq!(after["content"], before["content"]);
    assert_eq!(
        after["timings"]["cache_n"], 0,
        "the slot's cache went with the model"
    );
    drop(s);

    let smol = common::smollm2();
    refused_at_start(
        &["-m", &smol, "--sleep-idle-seconds", "0"],
        &[],
        "--sleep-idle-seconds 0",
    );
}

/// Vertex AI's predict route (`AIP_MODE=PREDICTION`, `AIP_PREDICT_ROUTE`,
/// `AIP_HEALTH_ROUTE`, `AIP_HTTP_PORT`): instances by alias or path, answered in order
/// with each endpoint's reply, errors inline; a body that is not a list of at most 128
/// instances is a 400; a route that takes an existing path is refused at start.
#[test]
fn gcp_predictions_answer_each_instance_in_order() {
    let port = free_port();
    let p = port.to_string();
    let s = start_at(
        port,
        &common::smollm2(),
        &[],
        &[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_HTTP_PORT", &p),
            // The leading / is added, as llama-server adds it.
            (
                "AIP_PREDICT_ROUTE",
                "v1/endpoints/7/deployedModels/m:predict",
            ),
            ("AIP_HEALTH_ROUTE", "/ping"),
        ],
    );
    assert_eq!(s.request("GET", "/ping", "").0, 200);
    let (st, b) = s.json(
        "POST",
        "/v1/endpoints/7/deployedModels/m:predict",
        json!({"instances": [
            {"@requestFormat": "tokenize", "content": "Hello world"},
            {"@requestFormat": "/tokenize", "content": "Hello"},
            {"@requestFormat": "completion", "prompt": "Hi", "n_predict": 2, "stream": true},
            {"@requestFormat": "nope"},
            {"no format": 1},
            7,
            {"@requestFormat": "models"},
            {"@requestFormat": "chatCompletions", "messages": "not a list"},
        ]}),
    );
    assert_eq!(st, 200, "{b}");
    let p = b["predictions"].as_array().unwrap();
    assert_eq!(p.len(), 8, "{b}");
    assert_eq!(p[0]["tokens"].as_array().unwrap().len(), 2, "{b}");
    assert_eq!(p[1]["tokens"].as_array().unwrap().len(), 1, "{b}");
    assert!(p[2]["content"].is_string(), "streaming is turned off: {b}");
    for (i, want) in [
        (3, "no handler registered for @requestFormat: nope"),
        (4, "string @requestFormat"),
        (5, "must be a JSON object"),
    ] {
        assert_eq!(p[i]["error"]["code"], 400, "{b}");
        assert!(
            p[i]["error"]["message"].as_str().unwrap().contains(want),
            "{b}"
        );
    }
    assert!(p[6]["data"].is_array(), "a GET route: {b}");
    assert_eq!(p[7]["error"]["code"], 400, "the endpoint's own error: {b}");
    for bad in [
        json!([1]),
        json!({"instances": 3}),
        json!({"instances": vec![json!({}); 129]}),
    ] {
        let (st, b) = s.json("POST", "/v1/endpoints/7/deployedModels/m:predict", bad);
        assert_error(st, &b, 400, "invalid_request_error");
    }
    drop(s);

    let (smol, p1, p2) = (
        common::smollm2(),
        free_port().to_string(),
        free_port().to_string(),
    );
    refused_at_start(
        &["-m", &smol, "--port", &p1],
        &[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_HTTP_PORT", &p2),
            ("AIP_PREDICT_ROUTE", "/completion"),
        ],
        "conflicts with an existing route",
    );
}

/// Router mode (`wgllm serve` with no model): two different GGUF files of a
/// `--models-dir`, by name, with `--models-max 1` so every change of model unloads the
/// other. Eight clients at once asking both: every greedy reply equals that model's
/// single-model server's, and each swap gives the unloaded model's memory back (the
/// process holds far less than both models' together). The
/// listing shows which is loaded; unknown and missing names get llama-server's 400s;
/// `--models-dir` with `-m` is refused.
#[test]
fn a_router_serves_two_models_by_name_and_swaps_them() {
    let dir = std::env::temp_dir().join(format!("wgllm-router-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("models")).unwrap();
    std::fs::create_dir_all(dir.join("hub")).unwrap();
    let files = [
        ("smol", common::smollm2()),
        (
            "gemma",
            common::model_path("WGLLM_GEMMA3", "gemma-3-270m-q4_k_m.gguf")
                .to_string_lossy()
                .into_owned(),
        ),
    ];
    for (name, path) in &files {
        std::os::unix::fs::symlink(path, dir.join("models").join(format!("{name}.gguf"))).unwrap();
    }
    let prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"];
    let ask = |s: &Server, model: Option<&str>, prompt: &str| -> String {
        let mut body = json!({"prompt": prompt, "n_predict": 10, "temperature": 0});
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let (st, b) = s.json("POST", "/completion", body);
        assert_eq!(st, 200, "{b}");
        b["content"].as_str().unwrap().to_string()
    };
    // Each model alone.
    let mut alone = std::collections::HashMap::new();
    for (name, path) in &files {
        let s = start_model(path, &["-c", "512", "-np", "2"], &[]);
        for p in prompts {
            alone.insert((name.to_string(), p), ask(&s, None, p));
        }
    }
    let models = dir.join("models").display().to_string();
    let r = start_router(&dir, &["--models-max", "1", "-c", "512", "-np", "2"]);
    let status = |r: &Server| -> Vec<(String, String)> {
        let (_, l) = r.json("GET", "/models", json!(null));
        let mut v: Vec<(String, String)> = (l["data"].as_array().unwrap().iter())
            .map(|m| {
                (
                    m["id"].as_str().unwrap().into(),
                    m["status"]["value"].as_str().unwrap().into(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        status(&r),
        [
            ("gemma".into(), "unloaded".into()),
            ("smol".into(), "unloaded".into())
        ]
    );
    let base = anon_bytes(r.child.id());
    // One model, then the other, alone: what each holds.
    let mut first = std::collections::HashMap::new();
    for (name, _) in &files {
        assert_eq!(
            ask(&r, Some(name), prompts[0]),
            alone[&(name.to_string(), prompts[0])]
        );
        first.insert(name.to_string(), anon_bytes(r.child.id()));
        let want: Vec<(String, String)> = (files.iter())
            .map(|(n, _)| {
                (
                    n.to_string(),
                    if n == name { "loaded" } else { "unloaded" }.to_string(),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect();
        assert_eq!(status(&r), want);
    }
    // Eight clients at once, each asking both models in turn.
    std::thread::scope(|sc| {
        for c in 0..8 {
            let (r, alone, ask, files) = (&r, &alone, &ask, &files);
            sc.spawn(move || {
                for k in 0..2 {
                    let (name, _) = &files[(c + k) % 2];
                    let p = prompts[(c + k) % prompts.len()];
                    assert_eq!(
                        ask(r, Some(name), p),
                        alone[&(name.to_string(), p)],
                        "{name}: {p}"
                    );
                }
            });
        }
    });
    // Swaps one after another: each gives the other model's memory back (the process
    // holds far less than both models' together; some heap stays fragmented).
    for i in 0..4 {
        let (name, _) = &files[i % 2];
        let (other, _) = &files[(i + 1) % 2];
        assert_eq!(
            ask(&r, Some(name), prompts[1]),
            alone[&(name.to_string(), prompts[1])]
        );
        let now = anon_bytes(r.child.id());
        let (one, two) = (first[*name], first[*other]);
        assert!(
            now < one + two / 2,
            "after swapping to {name} the router holds {} MiB; {name} alone held {} MiB, {other} {} MiB (the router {} MiB before any model)",
            now >> 20,
            one >> 20,
            two >> 20,
            base >> 20
        );
    }
    let (st, b) = r.json("POST", "/completion", json!({"prompt": "x"}));
    assert_error(st, &b, 400, "invalid_request_error");
    let (st, b) = r.json(
        "POST",
        "/completion",
        json!({"model": "nope", "prompt": "x"}),
    );
    assert_error(st, &b, 400, "invalid_request_error");
    let (st, b) = r.json("POST", "/models/unload", json!({"model": "nope"}));
    assert_error(st, &b, 400, "invalid_request_error");
    drop(r);

    let smol = common::smollm2();
    refused_at_start(&["-m", &smol, "--models-dir", &models], &[], "router mode");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tiny Qwen3 llama-server split replies on (tests/data/reference/reasoning.json):
/// random weights, Qwen's vocabulary with Qwen 3's `<think>` and `</think>` added as
/// user-defined tokens, written into `dir` (sha256 checked).
fn reasoning_model(dir: &std::path::Path, want_sha: &str) -> std::path::PathBuf {
    use wgllm::model::synth::{
        synth, vocab_metadata, with_added_tokens_of_type, SynthArch, SynthShape, WeightScale,
        USER_DEFINED,
    };
    let vocab = wgllm::gguf::GgufFile::open(
        common::llamacpp_tests_dir().join("vocab/ggml-vocab-qwen2.gguf"),
    )
    .unwrap();
    let n_vocab = vocab.get_array("tokenizer.ggml.tokens").unwrap().len() as u64;
    let base = dir.join("qwen3-tiny.gguf");
    synth(
        SynthArch::Qwen3,
        SynthShape::preset("tiny").unwrap(),
        wgllm::gguf::GgmlType::Q8_0,
        vocab_metadata(&vocab),
        n_vocab,
        WeightScale::Fixed(0.02),
        false,
    )
    .write(&base)
    .unwrap();
    let path = dir.join("qwen3-think.gguf");
    let tags = ["<think>".to_string(), "</think>".to_string()];
    let base_file = wgllm::gguf::GgufFile::open(&base).unwrap();
    with_added_tokens_of_type(&base_file, &tags, USER_DEFINED)
        .unwrap()
        .write(&path)
        .unwrap();
    let sha = format!(
        "{:x}",
        <sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&path).unwrap())
    );
    assert_eq!(
        sha,
        want_sha,
        "{} is not the file llama.cpp ran",
        path.display()
    );
    path
}

/// With a thinking budget of 3 on a template that opens the turn inside `<think>`, the
/// message and the closing tag are the reply's tokens from the third on (the opening's
/// newline after `<think>` counts, as llama.cpp replays it), and the rest is the answer;
/// without a budget the model goes on thinking.
fn thinking_budget_forces_the_closing_tag(s: &Server) {
    let tokens = |text: &str| -> Vec<Value> {
        let (st, v) = s.json(
            "POST",
            "/tokenize",
            json!({"content": text, "parse_special": true}),
        );
        assert_eq!(st, 200, "{v}");
        v["tokens"].as_array().unwrap().clone()
    };
    let mut forced = tokens("Enough thinking.");
    forced.extend(tokens("</think>"));
    let ask = |budget: i64| {
        let body = json!({"messages": [{"role": "user", "content": "Say hello."}],
            "temperature": 0.0, "max_tokens": 10, "logprobs": true,
            "reasoning_budget_tokens": budget, "reasoning_budget_message": "Enough thinking."});
        let (st, v) = s.json("POST", "/v1/chat/completions", body);
        assert_eq!(st, 200, "{v}");
        let ids: Vec<Value> = (v["choices"][0]["logprobs"]["content"].as_array().unwrap())
            .iter()
            .map(|t| t["id"].clone())
            .collect();
        (v["choices"][0]["message"].clone(), ids)
    };
    let (msg, ids) = ask(3);
    assert_eq!(ids[2..2 + forced.len()], forced[..], "{msg}");
    let reasoning = msg["reasoning_content"].as_str().unwrap();
    assert!(reasoning.ends_with("Enough thinking."), "{msg}");
    let (free, _) = ask(-1);
    assert!(free["content"].as_str().unwrap_or("").is_empty(), "{free}");
    assert!(
        !free["reasoning_content"]
            .as_str()
            .unwrap()
            .contains("Enough"),
        "{free}"
    );
}

/// A streamed chat reply's deltas joined: (content, reasoning_content); no delta holds a
/// tag of the template's.
fn streamed_split(s: &Server, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (st, b) = s.request("POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(st, 200, "{b}");
    let (mut content, mut reasoning) = (String::new(), String::new());
    for e in b.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(e).unwrap();
        let d = &v["choices"][0]["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
    }
    (content, reasoning)
}

/// Chat replies split thinking from the answer as llama-server splits them, for Qwen 3's,
/// DeepSeek-R1's and gpt-oss's real templates and for SmolLM2's (no thinking): the same
/// requests, with the replies held to the same texts by a grammar, give the same
/// `content` and `reasoning_content` (streamed and not), Anthropic thinking blocks and
/// Responses reasoning items (tests/data/reference/reasoning.json, recorded by
/// scripts/record-reasoning-ref.py). Whether the template has thinking, and the
/// `enable_thinking`, `reasoning_effort` and `reasoning_format` fields, decide the split.
#[test]
fn chat_replies_split_thinking_as_llama_server_does() {
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/reference/reasoning.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let dir = common::scratch_dir("reasoning");
    let synth = reasoning_model(&dir, want["models"]["synth"].as_str().unwrap());
    let templates = common::llamacpp_tests_dir().join("templates");
    let mut checked = 0;
    for (name, template) in want["templates"].as_object().unwrap() {
        let file = template
            .as_str()
            .map(|t| templates.join(t).display().to_string());
        let model = match &file {
            Some(_) => synth.display().to_string(),
            None => common::smollm2(),
        };
        let mut extra = vec!["-c", "1024", "-np", "1"];
        if let Some(f) = &file {
            extra.extend(["--chat-template-file", f]);
        }
        let s = start_model(&model, &extra, &[]);
        if name == "deepseek-r1" {
            thinking_budget_forces_the_closing_tag(&s);
        }
        for case in want["cases"].as_array().unwrap() {
            if case["model"] != *name {
                continue;
            }
            let what = format!("{name} {}", case["case"]);
            let (st, got) = s.json("POST", "/v1/chat/completions", case["body"].clone());
            assert_eq!(st, 200, "{what}: {got}");
            let msg = &got["choices"][0]["message"];
            assert_eq!(msg["content"], case["content"], "{what}: {got}");
            assert_eq!(
                msg["reasoning_content"], case["reasoning_content"],
                "{what}: {got}"
            );
            let (content, reasoning) = streamed_split(&s, &case["body"]);
            assert_eq!(
                content,
                case["stream_content"].as_str().unwrap(),
                "{what} streamed"
            );
            assert_eq!(
                reasoning,
                case["stream_reasoning_content"].as_str().unwrap(),
                "{what} streamed"
            );
            // Anthropic's blocks: llama-server drops `grammar` there, so they are checked
            // against its chat reply's split (thinking first, its signature empty).
            let (st, got) = s.json("POST", "/v1/messages", case["body"].clone());
            assert_eq!(st, 200, "{what}: {got}");
            let mut blocks = Vec::new();
            if let Some(r) = case["reasoning_content"].as_str() {
                blocks.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
            }
            blocks.push(json!({"type": "text", "text": case["content"]}));
            assert_eq!(got["content"], json!(blocks), "{what} (Anthropic)");
            if case.get("responses").is_some() {
                let mut body = case["body"].clone();
                let o = body.as_object_mut().unwrap();
                o.remove("messages");
                o.remove("max_tokens");
                o.insert("input".into(), json!("Say hello."));
                o.insert("max_output_tokens".into(), json!(64));
                let (st, got) = s.json("POST", "/v1/responses", body);
                assert_eq!(st, 200, "{what}: {got}");
                let mut items = got["output"].clone();
                for item in items.as_array_mut().unwrap() {
                    item.as_object_mut().unwrap().remove("id");
                }
                assert_eq!(items, case["responses"], "{what} (Responses)");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, want["cases"].as_array().unwrap().len());

    // Bad settings get a sentence: at start, and in a request (llama-server's 400s).
    let smol = common::smollm2();
    for (flag, value, why) in [
        ("--reasoning-format", "think", "unknown format"),
        ("--reasoning", "maybe", "on, off or auto"),
        ("--chat-template-kwargs", "[1]", "JSON object"),
        ("--reasoning-budget", "-2", "give a token count"),
    ] {
        refused_at_start(&["-m", &smol, flag, value], &[], why);
    }
    let s = start_model(&smol, &["-c", "512", "-np", "1"], &[]);
    let ask = json!([{"role": "user", "content": "Hi"}]);
    for (field, value, why) in [
        (
            "chat_template_kwargs",
            json!({"enable_thinking": "yes"}),
            "expected boolean",
        ),
        ("chat_template_kwargs", json!([1]), "must be an object"),
        (
            "reasoning_format",
            json!("think"),
            "Unknown reasoning format",
        ),
    ] {
        let mut body = json!({"messages": ask, "max_tokens": 2});
        body[field] = value;
        let (st, got) = s.json("POST", "/v1/chat/completions", body);
        assert_error(st, &got, 400, "invalid_request_error");
        assert!(got.to_string().contains(why), "{field}: {got}");
    }
}

/// A router over `dir/models` (`dir/hub` its Hugging Face cache) with `extra` flags.
fn start_router(dir: &std::path::Path, extra: &[&str]) -> Server {
    std::fs::create_dir_all(dir.join("models")).unwrap();
    std::fs::create_dir_all(dir.join("hub")).unwrap();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(["serve", "--models-dir"])
        .arg(dir.join("models"))
        .args(["--port", &port.to_string()])
        .args(extra)
        .env("LLAMA_CACHE", dir.join("hub"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Server { child, port }.ready(Duration::from_secs(60))
}

/// An MCP server in sh (one JSON-RPC message per line; ids are small integers): an
/// `echo` tool that answers with the request's id, after a line that is not JSON and a
/// notification.
const SH_MCP_SERVER: &str = r#"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
  [ -z "$id" ] && continue
  case "$line" in
    *'"initialize"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"capabilities":{}}}\n' "$id" ;;
    *'"tools/list"'*) printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"echo","description":"Echoes","inputSchema":{"type":"object","properties":{"message":{"type":"string"}}}}]}}\n' "$id" ;;
    *) printf 'not json\n{"jsonrpc":"2.0","method":"notifications/progress"}\n{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"call %s"}]}}\n' "$id" "$id" ;;
  esac
done
"#;

/// `/tools`: off by default with llama-server's 403; `--tools` with `--tools-root` keeps
/// every file tool inside the root; an MCP server's tools are listed and called; bad
/// calls get llama-server's statuses, and bad flags stop the server before it starts.
#[test]
fn tools_run_inside_their_root_and_mcp_tools_are_called() {
    let dir = std::env::temp_dir().join(format!("wgllm-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/inside.txt"), "inside\n").unwrap();
    std::fs::write(dir.join("outside.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink(dir.join("outside.txt"), root.join("link.txt")).unwrap();

    let off = start_router(&dir.join("off"), &[]);
    let (st, body) = off.json("GET", "/tools", Value::Null);
    assert_eq!(st, 403);
    assert_eq!(
        body,
        json!({"error": {"message": "this feature is disabled", "type": "feature_disabled"}})
    );
    drop(off);

    let mcp = json!({"mcpServers": {"sh": {"command": "sh", "args": ["-c", SH_MCP_SERVER]}}});
    let root_s = root.display().to_string();
    let mcp_s = mcp.to_string();
    let s = start_router(
        &dir.join("on"),
        &[
            "--tools",
            "all",
            "--tools-root",
            &root_s,
            "--mcp-servers-json",
            &mcp_s,
        ],
    );
    let (st, list) = s.json("GET", "/tools", Value::Null);
    assert_eq!(st, 200, "{list}");
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "read_file",
            "file_glob_search",
            "grep_search",
            "write_file",
            "edit_file",
            "get_info",
            "sh_echo"
        ],
        "the shell is left out under a root"
    );
    let echo = &list[6];
    assert_eq!(echo["type"], "mcp");
    assert_eq!(
        echo["definition"]["function"]["parameters"]["type"],
        "object"
    );

    let call = |headers: &[(&str, &str)], body: Value| -> (u16, Value) {
        let (st, b) = s
            .try_request("POST", "/tools", headers, &body.to_string())
            .unwrap();
        (st, serde_json::from_str(&b).unwrap_or(Value::String(b)))
    };
    let cwd = [("x-tool-cwd", root_s.as_str())];
    let read = |path: &str| call(&cwd, json!({"tool": "read_file", "params": {"path": path}}));
    let (st, r) = read("sub/inside.txt");
    assert_eq!(st, 200);
    assert!(
        r["plain_text_response"]
            .as_str()
            .unwrap()
            .contains("inside"),
        "{r}"
    );
    let outside = dir.join("outside.txt").display().to_string();
    for path in [
        outside.as_str(),
        "../outside.txt",
        "link.txt",
        "sub/../../outside.txt",
    ] {
        let (st, r) = read(path);
        assert_eq!(st, 200, "{path}: {r}");
        let e = r["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{path} was read: {r}"));
        assert!(e.contains("outside the tools root"), "{path}: {e}");
    }
    let (st, r) = call(
        &[("x-tool-cwd", dir.to_str().unwrap())],
        json!({"tool": "read_file", "params": {"path": "outside.txt"}}),
    );
    assert_eq!(st, 200);
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("outside the tools root"),
        "{r}"
    );
    let (st, r) = call(
        &cwd,
        json!({"tool": "write_file", "params": {"path": "new/w.txt", "content": "w"}}),
    );
    assert_eq!(
        (st, r["result"].as_str()),
        (200, Some("file written successfully")),
        "{r}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("new/w.txt")).unwrap(),
        "w"
    );
    let (st, r) = call(
        &cwd,
        json!({"tool": "write_file", "params": {"path": "../escape.txt", "content": "w"}}),
    );
    assert_eq!(st, 200);
    assert!(r["error"].is_string(), "{r}");
    assert!(!dir.join("escape.txt").exists());

    // What would let a call reach past the root another way: a git config planted for
    // git to run, a pattern deep enough to overflow the matcher, a page elsewhere.
    let (_, r) = call(
        &cwd,
        json!({"tool": "write_file", "params": {"path": "r/.git/config", "content": "[core]"}}),
    );
    assert!(r["error"].as_str().unwrap().contains(".git"), "{r}");
    let deep = "*".repeat(200_000);
    let (_, r) = call(
        &cwd,
        json!({"tool": "file_glob_search", "params": {"path": ".", "include": deep}}),
    );
    assert!(r["error"].as_str().unwrap().contains("too long"), "{r}");
    let get_info = json!({"tool": "get_info"}).to_string();
    let (st, _) = s
        .try_request(
            "POST",
            "/tools",
            &[("Origin", "http://evil.example")],
            &get_info,
        )
        .unwrap();
    assert_eq!(st, 403, "tools on: only loopback origins by default");
    let (st, _) = s
        .try_request(
            "POST",
            "/tools",
            &[("Origin", "http://localhost:5173")],
            &get_info,
        )
        .unwrap();
    assert_eq!(st, 200);

    let (st, r) = call(&[], json!({"tool": "sh_echo", "params": {"message": "hi"}}));
    assert_eq!((st, &r), (200, &json!({"plain_text_response": "call 2"})));
    let (_, r) = call(&[], json!({"tool": "sh_echo", "params": {"message": "hi"}}));
    assert_eq!(
        r,
        json!({"plain_text_response": "call 3"}),
        "the process is kept"
    );

    let (st, r) = call(&[], json!({"tool": "rm_everything"}));
    assert_eq!(
        (st, &r["message"]),
        (404, &json!("unknown tool \"rm_everything\""))
    );
    assert_eq!(r["code"], 400, "llama-server's body for this 404");
    let (st, r) = call(
        &cwd,
        json!({"tool": "read_file", "stream": true, "params": {"path": "x"}}),
    );
    assert_eq!(st, 404, "{r}");
    let (st, _) = s.try_request("POST", "/tools", &[], "{not json").unwrap();
    assert_eq!(st, 400);
    let (st, r) = call(&[("x-tool-runtime", "fake:x")], json!({"tool": "get_info"}));
    assert_eq!(st, 500);
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("unknown tool runtime"),
        "{r}"
    );
    drop(s);

    std::fs::create_dir_all(dir.join("models")).unwrap();
    let root_flag = ["--tools-root", root_s.as_str()];
    for (args, why) in [
        (
            vec!["--mcp-servers-json", "not valid json"],
            "failed to parse MCP config JSON",
        ),
        (
            vec!["--mcp-servers-config", "/nonexistent/mcp.json"],
            "failed to open MCP config file",
        ),
        (vec!["--tools", "read_file,rm_rf"], "unknown tool \"rm_rf\""),
        (
            [&["--tools", "exec_shell_command"][..], &root_flag].concat(),
            "cannot be confined",
        ),
        (vec!["--tools-runtime", "docker:busybox"], "tool runtimes"),
    ] {
        let models = dir.join("models").display().to_string();
        refused_at_start(
            &[&["--models-dir", models.as_str()][..], &args].concat(),
            &[],
            why,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--models-memory-mib`: two models that do not fit together are swapped (the idle one
/// unloaded first) with the same greedy replies, never both loaded; a model larger than
/// the whole budget is refused with the numbers before anything loads.
#[test]
fn a_router_keeps_its_models_within_the_memory_budget() {
    let dir = std::env::temp_dir().join(format!("wgllm-budget-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let gemma = common::model_path("WGLLM_GEMMA3", "gemma-3-270m-q4_k_m.gguf");
    let files = [
        ("smol", std::path::PathBuf::from(common::smollm2())),
        ("gemma", gemma),
    ];
    for sub in ["free", "bounded", "tiny"] {
        std::fs::create_dir_all(dir.join(sub).join("models")).unwrap();
        for (name, path) in &files {
            let link = dir.join(sub).join("models").join(format!("{name}.gguf"));
            std::os::unix::fs::symlink(path, link).unwrap();
        }
    }
    let flags = ["--models-max", "0", "-c", "256", "-np", "1"];
    let ask = |s: &Server, model: &str| -> String {
        let body =
            json!({"model": model, "prompt": "Once upon a time", "n_predict": 8, "temperature": 0});
        let (st, b) = s.json("POST", "/completion", body);
        assert_eq!(st, 200, "{model}: {b}");
        b["content"].as_str().unwrap().to_string()
    };
    let loaded = |s: &Server| -> Vec<(String, u64)> {
        let (_, l) = s.json("GET", "/models", Value::Null);
        (l["data"].as_array().unwrap().iter())
            .filter(|m| m["status"]["value"] == "loaded")
            .map(|m| {
                let bytes = m["meta"]["device_bytes"].as_u64().unwrap();
                (m["id"].as_str().unwrap().to_string(), bytes)
            })
            .collect()
    };
    // No budget: both stay loaded, and each one's device memory is listed.
    let free = start_router(&dir.join("free"), &flags);
    let want: Vec<String> = ["smol", "gemma"].iter().map(|m| ask(&free, m)).collect();
    let held = loaded(&free);
    assert_eq!(held.len(), 2, "{held:?}");
    drop(free);
    let (small, large) = (held[0].1.min(held[1].1), held[0].1.max(held[1].1));
    assert!(small > 1 << 20, "{held:?}");
    // Room for the larger, not for both.
    let budget = ((large + small / 2) >> 20).to_string();
    let mut args = flags.to_vec();
    args.extend(["--models-memory-mib", &budget]);
    let s = start_router(&dir.join("bounded"), &args);
    for round in 0..2 {
        for (i, m) in ["smol", "gemma"].iter().enumerate() {
            assert_eq!(ask(&s, m), want[i], "{m}, round {round}");
            let now = loaded(&s);
            assert_eq!(now.len(), 1, "{m}, round {round}: {now:?}");
            assert_eq!(now[0].0, *m);
        }
    }
    drop(s);
    let mut args = flags.to_vec();
    args.extend(["--models-memory-mib", "1"]);
    let s = start_router(&dir.join("tiny"), &args);
    let (st, b) = s.json(
        "POST",
        "/completion",
        json!({"model": "smol", "prompt": "Hi"}),
    );
    assert_eq!(st, 500, "{b}");
    let m = b["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("MiB of device memory") && m.contains("--models-memory-mib 1"),
        "{m}"
    );
    assert!(loaded(&s).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
