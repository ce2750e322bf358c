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

pub mod agent;
mod anthropic;
pub mod bodies;
pub mod budget;
mod chat;
mod cors_proxy;
mod embeddings;
mod error;
mod forward;
pub mod gcp;
mod gen;
mod http;
mod infill;
mod media;
mod metrics;
mod native;
mod openai;
mod origins;
mod params;
mod rerank;
mod responses;
mod resumable;
pub mod router;
mod shutdown;
mod tools;
mod wire;

pub use error::ApiError;
pub use params::{Defaults, ReasoningDefaults};

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
    /// The directory `file://` image URLs may read (`--media-path`); none: refused.
    pub media_path: Option<PathBuf>,
    /// `-b` as given (not capped at the context, as the engine caps it): `/infill` cuts
    /// its parts to it, as llama-server does.
    pub n_batch: u32,
    /// Seconds requests in flight may take to finish after SIGINT/SIGTERM before they
    /// are ended with an error (`--shutdown-grace`).
    pub shutdown_grace_s: u64,
    /// The memory one request may take, in bytes (`--request-budget-mib`; see
    /// [`budget`]).
    pub request_budget: u64,
    /// Vertex AI's prediction protocol (`AIP_MODE=PREDICTION`): its routes.
    pub gcp: Option<gcp::GcpOptions>,
    /// `/cors-proxy` passes requests on (`--ui-mcp-proxy`); else it answers 403.
    pub cors_proxy: bool,
    /// The tools `/tools` offers (`--tools`, `--tools-root`, the MCP servers).
    pub agent: agent::AgentOptions,
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
    /// Set once the server was told to stop: new requests get a 503.
    stopping: std::sync::atomic::AtomicBool,
    /// KiB of request bodies that may be held at once ([`BODIES_IN_FLIGHT`] bodies of the
    /// largest size); a request takes room for its bytes as they arrive and keeps it
    /// until its handler has answered, and one that finds none gets a 503.
    bodies: tokio::sync::Semaphore,
    /// The throughput counters at the last `/metrics` scrape.
    metrics_window: std::sync::Mutex<metrics::Window>,
    /// Set before the server listens if `/tools` is on.
    pub(crate) tools: OnceLock<Arc<agent::Toolbox>>,
}

/// How many bodies of the largest size may be in memory at once.
pub const BODIES_IN_FLIGHT: usize = 4;

impl AppState {
    /// The server is shutting down.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }

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
    /// What a request's images need from this server.
    pub(crate) fn image_input(&self, service: &EngineService) -> media::ImageInput {
        media::ImageInput {
            prep: service.image_prep().cloned(),
            media_path: self.opts.media_path.clone(),
            n_ctx: service.info().n_ctx_slot,
        }
    }

    pub(crate) fn model_name(&self) -> String {
        (self.opts.aliases.first().cloned())
            .unwrap_or_else(|| self.opts.model_path.display().to_string())
    }
}

/// Runs the server until SIGINT or SIGTERM: binds first, then loads the model with
/// `load` on a thread of its own; `ready` is called with the bound addresses once the
/// model serves. Returns an error if no address can be bound or the model fails to load;
/// Ok once a signal has stopped it (see [`shutdown`]).
pub fn serve(
    opts: ServerOptions,
    load: impl Fn() -> anyhow::Result<Engine> + Send + Sync + 'static,
    ready: impl FnOnce(&[SocketAddr]) + Send + 'static,
) -> anyhow::Result<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if opts.threads_http > 0 {
        rt.worker_threads(opts.threads_http);
    }
    let rt = rt.enable_all().build()?;
    let r = rt.block_on(run(opts, load, ready));
    // Whatever still runs on the runtime (a handler that does not yield, a blocking
    // task) is not waited for: the orderly part of the shutdown is over.
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    r
}

impl AppState {
    /// Lists the MCP servers' tools (each started once) if `/tools` is on.
    pub(crate) async fn start_tools(&self) {
        if self.opts.agent.enabled() {
            let tb = agent::Toolbox::start(&self.opts.agent).await;
            let _ = self.tools.set(Arc::new(tb));
        }
    }

