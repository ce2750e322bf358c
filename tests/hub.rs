//! `-hf` against a Hugging Face Hub stand-in on 127.0.0.1: the refs and tree API and
//! `resolve` downloads (with ranges), a gated repository, connections cut midway, wrong
//! checksums. The cache must come out in the layout llama.cpp and huggingface_hub use.

#![cfg(feature = "hub")]

mod common;

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use wgllm::hub::{fetch, HubError, HubOptions, Progress};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

#[derive(Default)]
struct Repo {
    files: Vec<(String, Arc<Vec<u8>>)>,
    /// Needs `Authorization: Bearer good-token`.
    gated: bool,
    /// The SHA-256 the tree lists for a file, when not its own.
    wrong_sha: HashMap<String, String>,
}

#[derive(Default)]
struct Hub {
    repos: HashMap<String, Repo>,
    /// Downloads still to be cut after half their bytes.
    cuts: usize,
    /// Every request: path and Range header.
    log: Vec<(String, Option<String>)>,
}

/// The stand-in: one thread per connection, `Connection: close` answers.
struct Server {
    port: u16,
    hub: Arc<Mutex<Hub>>,
}

impl Server {
    fn start(hub: Hub) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hub = Arc::new(Mutex::new(hub));
        let h = hub.clone();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                let h = h.clone();
                std::thread::spawn(move || answer(s, &h));
            }
        });
        Server { port, hub }
    }
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
    fn downloads(&self) -> Vec<Option<String>> {
        let hub = self.hub.lock().unwrap();
        (hub.log.iter())
            .filter(|(p, _)| p.contains("/resolve/"))
            .map(|(_, r)| r.clone())
            .collect()
    }
}

fn answer(mut s: TcpStream, hub: &Mutex<Hub>) {
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    let mut hub = hub.lock().unwrap();
    hub.log.push((path.clone(), range.clone()));
    let authorized = headers.get("authorization").map(String::as_str) == Some("Bearer good-token");
    let send = |s: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(body);
    };
    let not_found = |s: &mut TcpStream| {
        send(
            s,
            "404 Not Found",
            "",
            b"{\"error\":\"Repository not found\"}",
        )
    };
    let repo_of = |rest: &str| -> Option<(String, String)> {
        let mut parts = rest.splitn(3, '/');
        let repo = format!("{}/{}", parts.next()?, parts.next()?);
        Some((repo, parts.next().unwrap_or("").to_string()))
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo_id, tail)) = repo_of(rest) else {
            return not_found(&mut s);
        };
        let Some(repo) = hub.repos.get(&repo_id) else {
            return not_found(&mut s);
        };
        if repo.gated && !authorized {
            return send(
                &mut s,
                "401 Unauthorized",
                "",
                b"{\"error\":\"Access to this model is restricted\"}",
            );
        }
        let body = if tail == "refs" {
            serde_json::json!({"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": COMMIT}], "tags": []})
        } else if tail.starts_with(&format!("tree/{COMMIT}")) {
            let files: Vec<serde_json::Value> = (repo.files.iter())
                .map(|(p, b)| {
                    let sha = repo.wrong_sha.get(p).cloned().unwrap_or_else(|| sha256(b));
                    serde_json::json!({"type": "file", "path": p, "size": b.len(), "oid": "ab".repeat(20),
                        "lfs": {"oid": sha, "size": b.len(), "pointerSize": 130}})
                })
                .collect();
            serde_json::Value::Array(files)
        } else {
            return not_found(&mut s);
        };
        return send(
            &mut s,
            "200 OK",
            "Content-Type: application/json\r\n",
            body.to_string().as_bytes(),
        );
    }
    let Some((repo_id, tail)) = repo_of(path.trim_start_matches('/')) else {
        return not_found(&mut s);
    };
    let Some(file) = tail.strip_prefix(&format!("resolve/{COMMIT}/")) else {
        return not_found(&mut s);
    };
    let Some(repo) = hub.repos.get(&repo_id) else {
        return not_found(&mut s);
    };
    if repo.gated && !authorized {
        return send(&mut s, "401 Unauthorized", "", b"");
    }
    let Some((_, bytes)) = repo.files.iter().find(|(p, _)| p == file) else {
        return not_found(&mut s);
    };
    let bytes = bytes.clone();
    let from: usize = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse().ok())
        .unwrap_or(0);
    let cut = hub.cuts > 0;
    if cut {
        hub.cuts -= 1;
    }
    drop(hub);
    let body = &bytes[from.min(bytes.len())..];
    let (status, extra) = if from > 0 {
        (
            "206 Partial Content",
            format!(
                "Content-Range: bytes {from}-{}/{}\r\n",
                bytes.len() - 1,
                bytes.len()
            ),
        )
    } else {
        ("200 OK", String::new())
    };
    if cut {
        // Promise the whole body, send half of it, hang up.
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(&body[..body.len() / 2]);
        let _ = s.flush();
        let _ = s.shutdown(std::net::Shutdown::Both);
        return;
    }
    send(&mut s, status, &extra, body);
}

