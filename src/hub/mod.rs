//! `-hf ORG/NAME[:QUANT]`: a model from the Hugging Face Hub (or a mirror), resolved and
//! cached as llama.cpp does it — the repository's commit and file list from the Hub's
//! API, the GGUF for the quant llama.cpp would choose ([`select`]), stored in the cache
//! layout llama.cpp and huggingface_hub share ([`cache`]) — and downloaded better than
//! it: a broken download resumes (in the same run, then in the next), and the file's
//! size and LFS SHA-256 are checked before it is ever used.
//!
//! Environment, as llama.cpp reads it: `MODEL_ENDPOINT` or `HF_ENDPOINT` (default
//! `https://huggingface.co/`), `HF_TOKEN` for gated and private repositories, and the
//! cache variables of [`cache::hub_dir`].

pub mod cache;
pub mod select;

use cache::RepoDir;
use select::RepoSpec;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where models come from and go.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The Hub's address, ending in `/`.
    pub endpoint: String,
    pub token: Option<String>,
    /// Use the cache only.
    pub offline: bool,
    /// The hub cache directory.
    pub cache: PathBuf,
}

impl HubOptions {
    /// From the environment (see the module doc).
    pub fn from_env() -> Result<HubOptions, HubError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut endpoint = var("MODEL_ENDPOINT")
            .or_else(|| var("HF_ENDPOINT"))
            .unwrap_or_else(|| "https://huggingface.co/".into());
        if !endpoint.ends_with('/') {
            endpoint.push('/');
        }
        let cache = cache::hub_dir().ok_or(HubError::NoCacheDir)?;
        Ok(HubOptions {
            endpoint,
            token: var("HF_TOKEN"),
            offline: false,
            cache,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    Spec(String),
    #[error("no cache directory for downloaded models: set HF_HOME, HF_HUB_CACHE or LLAMA_CACHE")]
    NoCacheDir,
    #[error("cannot reach {url}: {detail}. Check the network (or MODEL_ENDPOINT / HF_ENDPOINT), or add --offline to use the models already in {cache}")]
    Network {
        url: String,
        detail: String,
        cache: String,
    },
    #[error("{url}: {status} {reason}")]
    Status {
        url: String,
        status: u16,
        reason: String,
    },
    #[error(
        "{repo} is not in the model cache ({cache}); run once without --offline to download it"
    )]
    NotCached { repo: String, cache: String },
    #[error("{repo} has no {wanted}; its GGUF files: {available}")]
    NoMatch {
        repo: String,
        wanted: String,
        available: String,
    },
    #[error("{path}: the download's {what} is {got}, the Hub says {want}; the file was deleted, run again to download it anew")]
    Mismatch {
        path: String,
        what: &'static str,
        got: String,
        want: String,
    },
    #[error("{what} {path}: {err}")]
    Io {
        what: &'static str,
        path: String,
        err: std::io::Error,
    },
}

impl HubError {
    fn io(what: &'static str, path: &Path, err: std::io::Error) -> HubError {
        HubError::Io {
            what,
            path: path.display().to_string(),
            err,
        }
    }
}

/// A file of a repository, as the Hub lists it.
#[derive(Debug, Clone)]
struct RemoteFile {
    path: String,
    size: Option<u64>,
    /// The blob's name in the cache: the LFS SHA-256, else the git object id.
    oid: String,
    sha256: Option<String>,
}

/// What [`fetch`] reports while it works.
pub trait Progress {
    /// Bytes of `file` downloaded so far, of `total` (0 when unknown).
    fn download(&mut self, file: &str, done: u64, total: u64);
    /// A line worth showing (which file, from where, a fallback to the cache).
    fn note(&mut self, line: &str);
}