    /// Ends tool calls in flight and the MCP server processes.
    pub(crate) async fn stop_tools(&self) {
        if let Some(tb) = self.tools.get() {
            tb.shutdown().await;
        }
    }

    fn new(opts: ServerOptions) -> Arc<AppState> {
        let bodies = (opts.max_body.div_ceil(1024).max(1)).saturating_mul(BODIES_IN_FLIGHT);
        Arc::new(AppState {
            opts,
            service: OnceLock::new(),
            load_error: OnceLock::new(),
            started: std::time::Instant::now(),
            streams: Default::default(),
            stopping: Default::default(),
            bodies: tokio::sync::Semaphore::new(bodies),
            metrics_window: Default::default(),
            tools: OnceLock::new(),
        })
    }
}

/// How to load a model (again, after a lost device or a sleep).
pub type LoadFn = Arc<dyn Fn() -> anyhow::Result<Engine> + Send + Sync>;

/// Loads the model with `load` and starts its engine service (blocking: the disk and the
/// GPU), with `load` kept for reloading.
fn start_service(
    service: &crate::engine::service::ServiceOptions,
    load: LoadFn,
) -> anyhow::Result<EngineService> {
    let mut service_opts = service.clone();
    let again = load.clone();
    service_opts.reload = Some(crate::engine::service::Reload(Arc::new(move || {
        again().map_err(|e| format!("{e:#}"))
    })));
    Ok(EngineService::spawn_with(load()?, service_opts)?)
}

/// A model's server state, loaded (blocking): what a router serves one model with.
pub(crate) fn loaded_state(opts: ServerOptions, load: LoadFn) -> anyhow::Result<Arc<AppState>> {
    let state = AppState::new(opts);
    let service = start_service(&state.opts.service, load)?;
    let _ = state.service.set(service);
    Ok(state)
}

async fn run(
    opts: ServerOptions,
    load: impl Fn() -> anyhow::Result<Engine> + Send + Sync + 'static,
    ready: impl FnOnce(&[SocketAddr]) + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(opts.clone());
    if let Some(g) = &opts.gcp {
        for route in std::iter::once(&g.predict_route).chain(&g.health_route) {
            if !gcp::valid_route(route) {
                anyhow::bail!("AIP_PREDICT_ROUTE / AIP_HEALTH_ROUTE {route:?}: a route is a path of letters, digits and / - _ . ~ : @, with no segment starting with : or *");
            }
            if http::route_paths().contains(&route.as_str())
                || g.health_route.as_ref() == Some(&g.predict_route)
            {
                anyhow::bail!("AIP_PREDICT_ROUTE / AIP_HEALTH_ROUTE {route} conflicts with an existing route of the server: choose another path");
            }
        }
    }
    budget::set_limit(opts.request_budget);
    let grace = std::time::Duration::from_secs(opts.shutdown_grace_s);
    let mut signals = shutdown::Signals::listen(grace)
        .map_err(|e| anyhow::anyhow!("cannot listen for SIGINT/SIGTERM: {e}"))?;
    state.start_tools().await;
    let app = http::router(state.clone());
    let net = Listening::bind(&opts, app, "loading the model").await?;
    let addrs = net.addrs.clone();
    // The model loads on a thread of its own (it blocks on the GPU and the disk); the
    // service loads it again the same way if the device is lost or after a sleep.
    let load: LoadFn = Arc::new(load);
    let service_opts = opts.service.clone();
    let loading = tokio::task::spawn_blocking(move || start_service(&service_opts, load));
    let loaded = tokio::select! {
        l = loading => l?,
        _ = signals.first() => {
            // Nothing is in flight yet; the loading thread ends with the process.
            log::info!("shutting down before the model finished loading");
            let _ = net.stop.send(true);
            return Ok(());
        }
    };
    match loaded {
        Ok(service) => {
            let _ = state.service.set(service);
            log::info!("model loaded; serving");
            ready(&addrs);
        }
        Err(e) => {
            let _ = state.load_error.set(format!("{e:#}"));
            let _ = net.stop.send(true);
            return Err(e);
        }
    }
    signals.first().await;
    state
        .stopping
        .store(true, std::sync::atomic::Ordering::Relaxed);
    // Tool calls in flight end now, not after the grace period.
    state.stop_tools().await;
    net.close(grace, async {
        // What still runs ends with an error event or a 503; the engine and its device go.
        if let Some(service) = state.service.get() {
            service.shutdown().await;
        }
    })
    .await
}