fn bytes(seed: u8, n: usize) -> Arc<Vec<u8>> {
    let mut x = seed as u32 | 1;
    Arc::new(
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect(),
    )
}

fn opts(server: &Server, cache: &Path) -> HubOptions {
    HubOptions {
        endpoint: server.endpoint(),
        token: None,
        offline: false,
        cache: cache.to_path_buf(),
    }
}

#[derive(Default)]
struct Seen {
    notes: Vec<String>,
    last: (u64, u64),
}
impl Progress for Seen {
    fn download(&mut self, _: &str, done: u64, total: u64) {
        self.last = (done, total);
    }
    fn note(&mut self, line: &str) {
        self.notes.push(line.to_string());
    }
}

fn quant_repo() -> Repo {
    Repo {
        files: vec![
            ("README.md".into(), bytes(1, 100)),
            ("model-Q8_0.gguf".into(), bytes(2, 300_000)),
            ("mmproj-model-Q4_K_M.gguf".into(), bytes(3, 1000)),
            ("model-Q4_K_M.gguf".into(), bytes(4, 200_000)),
            ("split-Q2_K-00001-of-00002.gguf".into(), bytes(5, 1000)),
            ("split-Q2_K-00002-of-00002.gguf".into(), bytes(6, 1000)),
        ],
        ..Repo::default()
    }
}

#[test]
fn picks_llama_cpp_s_quant_and_caches_it_in_the_hf_layout() {
    let mut hub = Hub::default();
    hub.repos.insert("org/model-GGUF".into(), quant_repo());
    let server = Server::start(hub);
    let cache = common::scratch_dir("layout");
    let o = opts(&server, &cache);
    let mut seen = Seen::default();
    let p = fetch("org/model-GGUF", None, &o, &mut seen).unwrap();
    let repo_dir = cache.join("models--org--model-GGUF");
    assert_eq!(
        p,
        repo_dir.join(format!("snapshots/{COMMIT}/model-Q4_K_M.gguf"))
    );
    assert_eq!(std::fs::read(&p).unwrap(), *bytes(4, 200_000));
    let sha = sha256(&bytes(4, 200_000));
    assert_eq!(
        std::fs::read_link(&p).unwrap(),
        PathBuf::from(format!("../../blobs/{sha}")),
        "a relative link into blobs/, named by the LFS SHA-256"
    );
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    assert_eq!(seen.last, (200_000, 200_000));
    // Cached: no second download.
    let again = fetch("org/model-GGUF", None, &o, &mut Seen::default()).unwrap();
    assert_eq!(again, p);
    assert_eq!(server.downloads().len(), 1);
    // With its mmproj (llama.cpp's choice: the one beside it), downloaded once too.
    let (m, mm) =
        wgllm::hub::fetch_with_mmproj("org/model-GGUF", None, &o, true, &mut Seen::default())
            .unwrap();
    assert_eq!(m, p);
    let mm = mm.expect("the repository's mmproj");
    assert!(mm.ends_with("mmproj-model-Q4_K_M.gguf"), "{}", mm.display());
    assert_eq!(std::fs::read(&mm).unwrap(), *bytes(3, 1000));
    assert_eq!(server.downloads().len(), 2);
    // A named quant, any case; -hff names the file itself.
    let q8 = fetch("org/model-GGUF:q8_0", None, &o, &mut Seen::default()).unwrap();
    assert_eq!(std::fs::read(&q8).unwrap(), *bytes(2, 300_000));
    let f = fetch(
        "org/model-GGUF",
        Some("README.md"),
        &o,
        &mut Seen::default(),
    )
    .unwrap();
    assert!(f.ends_with("README.md"));
    // What the app's picker lists: the model GGUFs of the cached snapshot.
    let listed = wgllm::hub::cache::cached_models(&cache);
    assert_eq!(
        listed,
        vec![
            repo_dir.join(format!("snapshots/{COMMIT}/model-Q4_K_M.gguf")),
            q8.clone()
        ]
    );
    // A missing quant lists what there is; a split model comes whole, named by its first
    // part.
    let e = fetch("org/model-GGUF:Q5_K_M", None, &o, &mut Seen::default()).unwrap_err();
    assert!(matches!(e, HubError::NoMatch { .. }), "{e}");
    assert!(e.to_string().contains("model-Q8_0.gguf"), "{e}");
    let split = fetch("org/model-GGUF:Q2_K", None, &o, &mut Seen::default()).unwrap();
    assert!(split.ends_with("split-Q2_K-00001-of-00002.gguf"));
    assert_eq!(
        std::fs::read(split.with_file_name("split-Q2_K-00002-of-00002.gguf")).unwrap(),
        *bytes(6, 1000)
    );
    // Offline, from the cache alone (the Hub is not asked).
    let before = server.hub.lock().unwrap().log.len();
    let off = HubOptions {
        offline: true,
        ..o.clone()
    };
    assert_eq!(
        fetch("org/model-GGUF", None, &off, &mut Seen::default()).unwrap(),
        p
    );
    assert_eq!(server.hub.lock().unwrap().log.len(), before);
    let e = fetch("org/other", None, &off, &mut Seen::default()).unwrap_err();
    assert!(matches!(e, HubError::NotCached { .. }), "{e}");
}

