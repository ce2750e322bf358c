//! `wgllm serve`: llama-server's flags over the library's server (`wgllm::server`).

use super::run::{SamplingArgs, ShiftArgs};
use super::{load_engine, ModelArgs};
use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::engine::service::ServiceOptions;
use wgllm::engine::SamplingPath;
use wgllm::server::agent::AgentOptions;
use wgllm::server::{Defaults, ServerOptions};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Addresses to listen on, comma-separated (loopback only unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model's names in replies and in /v1/models, comma-separated (the first in
    /// sorted order is its id; default: the file's path).
    #[arg(short = 'a', long)]
    pub alias: Option<String>,
    /// Tags listed with the model in /v1/models, comma-separated.
    #[arg(long)]
    pub tags: Option<String>,
    /// Most tokens a request generates when it does not say (-1: no limit; a request's
    /// `n_predict`, `max_tokens` or `max_completion_tokens` wins, as in llama-server).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub shift: ShiftArgs,
    /// Shift a slot's context when it fills (off by default, as in llama-server).
    #[arg(long = "context-shift")]
    pub context_shift: bool,
    /// API keys clients must send (`Authorization: Bearer KEY`); comma-separated or repeated.
    #[arg(long = "api-key", value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// A file with one API key per line.
    #[arg(long = "api-key-file")]
    pub api_key_file: Option<PathBuf>,
    /// Serve Prometheus metrics on /metrics.
    #[arg(long)]
    pub metrics: bool,
    /// Serve embeddings (/embedding, /v1/embeddings) instead of completions, as
    /// llama-server's --embeddings: for embedding models, or any model's hidden states.
    #[arg(long = "embeddings", visible_alias = "embedding")]
    pub embeddings: bool,
    /// How --embeddings pools a text's token states: none, mean, cls, last or rank
    /// (default: what the model file declares, else none, as llama.cpp).
    #[arg(long)]
    pub pooling: Option<String>,
    /// Serve /rerank (and /reranking, /v1/rerank, /v1/reranking) with a reranker model:
    /// --embeddings with --pooling rank, as llama-server's --reranking.
    #[arg(long = "reranking", visible_alias = "rerank")]
    pub reranking: bool,
    #[command(flatten)]
    pub spec: super::speculative::SpecArgs,
    /// /infill lays a prompt out suffix, prefix, middle (for models trained that way) instead
    /// of prefix, suffix, middle.
    #[arg(long = "spm-infill")]
    pub spm_infill: bool,
    /// `--mmproj`: requests may then carry images (`image_url` parts, Anthropic image
    /// blocks, `/completion`'s `multimodal_data`); `--no-mmproj`.
    #[command(flatten)]
    pub encoder: super::media::EncoderArgs,
    /// A directory `file://` image URLs in requests may read from (none: refused).
    #[arg(long = "media-path")]
    pub media_path: Option<PathBuf>,
    /// Load the --lora adapters with scale 0: set them later with POST /lora-adapters
    /// or a request's `lora` (today's llama-server applies them at their scales anyway).
    #[arg(long = "lora-init-without-apply")]
    pub lora_init_without_apply: bool,
    /// Serve /slots (on by default).
    #[arg(long, overrides_with = "no_slots")]
    pub slots: bool,
    #[arg(long = "no-slots")]
    pub no_slots: bool,
    /// Directory for /slots/{id}?action=save|restore files.
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<PathBuf>,
    /// Accepted for compatibility: templates always render with minijinja.
    #[arg(long = "no-jinja")]
    pub no_jinja: bool,
    /// A chat template in place of the model's: Jinja source, or `chatml` / `gemma`.
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// A file holding the chat template.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    /// Accepted for compatibility: batching is always continuous.
    #[arg(long = "cont-batching", visible_alias = "cb")]
    pub cont_batching: bool,
    /// Refused: batching is always continuous here.
    #[arg(long = "no-cont-batching", visible_alias = "nocb")]
    pub no_cont_batching: bool,
    /// Seconds a client may take to send a request's head before its connection is closed.
    #[arg(long = "timeout", visible_alias = "to", default_value_t = 600)]
    pub timeout: u64,
    /// HTTP worker threads (default: one per core).
    #[arg(
        long = "threads-http",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub threads_http: i64,
    /// Origins allowed to call the server from a browser, comma-separated (`*`: any;
    /// `localhost`: loopback hosts). Default `*`, or `localhost` when /tools is on
    /// (--tools, MCP servers).
    #[arg(long = "cors-origins")]
    pub cors_origins: Option<String>,
    /// Largest request body in MiB.
    #[arg(long = "max-body-mib", default_value_t = 64)]
    pub max_body_mib: usize,
    /// Seconds requests in flight may take to finish after SIGINT or SIGTERM; those still
    /// running then end with an error (a second signal exits at once).
    #[arg(long = "shutdown-grace", default_value_t = 5)]
    pub shutdown_grace: u64,
    /// The memory one request may take (parsing its body, tokenizing its texts, building
    /// its reply), in MiB; a request that would take more gets a 400 saying so.
    #[arg(long = "request-budget-mib", default_value_t = wgllm::server::budget::DEFAULT_MIB)]
    pub request_budget_mib: u64,
    /// Every slot may use the whole cache (else each gets an equal share); a request
    /// that finds it full fails with "Context size has been exceeded".
    #[arg(long = "kv-unified", visible_alias = "kvu")]
    pub kv_unified: bool,
    /// Accepted for compatibility: there is no web UI.
    #[arg(long = "no-webui", visible_alias = "no-ui")]
    pub no_webui: bool,
    /// How chat replies give a model's thinking back: `auto` or `deepseek` (the
    /// default: in `reasoning_content`, split from `content` as the template writes it),
    /// `deepseek-legacy` (the same here) or `none` (left in `content` as written).
    #[arg(long = "reasoning-format", default_value = "auto")]
    pub reasoning_format: String,
    /// Thinking on or off in the chat template (its `enable_thinking`), or `auto`: on
    /// where the template has thinking.
    #[arg(long = "reasoning", visible_alias = "rea", default_value = "auto")]
    pub reasoning: String,
    /// `reasoning_effort` for templates that read it (gpt-oss: low, medium, high).
    #[arg(long = "reasoning-effort")]
    pub reasoning_effort: Option<String>,
    /// A JSON object of variables every chat template render gets (a request's
    /// `chat_template_kwargs` add to them).
    #[arg(long = "chat-template-kwargs")]
    pub chat_template_kwargs: Option<String>,
    /// Tokens of thinking a chat reply may take before the template's closing tag is
    /// forced (-1: no limit, 0: none).
    #[arg(long = "reasoning-budget", default_value_t = -1, allow_negative_numbers = true)]
    pub reasoning_budget: i64,
    /// Text forced before the closing tag when the thinking budget is spent.
    #[arg(long = "reasoning-budget-message", default_value = "")]
    pub reasoning_budget_message: String,
    /// Chat replies carry `__verbose` with the rendered prompt, and the log shows debug
    /// lines (as `RUST_LOG=wgllm=debug`).
    #[arg(long = "verbose", short = 'v', visible_alias = "v")]
    pub verbose: bool,
    /// Host memory for the prompt cache in MiB (-1: no limit, 0: none): prompts of slots
    /// taken by other requests are kept there and restored when they come back.
    #[arg(
        long = "cache-ram",
        visible_alias = "cram",
        default_value_t = 8192,
        allow_negative_numbers = true
    )]
    pub cache_ram: i64,
    /// Save idle slots to the prompt cache when a request starts, and with --kv-unified
    /// clear them (the default).
    #[arg(long = "cache-idle-slots", overrides_with = "no_cache_idle_slots")]
    pub cache_idle_slots: bool,
    /// Leave idle slots alone when a request starts.
    #[arg(long = "no-cache-idle-slots")]
    pub no_cache_idle_slots: bool,
    /// After this many seconds without a request, free the model (GPU memory, weights,
    /// caches) until the next request needs it (-1: never). /health, /props, /models and
    /// /metrics answer without waking it.
    #[arg(
        long = "sleep-idle-seconds",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub sleep_idle_seconds: i64,
    /// Experimental: /cors-proxy?url=URL passes requests on to URL (the web UI's way to
    /// reach MCP servers). It lets any client of the server reach any address the
    /// server can: only for trusted clients on a trusted network. Off by default.
    #[arg(
        long = "ui-mcp-proxy",
        visible_alias = "webui-mcp-proxy",
        overrides_with = "no_ui_mcp_proxy"
    )]
    pub ui_mcp_proxy: bool,
    #[arg(long = "no-ui-mcp-proxy", visible_alias = "no-webui-mcp-proxy")]
    pub no_ui_mcp_proxy: bool,
    /// Experimental: built-in tools that /tools runs on this host for a client (the web
    /// UI's agent): comma-separated names of read_file, file_glob_search, grep_search,
    /// exec_shell_command, write_file, edit_file, get_info, or `all`. Whoever can reach
    /// the server can then read, write and run what this user may: see --tools-root.
    /// Off by default.
    #[arg(long = "tools")]
    pub tools: Option<String>,
    /// Keeps every built-in file tool inside DIR (paths, symlinks and `..` that leave it
    /// are refused) and leaves exec_shell_command out. Without it the tools reach any
    /// path, as llama-server's do.
    #[arg(long = "tools-root", value_name = "DIR")]
    pub tools_root: Option<PathBuf>,
    /// MCP servers (stdio) whose tools /tools offers: a JSON file in the `mcpServers`
    /// format (`command`, `args`, `env`, `cwd`, `timeout_ms` per server).
    #[arg(long = "mcp-servers-config", value_name = "FILE")]
    pub mcp_servers_config: Option<PathBuf>,
    /// The same as --mcp-servers-config, the JSON given inline.
    #[arg(long = "mcp-servers-json", value_name = "JSON")]
    pub mcp_servers_json: Option<String>,
    /// The web UI's agent: --tools all and --ui-mcp-proxy together.
    #[arg(long = "agent", visible_alias = "ag", overrides_with = "no_agent")]
    pub agent: bool,
    #[arg(long = "no-agent", visible_alias = "no-ag")]
    pub no_agent: bool,
    #[command(flatten)]
    pub router: RouterArgs,
}

