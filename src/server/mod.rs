//! `wgllm serve`: llama-server's and OpenAI's HTTP APIs (and Anthropic's Messages API)
//! over the [`EngineService`]. The server listens before the model is loaded (`/health`
//! answers 503 until it is), tokenizes and renders chat templates on its own tasks, and
//! never waits on the GPU: the engine's thread does.
//!
//! Endpoints by format: `native.rs` (llama-server's `/completion`, `/tokenize`, `/props`,
//! `/slots`, ...), `openai.rs` (`/v1/models`, `/v1/completions`, `/v1/chat/completions`),
//! `anthropic.rs` (`/v1/messages`), `metrics.rs` (`/metrics`), `resumable.rs`
//! (`/v1/stream`: streams kept under `X-Conversation-Id`); `http.rs` holds what every
//! request passes through (API key, CORS, body limits, unknown paths).

mod anthropic;
pub mod bodies;
mod chat;
mod embeddings;
mod error;
mod gen;
mod http;
mod infill;
mod metrics;
mod native;
mod openai;
mod params;
mod rerank;
mod responses;
mod resumable;
mod tools;

pub use error::ApiError;
pub use params::Defaults;

use crate::engine::service::EngineService;
use crate::engine::Engine;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// How the server is set up (llama-server's flags).
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub host: String,
    pub port: u16,
    /// The model's names (`-a`, sorted; the first is its id); none: the file's path.
    pub aliases: Vec<String>,
    /// Tags listed with the model (`--tags`, sorted).
    pub tags: Vec<String>,
    pub model_path: PathBuf,
    /// Accepted keys (`--api-key`, `--api-key-file`); empty: no key needed.
    pub api_keys: Vec<String>,
    pub metrics: bool,
    pub slots: bool,
    /// Where `/slots/{id}?action=save|restore` keep files; `None`: those are refused.
    pub slot_save_path: Option<PathBuf>,
    pub defaults: Defaults,
    /// Origins allowed by CORS (`*`: any, as llama-server allows by default).
    pub cors_origins: Vec<String>,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Seconds a client may take to send a request's head (`-to`).
    pub timeout_s: u64,
    /// HTTP worker threads (`--threads-http`; 0: one per core).
    pub threads_http: usize,
    /// Every chat reply carries `__verbose` (the rendered prompt), as with llama-server's
    /// `--verbose`; else only where a request asks (`"verbose": true`).
    pub verbose: bool,
    /// The engine service's prompt cache (`--cache-ram`, `--cache-idle-slots`).
    pub service: crate::engine::service::ServiceOptions,
    /// How an embeddings server (`--embeddings`) pools each input's token states
    /// (`--pooling`).
    pub pooling: crate::engine::Pooling,
    /// `/infill` prompts in suffix-prefix-middle order (`--spm-infill`).
    pub spm_infill: bool,
    /// `-b` as given (not capped at the context, as the engine caps it): `/infill` cuts
    /// its parts to it, as llama-server does.
    pub n_batch: u32,
}

/// What every handler sees.
pub struct AppState {
    pub opts: ServerOptions,
    /// Set once the model is loaded.
    service: OnceLock<EngineService>,
    /// Set if loading failed: the reason `/health` gives.
    load_error: OnceLock<String>,
    pub started: std::time::Instant,
    /// Streamed replies kept for `/v1/stream` (requests with `X-Conversation-Id`).
    streams: resumable::StreamStore,
}

impl AppState {
    pub(crate) fn service(&self) -> Result<&EngineService, ApiError> {
        if let Some(s) = self.service.get() {
            return Ok(s);
        }
        Err(match self.load_error.get() {
            Some(e) => ApiError::server(format!("the model failed to load: {e}")),
            None => ApiError::unavailable("Loading model"),
        })
    }

    /// The model's name in replies.
    pub(crate) fn model_name(&self) -> String {
        (self.opts.aliases.first().cloned())
            .unwrap_or_else(|| self.opts.model_path.display().to_string())
    }
}

/// Runs the server until Ctrl-C (or SIGTERM): binds first, then loads the model with
/// `load` on a thread of its own; `ready` is called with the bound addresses once the
/// model serves. Returns an error if no address can be bound or the model fails to load.
pub fn serve(
    opts: ServerOptions,
    load: impl Fn() -> anyhow::Result<Engine> + Send + Sync + 'static,
    ready: impl FnOnce(&[SocketAddr]) + Send + 'static,
) -> anyhow::Result<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if opts.threads_http > 0 {
        rt.worker_threads(opts.threads_http);
    }
    rt.enable_all().build()?.block_on(run(opts, load, ready))
}