/// The local path of the model `spec` (`ORG/NAME[:QUANT]`, or with `file` the exact
/// repository path of `-hff`), downloaded into the cache unless it is there already.
pub fn fetch(
    spec: &str,
    file: Option<&str>,
    opts: &HubOptions,
    progress: &mut dyn Progress,
) -> Result<PathBuf, HubError> {
    Ok(fetch_with_mmproj(spec, file, opts, false, progress)?.0)
}

/// [`fetch`], and with `mmproj` the repository's vision encoder for the model too
/// (llama.cpp's choice, [`select::best_mmproj`]), if it has one.
pub fn fetch_with_mmproj(
    spec: &str,
    file: Option<&str>,
    opts: &HubOptions,
    mmproj: bool,
    progress: &mut dyn Progress,
) -> Result<(PathBuf, Option<PathBuf>), HubError> {
    let spec = RepoSpec::parse(spec).map_err(HubError::Spec)?;
    let dir = RepoDir::new(&opts.cache, &spec.repo);
    let client = Client::new(opts);
    let listing = if opts.offline {
        None
    } else {
        match client.listing(&spec.repo) {
            Ok(l) => Some(l),
            Err(e @ HubError::Network { .. }) if dir.cached_commit().is_some() => {
                progress.note(&format!("{e}; using the cached copy"));
                None
            }
            Err(e) => return Err(e),
        }
    };
    let (commit, files) = match listing {
        Some(l) => l,
        None => {
            let commit = dir.cached_commit().ok_or_else(|| HubError::NotCached {
                repo: spec.repo.clone(),
                cache: opts.cache.display().to_string(),
            })?;
            let files = (dir.snapshot_files(&commit).into_iter())
                .map(|path| RemoteFile {
                    path,
                    size: None,
                    oid: String::new(),
                    sha256: None,
                })
                .collect();
            (commit, files)
        }
    };
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let chosen = match file {
        Some(f) => paths.iter().copied().find(|p| *p == f),
        None => select::choose(&paths, &spec),
    };
    let Some(chosen) = chosen else {
        let ggufs: Vec<&str> = paths
            .iter()
            .copied()
            .filter(|p| p.ends_with(".gguf"))
            .collect();
        return Err(HubError::NoMatch {
            repo: spec.repo.clone(),
            wanted: match (file, &spec.tag) {
                (Some(f), _) => format!("file {f}"),
                (None, Some(t)) => format!("GGUF for quant {t}"),
                (None, None) => "model GGUF".into(),
            },
            available: if ggufs.is_empty() {
                "none".into()
            } else {
                ggufs.join(", ")
            },
        });
    };
    // A split model: every part, each beside the others in the snapshot (the loader
    // finds them by name from the first).
    let mut parts = select::parts_of(&paths, chosen);
    let local = dir.snapshot(&commit, chosen);
    let encoder = select::best_mmproj(&paths, chosen).filter(|_| mmproj);
    parts.extend(encoder);
    let encoder = encoder.map(|e| dir.snapshot(&commit, e));
    if parts.iter().all(|p| dir.snapshot(&commit, p).exists()) {
        progress.note(&format!("{}: {chosen} (cached)", spec.repo));
        return Ok((local, encoder));
    }
    for part in &parts {
        let target = dir.snapshot(&commit, part);
        if target.exists() {
            continue;
        }
        let remote = files
            .iter()
            .find(|f| f.path == *part)
            .ok_or_else(|| HubError::NotCached {
                repo: spec.repo.clone(),
                cache: opts.cache.display().to_string(),
            })?;
        progress.note(&format!(
            "{}: downloading {part} from {}",
            spec.repo, opts.endpoint
        ));
        let blob = client.download(&spec.repo, &commit, remote, &dir, progress)?;
        dir.link(&commit, part, &blob)
            .map_err(|e| HubError::io("linking", &target, e))?;
    }
    dir.set_ref("main", &commit)
        .map_err(|e| HubError::io("writing the ref of", &dir.0, e))?;
    Ok((local, encoder))
}

struct Client<'a> {
    agent: ureq::Agent,
    opts: &'a HubOptions,
}