/// Router mode: `wgllm serve` with no -m or -hf serves many models by name.
#[derive(Args, Clone, Debug)]
pub struct RouterArgs {
    /// Router mode: a directory of models (each *.gguf by its name without .gguf; each
    /// subdirectory by its name, with its *mmproj* file as its projector).
    #[arg(long = "models-dir")]
    pub models_dir: Option<PathBuf>,
    /// Router mode: an INI file of models, `[name]` sections of serve flags by their
    /// long names (`model = /x.gguf`, `ctx-size = 8192`), `[*]` for every model.
    #[arg(long = "models-preset")]
    pub models_preset: Option<PathBuf>,
    /// Router mode: most models loaded at once (0: no limit); past it the least recently
    /// used idle model is unloaded.
    #[arg(long = "models-max", default_value_t = 4)]
    pub models_max: usize,
    /// Router mode: device memory the loaded models may hold together, in MiB (wgpu
    /// reports no device's size: give your GPU's, less what else uses it). A model that
    /// does not fit beside the others waits while idle ones are unloaded, least recently
    /// used first; one larger than the whole budget is refused with the numbers. A model
    /// counts the memory it held when it last loaded (its files' size before that).
    #[arg(long = "models-memory-mib", value_name = "MIB")]
    pub models_memory_mib: Option<u64>,
    /// Router mode: load a model on its first request (the default).
    #[arg(long = "models-autoload", overrides_with = "no_models_autoload")]
    pub models_autoload: bool,
    /// Router mode: only POST /models/load loads a model.
    #[arg(long = "no-models-autoload")]
    pub no_models_autoload: bool,
}