#[test]
fn a_cut_download_resumes_in_the_same_run_and_in_the_next() {
    let mut hub = Hub::default();
    hub.repos.insert("org/m".into(), quant_repo());
    hub.cuts = 1;
    let server = Server::start(hub);
    let cache = common::scratch_dir("resume");
    let o = opts(&server, &cache);
    let p = fetch("org/m", None, &o, &mut Seen::default()).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), *bytes(4, 200_000));
    let d = server.downloads();
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0], None);
    assert_eq!(
        d[1].as_deref(),
        Some("bytes=100000-"),
        "resumed where the cut left it"
    );

    // Every attempt of a run cut: the run fails, the partial file stays, the next run
    // finishes it.
    server.hub.lock().unwrap().cuts = 3;
    let e = fetch("org/m:Q8_0", None, &o, &mut Seen::default()).unwrap_err();
    assert!(matches!(e, HubError::Network { .. }), "{e}");
    let sha = sha256(&bytes(2, 300_000));
    let partial = cache.join(format!("models--org--m/blobs/{sha}.downloadInProgress"));
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 200_000 && kept < 300_000, "{kept}");
    let p = fetch("org/m:Q8_0", None, &o, &mut Seen::default()).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), *bytes(2, 300_000));
    assert_eq!(
        server.downloads().last().unwrap().as_deref(),
        Some(format!("bytes={kept}-").as_str())
    );
    assert!(!partial.exists());
}

#[test]
fn wrong_checksums_404s_and_gated_repositories_are_clear_errors() {
    let mut hub = Hub::default();
    let mut bad = quant_repo();
    bad.wrong_sha
        .insert("model-Q4_K_M.gguf".into(), "0".repeat(64));
    hub.repos.insert("org/bad".into(), bad);
    hub.repos.insert(
        "org/gated".into(),
        Repo {
            gated: true,
            ..quant_repo()
        },
    );
    let server = Server::start(hub);
    let cache = common::scratch_dir("errors");
    let o = opts(&server, &cache);
    let e = fetch("org/bad", None, &o, &mut Seen::default()).unwrap_err();
    assert!(
        matches!(
            e,
            HubError::Mismatch {
                what: "SHA-256",
                ..
            }
        ),
        "{e}"
    );
    assert!(!cache
        .join(format!(
            "models--org--bad/snapshots/{COMMIT}/model-Q4_K_M.gguf"
        ))
        .exists());
    let blobs: Vec<_> = std::fs::read_dir(cache.join("models--org--bad/blobs"))
        .unwrap()
        .collect();
    assert!(blobs.is_empty(), "nothing of a corrupt download is kept");

    let e = fetch("org/missing", None, &o, &mut Seen::default()).unwrap_err();
    assert!(
        e.to_string().contains("404") && e.to_string().contains("check the name"),
        "{e}"
    );
    let e = fetch("org/gated", None, &o, &mut Seen::default()).unwrap_err();
    assert!(
        e.to_string().contains("401") && e.to_string().contains("HF_TOKEN"),
        "{e}"
    );
    let with_token = HubOptions {
        token: Some("good-token".into()),
        ..o.clone()
    };
    let p = fetch("org/gated", None, &with_token, &mut Seen::default()).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), *bytes(4, 200_000));
    let e = fetch("not a repo", None, &o, &mut Seen::default()).unwrap_err();
    assert!(e.to_string().contains("ORG/NAME"), "{e}");
}