/// Attempts per download before giving up (a broken transfer resumes each time).
const ATTEMPTS: u32 = 3;

impl<'a> Client<'a> {
    fn new(opts: &'a HubOptions) -> Client<'a> {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(15)))
            .user_agent(format!("wgllm/{}", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent: ureq::Agent::new_with_config(config),
            opts,
        }
    }

    fn network(&self, url: &str, e: impl std::fmt::Display) -> HubError {
        HubError::Network {
            url: url.to_string(),
            detail: e.to_string(),
            cache: self.opts.cache.display().to_string(),
        }
    }

    fn get(
        &self,
        url: &str,
        range_from: u64,
    ) -> Result<ureq::http::Response<ureq::Body>, HubError> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.opts.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.header("Range", format!("bytes={range_from}-"));
        }
        req.call().map_err(|e| self.network(url, e))
    }

    /// An error for a response that is not a success, saying what to do.
    fn status_error(&self, url: &str, repo: &str, status: u16) -> HubError {
        let reason = match status {
            401 | 403 => format!(
                "{repo} is gated or private: {}",
                if self.opts.token.is_some() {
                    "the token in HF_TOKEN (or --hf-token) has no access to it; accept its terms on the Hub or use another token"
                } else {
                    "set HF_TOKEN (or --hf-token) to a token that has access"
                }
            ),
            404 => format!("no such repository or file ({repo}); check the name"),
            429 => "too many requests; wait a little and try again".into(),
            s if s >= 500 => "the server failed; try again later".into(),
            _ => "unexpected answer".into(),
        };
        HubError::Status {
            url: url.to_string(),
            status,
            reason,
        }
    }

    fn json(&self, url: &str, repo: &str) -> Result<serde_json::Value, HubError> {
        let mut resp = self.get(url, 0)?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(self.status_error(url, repo, status));
        }
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| self.network(url, e))?;
        serde_json::from_str(&text).map_err(|e| HubError::Status {
            url: url.to_string(),
            status,
            reason: format!("the answer is not JSON ({e})"),
        })
    }

    /// The commit of the repository's main branch and its files.
    fn listing(&self, repo: &str) -> Result<(String, Vec<RemoteFile>), HubError> {
        let ep = &self.opts.endpoint;
        let url = format!("{ep}api/models/{repo}/refs");
        let refs = self.json(&url, repo)?;
        let branches = refs["branches"].as_array().cloned().unwrap_or_default();
        let commit_of = |b: &serde_json::Value| {
            b["targetCommit"]
                .as_str()
                .filter(|c| c.len() == 40 && c.bytes().all(|x| x.is_ascii_hexdigit()))
                .map(String::from)
        };
        let commit = (branches.iter())
            .find(|b| b["name"] == "main")
            .and_then(commit_of)
            .or_else(|| branches.iter().find_map(commit_of))
            .ok_or_else(|| HubError::Status {
                url: url.clone(),
                status: 200,
                reason: "no branch with a commit in the answer".into(),
            })?;
        let url = format!("{ep}api/models/{repo}/tree/{commit}?recursive=true");
        let tree = self.json(&url, repo)?;
        let files = (tree.as_array().cloned().unwrap_or_default().iter())
            .filter(|e| e["type"] == "file")
            .filter_map(|e| {
                let path = e["path"].as_str()?.to_string();
                if path.split('/').any(|c| c == ".." || c.is_empty()) {
                    return None;
                }
                let sha256 = e["lfs"]["oid"]
                    .as_str()
                    .filter(|o| o.len() == 64 && o.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(|o| o.to_ascii_lowercase());
                let oid = sha256
                    .clone()
                    .or_else(|| e["oid"].as_str().map(String::from))?;
                let size = e["lfs"]["size"].as_u64().or_else(|| e["size"].as_u64());
                Some(RemoteFile {
                    path,
                    size,
                    oid,
                    sha256,
                })
            })
            .collect();
        Ok((commit, files))
    }

    /// Downloads `f` into its blob (through `<blob>.downloadInProgress`, resumed where a
    /// previous attempt or run stopped) and checks its size and SHA-256.
    fn download(
        &self,
        repo: &str,
        commit: &str,
        f: &RemoteFile,
        dir: &RepoDir,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, HubError> {
        let blob = dir.blob(&f.oid);
        if blob.exists() && verify(&blob, f).is_ok() {
            return Ok(blob);
        }
        let parent = blob.parent().expect("a blob has a folder");
        std::fs::create_dir_all(parent).map_err(|e| HubError::io("creating", parent, e))?;
        let tmp = PathBuf::from(format!("{}.downloadInProgress", blob.display()));
        let url = format!("{}{repo}/resolve/{commit}/{}", self.opts.endpoint, f.path);
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_secs(1 << attempt));
            }
            match self.transfer(&url, repo, &tmp, f, progress) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e @ (HubError::Network { .. } | HubError::Status { status: 500.., .. })) => {
                    progress.note(&format!("{e}; resuming"));
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        if let Err(e) = verify(&tmp, f) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &blob).map_err(|e| HubError::io("renaming", &tmp, e))?;
        Ok(blob)
    }

    /// One attempt: appends to `tmp` from where it ends.
    fn transfer(
        &self,
        url: &str,
        repo: &str,
        tmp: &Path,
        f: &RemoteFile,
        progress: &mut dyn Progress,
    ) -> Result<(), HubError> {
        let have = std::fs::metadata(tmp).map_or(0, |m| m.len());
        if f.size.is_some_and(|s| have == s && s > 0) {
            return Ok(());
        }
        let mut resp = self.get(url, have)?;
        let status = resp.status().as_u16();
        let append = match status {
            206 => true,
            200 => false,
            // Asked past the end: what we have is all there is (the checks decide).
            416 if have > 0 => return Ok(()),
            s => return Err(self.status_error(url, repo, s)),
        };
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(tmp)
            .map_err(|e| HubError::io("opening", tmp, e))?;
        let mut done = if append { have } else { 0 };
        let total = f.size.unwrap_or(0);
        let mut reader = resp.body_mut().as_reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut shown = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return Err(self.network(url, e)),
            };
            out.write_all(&buf[..n]).map_err(|e| {
                HubError::io(
                    "writing (the partial download is kept and resumes on the next run)",
                    tmp,
                    e,
                )
            })?;
            done += n as u64;
            if done - shown >= 1 << 20 || done == total {
                progress.download(&f.path, done, total);
                shown = done;
            }
        }
        out.flush().map_err(|e| HubError::io("writing", tmp, e))?;
        progress.download(&f.path, done, total);
        if total > 0 && done < total {
            return Err(self.network(
                url,
                format!("the transfer stopped at {done} of {total} bytes"),
            ));
        }
        Ok(())
    }
}

/// Whether `path` has the size and SHA-256 the Hub gave for `f`.
fn verify(path: &Path, f: &RemoteFile) -> Result<(), HubError> {
    let mismatch = |what, got: String, want: String| HubError::Mismatch {
        path: path.display().to_string(),
        what,
        got,
        want,
    };
    let len = std::fs::metadata(path)
        .map_err(|e| HubError::io("reading", path, e))?
        .len();
    if let Some(size) = f.size {
        if len != size {
            return Err(mismatch(
                "size",
                format!("{len} bytes"),
                format!("{size} bytes"),
            ));
        }
    }
    if let Some(want) = &f.sha256 {
        let mut h = Sha256::new();
        let mut file = std::fs::File::open(path).map_err(|e| HubError::io("reading", path, e))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| HubError::io("reading", path, e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if &got != want {
            return Err(mismatch("SHA-256", got, want.clone()));
        }
    }
    Ok(())
}