/// A comma-separated list, trimmed, sorted, without repeats.
fn list(s: Option<&str>) -> Vec<String> {
    let mut v: Vec<String> = (s.unwrap_or("").split(','))
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(String::from)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A built-in chat template by llama.cpp's name, or Jinja source (any text that is not
/// a known name renders as itself, as a Jinja template without tags does).
fn template(t: &str) -> Result<String> {
    if let Some(builtin) = wgllm::tokenizer::builtin_template(t) {
        return Ok(builtin.to_string());
    }
    if t.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        bail!(
            "--chat-template {t}: not a built-in template ({}); pass Jinja source or use --chat-template-file",
            wgllm::tokenizer::BUILTIN_TEMPLATES.join(", ")
        );
    }
    Ok(t.to_string())
}

impl ServeArgs {
    /// No model given: router mode (`cli::router`).
    pub fn routed(&self) -> bool {
        self.model.model.is_none() && self.model.hub.hf_repo.is_none()
    }
}

/// One model's server (see [`ServeArgs::routed`] for the router).
pub fn serve(a: &ServeArgs) -> Result<()> {
    let r = &a.router;
    if r.models_memory_mib.is_some() {
        bail!("--models-memory-mib is for router mode (it bounds the models loaded together): leave out -m/-hf to serve many models, or leave it out");
    }
    if r.models_dir.is_some() || r.models_preset.is_some() {
        bail!("--models-dir and --models-preset are for router mode, which serves many models by name: leave out -m/-hf to use them, or leave them out to serve the one model");
    }
    let (opts, load) = prepare(a)?;
    wgllm::server::serve(
        opts,
        move || load(),
        |addrs| {
            for a in addrs {
                log::info!("server is listening on http://{a}");
            }
        },
    )
}