/// A file llama.cpp put in the cache (a plain file in the snapshot, llama.cpp's fallback
/// where links fail) is used as it is, with the Hub down or up.
#[test]
fn files_llama_cpp_downloaded_are_used_without_a_download() {
    let cache = common::scratch_dir("shared");
    let repo_dir = cache.join("models--ggml-org--tiny-GGUF");
    std::fs::create_dir_all(repo_dir.join(format!("snapshots/{COMMIT}"))).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), COMMIT).unwrap();
    let file = repo_dir.join(format!("snapshots/{COMMIT}/tiny-Q8_0.gguf"));
    std::fs::write(&file, b"GGUF...").unwrap();
    // Nothing listens on this port: the Hub is unreachable.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let o = HubOptions {
        endpoint: format!("http://127.0.0.1:{port}/"),
        token: None,
        offline: false,
        cache: cache.clone(),
    };
    let mut seen = Seen::default();
    assert_eq!(
        fetch("ggml-org/tiny-GGUF", None, &o, &mut seen).unwrap(),
        file
    );
    assert!(
        seen.notes.iter().any(|n| n.contains("cached copy")),
        "{:?}",
        seen.notes
    );
    // Reachable, same commit: the file is there, nothing is downloaded.
    let mut hub = Hub::default();
    hub.repos.insert(
        "ggml-org/tiny-GGUF".into(),
        Repo {
            files: vec![("tiny-Q8_0.gguf".into(), bytes(9, 7))],
            ..Repo::default()
        },
    );
    let server = Server::start(hub);
    assert_eq!(
        fetch(
            "ggml-org/tiny-GGUF",
            None,
            &opts(&server, &cache),
            &mut Seen::default()
        )
        .unwrap(),
        file
    );
    assert!(server.downloads().is_empty());
}