async fn run(
    opts: ServerOptions,
    load: impl Fn() -> anyhow::Result<Engine> + Send + Sync + 'static,
    ready: impl FnOnce(&[SocketAddr]) + Send + 'static,
) -> anyhow::Result<()> {
    let state = Arc::new(AppState {
        opts: opts.clone(),
        service: OnceLock::new(),
        load_error: OnceLock::new(),
        started: std::time::Instant::now(),
        streams: Default::default(),
    });
    let app = http::router(state.clone());
    let mut listeners = Vec::new();
    for host in opts
        .host
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
    {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let l = tokio::net::TcpListener::bind((host, opts.port))
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {host}:{}: {e}", opts.port))?;
        listeners.push(l);
    }
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    for a in &addrs {
        log::info!("listening on http://{a} (loading the model)");
    }
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut servers = tokio::task::JoinSet::new();
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    for l in listeners {
        servers.spawn(accept_loop(
            l,
            app.clone(),
            stop_tx.subscribe(),
            std::time::Duration::from_secs(opts.timeout_s.max(1)),
            open.clone(),
        ));
    }
    // The model loads on a thread of its own (it blocks on the GPU and the disk); the
    // service loads it again the same way if the device is lost.
    let load = Arc::new(load);
    let mut service_opts = opts.service.clone();
    let again = load.clone();
    service_opts.reload = Some(crate::engine::service::Reload(Arc::new(move || {
        again().map_err(|e| format!("{e:#}"))
    })));
    let loaded = tokio::task::spawn_blocking(move || {
        load().and_then(|e| Ok(EngineService::spawn_with(e, service_opts)?))
    })
    .await?;
    match loaded {
        Ok(service) => {
            let _ = state.service.set(service);
            log::info!("model loaded; serving");
            ready(&addrs);
        }
        Err(e) => {
            let _ = state.load_error.set(format!("{e:#}"));
            let _ = stop_tx.send(());
            return Err(e);
        }
    }
    shutdown_signal().await;
    log::info!("shutting down");
    let _ = stop_tx.send(());
    while let Some(r) = servers.join_next().await {
        r?;
    }
    Ok(())
}

/// Most connections served at once (over all listeners). Past it the server stops
/// accepting until one closes: new clients wait in the kernel's queue, and the open ones
/// (each two file descriptors) cannot use up the process's descriptors.
pub const MAX_CONNECTIONS: usize = 1024;

/// Most requests one HTTP/2 connection may have in flight.
const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// Serves connections from `l` until `stop` fires; in-flight requests end with the
/// process (their clients see the connection close). Each connection holds a permit of
/// `open` while it lives.
async fn accept_loop(
    l: tokio::net::TcpListener,
    app: axum::Router,
    mut stop: tokio::sync::broadcast::Receiver<()>,
    read_timeout: std::time::Duration,
    open: Arc<tokio::sync::Semaphore>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    loop {
        let permit = tokio::select! {
            p = open.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = stop.recv() => return,
        };
        let (stream, _peer) = tokio::select! {
            a = l.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    log::warn!("accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.recv() => return,
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        // A second handle on the socket notices a client that hangs up while its
        // request is being answered (hyper reads nothing then); dropping the connection
        // drops the handler, whose ticket cancels the request and frees its slot.
        let (stream, watch) = match split_watch(stream) {
            Ok(p) => p,
            Err(e) => {
                log::warn!("preparing a connection: {e}");
                continue;
            }
        };
        tokio::spawn(async move {
            let _permit = permit;
            let mut b = Builder::new(TokioExecutor::new());
            b.http1()
                .title_case_headers(true)
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout);
            b.http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
            tokio::select! {
                r = b.serve_connection(TokioIo::new(stream), svc) => {
                    if let Err(e) = r {
                        log::debug!("connection ended: {e}");
                    }
                }
                _ = peer_closed(&watch) => log::debug!("the client closed its connection"),
            }
        });
    }
}

/// The stream, and a second handle on the same socket for [`peer_closed`].
fn split_watch(
    s: tokio::net::TcpStream,
) -> std::io::Result<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    let s = s.into_std()?;
    let watch = s.try_clone()?;
    Ok((
        tokio::net::TcpStream::from_std(s)?,
        tokio::net::TcpStream::from_std(watch)?,
    ))
}

/// Resolves when the peer has closed the connection (a read would see its end).
async fn peer_closed(s: &tokio::net::TcpStream) {
    let mut buf = [0u8; 1];
    loop {
        match s.peek(&mut buf).await {
            Ok(0) | Err(_) => return,
            // Unread bytes (the next request): look again shortly.
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