/// The keys the server accepts: --api-key and --api-key-file.
pub(super) fn api_keys(a: &ServeArgs) -> Result<Vec<String>> {
    let mut keys: Vec<String> = a
        .api_key
        .iter()
        .filter(|k| !k.is_empty())
        .cloned()
        .collect();
    if let Some(f) = &a.api_key_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("reading the API key file {}", f.display()))?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from),
        );
    }
    Ok(keys)
}

/// The reasoning flags as every chat request starts from them.
fn reasoning_defaults(a: &ServeArgs) -> Result<wgllm::server::ReasoningDefaults> {
    let keep_in_content = match a.reasoning_format.as_str() {
        "none" => true,
        "auto" | "deepseek" | "deepseek-legacy" => false,
        other => bail!(
            "--reasoning-format {other}: unknown format (none, auto, deepseek or deepseek-legacy)"
        ),
    };
    let enable = match a.reasoning.as_str() {
        "on" | "true" | "1" => Some(true),
        "off" | "false" | "0" => Some(false),
        "auto" => None,
        other => bail!("--reasoning {other}: give on, off or auto"),
    };
    let budget = match a.reasoning_budget {
        -1 => None,
        n if (0..=u32::MAX as i64).contains(&n) => Some(n as u32),
        n => bail!("--reasoning-budget {n}: give a token count, or -1 for no limit"),
    };
    let mut template_kwargs = match &a.chat_template_kwargs {
        None => Default::default(),
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => bail!("--chat-template-kwargs must be a JSON object, e.g. '{{\"enable_thinking\": false}}'"),
        },
    };
    if let Some(e) = &a.reasoning_effort {
        template_kwargs.insert("reasoning_effort".into(), serde_json::json!(e));
    }
    Ok(wgllm::server::ReasoningDefaults {
        keep_in_content,
        enable,
        template_kwargs,
        budget,
        budget_message: a.reasoning_budget_message.clone(),
    })
}

/// A single model's server: its options and how to load (and reload) its model.
pub(super) fn prepare(a: &ServeArgs) -> Result<(ServerOptions, wgllm::server::LoadFn)> {
    prepare_capped(a, None)
}