/// The server's listeners and their connections.
pub(crate) struct Listening {
    pub addrs: Vec<SocketAddr>,
    stop: tokio::sync::watch::Sender<bool>,
    servers: tokio::task::JoinSet<()>,
    open: Arc<tokio::sync::Semaphore>,
}

impl Listening {
    /// Binds every address of `--host` and serves `app` on each.
    pub(crate) async fn bind(
        opts: &ServerOptions,
        app: axum::Router,
        doing: &str,
    ) -> anyhow::Result<Listening> {
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
            log::info!("listening on http://{a} ({doing})");
        }
        let (stop, _) = tokio::sync::watch::channel(false);
        let mut servers = tokio::task::JoinSet::new();
        let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        for l in listeners {
            servers.spawn(accept_loop(
                l,
                app.clone(),
                stop.subscribe(),
                std::time::Duration::from_secs(opts.timeout_s.max(1)),
                open.clone(),
            ));
        }
        Ok(Listening {
            addrs,
            stop,
            servers,
            open,
        })
    }

    /// The orderly stop: listeners close, each connection finishes the request it is
    /// serving (an idle one closes at once); after `grace`, `end` fails what still runs,
    /// and the error replies are written.
    pub(crate) async fn close(
        mut self,
        grace: std::time::Duration,
        end: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        log::info!(
            "shutting down: no new requests; those in flight have {} s to finish (a second signal exits at once)",
            grace.as_secs()
        );
        let _ = self.stop.send(true);
        let open = self.open.clone();
        let all_closed = || open.acquire_many(MAX_CONNECTIONS as u32);
        if tokio::time::timeout(grace, all_closed()).await.is_err() {
            log::info!("requests still in flight after the grace period end with an error");
        }
        end.await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), all_closed()).await;
        while let Some(r) = self.servers.join_next().await {
            r?;
        }
        log::info!("stopped");
        Ok(())
    }
}

/// Request-controlled work of any size (parsing a body, tokenizing, rendering a chat
/// template, compiling a schema) runs here rather than as a step of the async runtime:
/// the runtime's thread hands its other tasks to the rest while this one works, so a
/// request being read never holds up the others' streams or the signals. At most
/// [`cpu_workers`] such pieces run at once; the others wait their turn without a
/// thread. Every piece is bounded by the request budget ([`budget`]).
pub(crate) async fn off_runtime<T>(work: impl FnOnce() -> T) -> T {
    static PERMITS: OnceLock<tokio::sync::Semaphore> = OnceLock::new();
    let permits = PERMITS.get_or_init(|| tokio::sync::Semaphore::new(cpu_workers()));
    let _turn = permits.acquire().await;
    tokio::task::block_in_place(work)
}

/// Pieces of request-controlled work run at once ([`off_runtime`]): half the cores (at
/// least one, at most 4), so that what clients send never takes every core from the
/// engine's thread (and, on a software device, from the kernels it runs on the CPU).
pub fn cpu_workers() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / 2).clamp(1, 4)
}

/// Most connections served at once (over all listeners). Past it the server stops
/// accepting until one closes: new clients wait in the kernel's queue, and the open ones
/// (each two file descriptors) cannot use up the process's descriptors.
pub const MAX_CONNECTIONS: usize = 1024;

/// Most requests one HTTP/2 connection may have in flight.
const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// Serves connections from `l` until `stop` turns true; then each open connection
/// finishes the request it serves and closes (an idle one at once). Each connection
/// holds a permit of `open` while it lives.
async fn accept_loop(
    l: tokio::net::TcpListener,
    app: axum::Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
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
            _ = stopped(&mut stop) => return,
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
            _ = stopped(&mut stop) => return,
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
        let mut stop = stop.clone();
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
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            log::debug!("connection ended: {e}");
                        }
                        return;
                    }
                    _ = peer_closed(&watch) => {
                        log::debug!("the client closed its connection");
                        return;
                    }
                    _ = stopped(&mut stop), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
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

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await.map(|_| ());
}