/// `wgllm run -hf` through HF_ENDPOINT and HF_HOME: SmolLM2 served by the stand-in,
/// downloaded with a progress bar, answering as `-m` does, then again `--offline`; and
/// SmolLM2 split into two files, downloaded whole and answering the same.
#[test]
fn run_with_hf_answers_like_the_local_file() {
    let model = common::smollm2();
    let mut hub = Hub::default();
    hub.repos.insert(
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF".into(),
        Repo {
            files: vec![(
                "smollm2-135m-instruct-q4_1.gguf".into(),
                Arc::new(std::fs::read(&model).unwrap()),
            )],
            ..Repo::default()
        },
    );
    let split_dir = common::scratch_dir("hub-split");
    let whole = wgllm::gguf::GgufFile::open(&model).unwrap();
    let parts = wgllm::gguf::write_split(&whole, &split_dir.join("smol-Q4_1"), 2).unwrap();
    hub.repos.insert(
        "org/split-GGUF".into(),
        Repo {
            files: (parts.iter())
                .map(|p| {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    (format!("Q4_1/{name}"), Arc::new(std::fs::read(p).unwrap()))
                })
                .collect(),
            ..Repo::default()
        },
    );
    let server = Server::start(hub);
    let home = common::scratch_dir("cli");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-p",
            "The capital of France is",
            "-n",
            "8",
            "--temp",
            "0",
        ];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgllm"))
            .args(&args)
            .env("HF_ENDPOINT", server.endpoint())
            .env("HF_HOME", &home)
            .env_remove("LLAMA_CACHE")
            .env_remove("HF_HUB_CACHE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        (String::from_utf8(out.stdout).unwrap(), err)
    };
    let (local, _) = run(&["-m", &model]);
    let (hf, err) = run(&["-hf", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"]);
    assert_eq!(hf, local);
    assert!(
        err.contains("downloading smollm2-135m-instruct-q4_1.gguf"),
        "{err}"
    );
    assert!(home
        .join("hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/refs/main")
        .exists());
    let (off, _) = run(&[
        "-hf",
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1",
        "--offline",
    ]);
    assert_eq!(off, local);
    assert_eq!(server.downloads().len(), 1);
    let (split, _) = run(&["-hf", "org/split-GGUF:Q4_1"]);
    assert_eq!(split, local);
    assert_eq!(server.downloads().len(), 3, "both parts");
    let _ = std::fs::remove_dir_all(&split_dir);
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; the status and body (whole, the server
/// closes the connection).
fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::Read;
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The router's model store through the Hub's stand-in: `POST /models` downloads a
/// model into the cache in the background, telling `/models/sse` listeners its
/// progress and its end; the model is then listed (a cache entry) and answers; `DELETE
/// /models` unloads it, removes it from the cache and from the list. A name that is not
/// ORG/NAME, one that exists, and one that is not cached get llama-server's errors.
#[test]
fn a_router_downloads_and_removes_models() {
    let model = common::smollm2();
    let mut hub = Hub::default();
    hub.repos.insert(
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF".into(),
        Repo {
            files: vec![(
                "smollm2-135m-instruct-q4_1.gguf".into(),
                Arc::new(std::fs::read(&model).unwrap()),
            )],
            ..Repo::default()
        },
    );
    let server = Server::start(hub);
    let home = common::scratch_dir("router-store");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(["serve", "--port", &port.to_string(), "-c", "512"])
        .env("HF_ENDPOINT", server.endpoint())
        .env("HF_HOME", &home)
        .env_remove("LLAMA_CACHE")
        .env_remove("HF_HUB_CACHE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed().as_secs() < 30, "the router did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Listen to the events first.
    let events = Arc::new(Mutex::new(Vec::<serde_json::Value>::new()));
    {
        let events = events.clone();
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"GET /models/sse HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(c).lines() {
                let Ok(line) = line else { return };
                if let Some(d) = line.strip_prefix("data: ") {
                    events
                        .lock()
                        .unwrap()
                        .push(serde_json::from_str(d).unwrap());
                }
            }
        });
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let name = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1";
    let (st, b) = http(
        port,
        "POST",
        "/models",
        &format!("{{\"model\":\"{name}\"}}"),
    );
    assert_eq!(st, 200, "{b}");
    let has =
        |ev: &str| (events.lock().unwrap().iter()).any(|e| e["event"] == ev && e["model"] == name);
    let t0 = std::time::Instant::now();
    while !has("download_finished") {
        assert!(!has("download_failed"), "{:?}", events.lock().unwrap());
        assert!(t0.elapsed().as_secs() < 60, "no download_finished event");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(has("download_progress"));
    let (_, list) = http(port, "GET", "/models", "");
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let entry = (list["data"].as_array().unwrap().iter())
        .find(|m| m["id"] == name)
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(entry["source"], "cache");
    let ask = format!("{{\"model\":\"{name}\",\"prompt\":\"The capital of France is\",\"n_predict\":6,\"temperature\":0}}");
    let (st, b) = http(port, "POST", "/completion", &ask);
    assert_eq!(st, 200, "{b}");
    assert!(b.contains("Paris"), "{b}");
    let (st, b) = http(
        port,
        "POST",
        "/models",
        &format!("{{\"model\":\"{name}\"}}"),
    );
    assert_eq!(st, 400, "already there: {b}");
    let (st, b) = http(port, "POST", "/models", "{\"model\":\"not a repo\"}");
    assert_eq!(st, 400, "{b}");
    let (st, b) = http(port, "DELETE", &format!("/models?model={name}"), "");
    assert_eq!(st, 200, "{b}");
    assert!(!home
        .join("hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF")
        .exists());
    let (_, list) = http(port, "GET", "/models", "");
    assert!(!list.contains(name), "{list}");
    let (st, b) = http(port, "DELETE", &format!("/models?model={name}"), "");
    assert_eq!(st, 500, "{b}");
    assert!(has("model_remove"));
    let _ = child.kill();
    let _ = child.wait();
}