/// [`prepare`], with the device memory each load may allocate read from `cap` at the
/// load (the router's `--models-memory-mib` share).
pub(super) fn prepare_capped(
    a: &ServeArgs,
    cap: Option<std::sync::Arc<std::sync::Mutex<Option<u64>>>>,
) -> Result<(ServerOptions, wgllm::server::LoadFn)> {
    if a.no_cont_batching {
        bail!("--no-cont-batching: wgllm always batches requests continuously (every generating slot decodes in one batch)");
    }
    if a.sleep_idle_seconds == 0 || a.sleep_idle_seconds < -1 {
        bail!(
            "--sleep-idle-seconds {}: give the seconds of idleness before the server sleeps, or -1 to never sleep (0 and values below -1 are not valid)",
            a.sleep_idle_seconds
        );
    }
    if a.n_predict < -1 {
        bail!(
            "-n must be -1 (no limit) or a token count, got {}",
            a.n_predict
        );
    }
    let mut shift = a.shift.clone();
    shift.no_context_shift = !a.context_shift || a.shift.no_context_shift;
    let policy = shift.policy()?;
    let sampling = a.sampling.checked()?;
    let keys = api_keys(a)?;
    let chat_template = match (&a.chat_template, &a.chat_template_file) {
        (_, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading the chat template file {}", f.display()))?,
        ),
        (Some(t), None) => Some(template(t)?),
        (None, None) => None,
    };
    if let Some(dir) = &a.slot_save_path {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the slot directory {}", dir.display()))?;
    }
    // An -hf model (with its mmproj) is downloaded before the server binds, as
    // llama-server does.
    let mut mmproj = a.encoder.mmproj.clone();
    let image_tokens = a.encoder.image_tokens();
    let model_path = match &a.model.model {
        Some(m) => m.clone(),
        None => {
            let want = mmproj.is_none() && !a.encoder.no_mmproj;
            let (path, hub_mmproj) = (a.model.hub.resolve_with_mmproj(want)?).ok_or_else(|| {
                anyhow::anyhow!("a model is needed: -m FILE or -hf ORG/NAME[:QUANT]")
            })?;
            mmproj = mmproj.or(hub_mmproj);
            path
        }
    };
    let embeddings = a.embeddings || a.reranking;
    if a.spec.speculation()?.is_some() && embeddings {
        bail!("speculative decoding (-md, --spec-type) speeds up generation, and an --embeddings server generates nothing: leave one out");
    }
    if let Some(p) = mmproj.as_ref().filter(|p| !p.exists()) {
        bail!("mmproj file {} does not exist", p.display());
    }
    if let Some(d) = a.media_path.as_ref().filter(|d| !d.is_dir()) {
        bail!("--media-path {} is not a directory", d.display());
    }
    if a.pooling.is_some() && !embeddings {
        bail!("--pooling applies to an embeddings server: add --embeddings");
    }
    let pooling = match (embeddings, a.reranking) {
        (_, true) => match a
            .pooling
            .as_deref()
            .map(str::parse::<wgllm::engine::Pooling>)
        {
            None | Some(Ok(wgllm::engine::Pooling::Rank)) => wgllm::engine::Pooling::Rank,
            Some(_) => bail!("--reranking pools by rank: leave --pooling out"),
        },
        (true, false) => super::embed::pooling(a.pooling.as_deref(), &model_path)?,
        (false, false) => wgllm::engine::Pooling::None,
    };
    let gcp = gcp_from_env();
    let port = match (&gcp, std::env::var("AIP_HTTP_PORT")) {
        (Some(_), Ok(p)) if !p.is_empty() => p
            .parse()
            .map_err(|_| anyhow::anyhow!("AIP_HTTP_PORT={p}: not a port number (1 to 65535)"))?,
        (Some(_), _) => 8080,
        (None, _) => a.port,
    };
    let agent = agent_options(a)?;
    let opts = ServerOptions {
        host: a.host.clone(),
        port,
        gcp,
        cors_proxy: cors_proxy(a),
        agent: agent.clone(),
        aliases: list(a.alias.as_deref()),
        tags: list(a.tags.as_deref()),
        model_path: model_path.clone(),
        api_keys: keys,
        metrics: a.metrics,
        slots: !a.no_slots,
        pooling,
        spm_infill: a.spm_infill,
        media_path: a.media_path.clone(),
        n_batch: a.model.batch_size,
        slot_save_path: a.slot_save_path.clone(),
        defaults: Defaults {
            sampling,
            n_predict: a.n_predict,
            shift: policy,
            ignore_eos: a.sampling.ignore_eos,
            backend_sampling: a.model.gpu.sampling_path() == SamplingPath::Gpu,
            n_lora: a.model.lora_specs().len(),
            reasoning: reasoning_defaults(a)?,
        },
        cors_origins: cors_origins(a, &agent),
        max_body: a.max_body_mib << 20,
        timeout_s: a.timeout,
        shutdown_grace_s: a.shutdown_grace,
        request_budget: a.request_budget_mib.saturating_mul(1 << 20),
        threads_http: a.threads_http.max(0) as usize,
        verbose: a.verbose,
        service: ServiceOptions {
            cache_ram: match a.cache_ram {
                0 => None,
                n if n < 0 => Some(None),
                n => Some(Some((n as usize) << 20)),
            },
            cache_idle_slots: !a.no_cache_idle_slots,
            kv_unified: a.kv_unified,
            // Set by the server (it knows how it loaded the model).
            reload: None,
            sleep_idle: (a.sleep_idle_seconds > 0)
                .then(|| std::time::Duration::from_secs(a.sleep_idle_seconds as u64)),
        },
    };
    let mut model = a.model.clone();
    model.model = Some(model_path);
    let mut eopts = model.options()?;
    eopts.swa_keep = shift.swa_keep();
    eopts.kv_unified = a.kv_unified;
    eopts.lora_init_without_apply = a.lora_init_without_apply;
    eopts.embeddings = embeddings;
    eopts.reranking = pooling == wgllm::engine::Pooling::Rank;
    let spec = a.spec.clone();
    let load = move || {
        let mut eopts = eopts.clone();
        if let Some(c) = &cap {
            eopts.gpu.memory_budget = *c.lock().unwrap();
        }
        let mut e = load_engine(&model, &eopts)?;
        spec.attach(&mut e)?;
        if let Some(p) = &mmproj {
            e.attach_vision_with(&p.display().to_string(), image_tokens)?;
        }
        if let Some(t) = &chat_template {
            e.tokenizer.set_chat_template(t);
        }
        Ok(e)
    };
    Ok((opts, std::sync::Arc::new(load)))
}

/// Vertex AI's prediction protocol, as its containers are told to speak it
/// (`AIP_MODE=PREDICTION`; `AIP_PREDICT_ROUTE`, default `/predict`; `AIP_HEALTH_ROUTE`;
/// `AIP_HTTP_PORT`, default 8080, in place of --port), as llama-server reads them.
fn gcp_from_env() -> Option<wgllm::server::gcp::GcpOptions> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let slash = |v: String| {
        if v.starts_with('/') {
            v
        } else {
            format!("/{v}")
        }
    };
    (var("AIP_MODE").as_deref() == Some("PREDICTION")).then(|| wgllm::server::gcp::GcpOptions {
        predict_route: var("AIP_PREDICT_ROUTE").map_or("/predict".into(), slash),
        health_route: var("AIP_HEALTH_ROUTE").map(slash),
    })
}

/// `--ui-mcp-proxy`, also on with `--agent`.
pub fn cors_proxy(a: &ServeArgs) -> bool {
    (a.ui_mcp_proxy && !a.no_ui_mcp_proxy) || (a.agent && !a.no_agent)
}

/// `--cors-origins`; by default any origin, or loopback ones only while /tools is on (a
/// page from elsewhere must not drive the tools), as llama-server does.
pub fn cors_origins(a: &ServeArgs, agent: &AgentOptions) -> Vec<String> {
    match &a.cors_origins {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None if agent.enabled() => {
            log::info!(
                "/tools is on: CORS allows loopback origins only (change with --cors-origins)"
            );
            vec!["localhost".into()]
        }
        None => vec!["*".into()],
    }
}

/// What /tools offers: `--tools` (or `--agent`), `--tools-root` and the MCP servers.
pub fn agent_options(a: &ServeArgs) -> Result<AgentOptions> {
    let root = match &a.tools_root {
        Some(d) => Some(d.canonicalize().map_err(|e| {
            anyhow::anyhow!(
                "--tools-root {}: {e} (give an existing directory)",
                d.display()
            )
        })?),
        None => None,
    };
    let list = match (&a.tools, a.agent && !a.no_agent) {
        (Some(t), _) => t.clone(),
        (None, true) => "all".into(),
        (None, false) => String::new(),
    };
    let builtin = wgllm::server::agent::builtin_names(&list, root.is_some())
        .map_err(|e| anyhow::anyhow!("--tools: {e}"))?;
    if root.is_some() && builtin.is_empty() {
        bail!("--tools-root confines the built-in tools: give them with --tools");
    }
    let mcp = wgllm::server::agent::mcp::read_configs(
        a.mcp_servers_config.as_deref(),
        a.mcp_servers_json.as_deref(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !builtin.is_empty() && root.is_none() {
        log::info!("--tools: {} run on this host for any client that can reach the server, on any path; keep the server on a trusted network, or confine the file tools with --tools-root DIR", builtin.join(", "));
    }
    Ok(AgentOptions { builtin, root, mcp })
}
