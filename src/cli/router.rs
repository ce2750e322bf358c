//! `wgllm serve` with no model: the router (`wgllm::server::router`). Each model's server
//! is made from the router's own command line with the model's flags after it (its
//! catalog entry: `-hf ORG/NAME:QUANT` for a cached model, `-m FILE [--mmproj P]` for one
//! of `--models-dir`, its preset's keys), parsed as `wgllm serve` parses them, as
//! llama-server renders a child's arguments; the later flag wins.

use super::serve::{api_keys, prepare_capped, ServeArgs};
use anyhow::{bail, Result};
use clap::{CommandFactory, FromArgMatches, Parser};
use std::ffi::OsString;
use std::sync::Arc;
use wgllm::server::router::{catalog, ModelSetup, RouterOptions};
use wgllm::server::ServerOptions;

/// `wgllm serve`'s flags alone, the later of a repeated flag winning.
#[derive(Parser)]
#[command(name = "serve", args_override_self = true)]
struct ServeLine {
    #[command(flatten)]
    args: ServeArgs,
}

/// Flags (with a value, or alone) that belong to the router and never reach a model's
/// server: where it listens, its keys, its catalog.
const ROUTER_ONLY: &[(&str, bool)] = &[
    ("--models-dir", true),
    ("--models-preset", true),
    ("--models-max", true),
    ("--models-memory-mib", true),
    ("--models-autoload", false),
    ("--no-models-autoload", false),
    ("--api-key", true),
    ("--api-key-file", true),
    ("--host", true),
    ("--port", true),
    ("-a", true),
    ("--alias", true),
    ("--tags", true),
    ("--ui-mcp-proxy", false),
    ("--webui-mcp-proxy", false),
    // /tools belongs to the router process: its models start no MCP servers.
    ("--tools", true),
    ("--tools-root", true),
    ("--mcp-servers-config", true),
    ("--mcp-servers-json", true),
    ("--agent", false),
    ("--ag", false),
    ("--no-agent", false),
    ("--no-ag", false),
];

/// The router's command line after `serve`, without the router's own flags.
fn shared_flags() -> Vec<OsString> {
    let all: Vec<OsString> = std::env::args_os()
        .map(super::habits::llama_style_flag)
        .collect();
    let start = all
        .iter()
        .position(|a| a == "serve")
        .map_or(all.len(), |i| i + 1);
    let mut out = Vec::new();
    let mut i = start;
    while i < all.len() {
        let a = all[i].to_string_lossy().into_owned();
        let name = a.split('=').next().unwrap_or(&a);
        if let Some((_, takes)) = ROUTER_ONLY.iter().find(|(n, _)| *n == name) {
            i += if *takes && !a.contains('=') { 2 } else { 1 };
            continue;
        }
        out.push(all[i].clone());
        i += 1;
    }
    out
}

/// A catalog entry's flags as command-line words (flags that take no value: present
/// when true).
fn entry_words(e: &catalog::Entry) -> Result<Vec<String>> {
    let cmd = ServeLine::command();
    let mut out = Vec::new();
    for (k, v) in &e.flags {
        let found = cmd.get_arguments().find(|a| {
            a.get_long() == Some(k.as_str())
                || a.get_all_aliases()
                    .is_some_and(|al| al.contains(&k.as_str()))
                || (k.len() == 1 && a.get_short().is_some_and(|c| c.to_string() == *k))
        });
        let Some(arg) = found else {
            bail!(
                "model {}: `{k}` is not a flag `wgllm serve` takes (presets name flags by their long names, without --)",
                e.name
            );
        };
        let word = match arg.get_long() {
            Some(l) => format!("--{l}"),
            None => format!("-{k}"),
        };
        if arg.get_action().takes_values() {
            out.push(word);
            out.push(v.clone());
        } else if catalog::truthy(v) {
            out.push(word);
        }
    }
    Ok(out)
}

/// The model's server, from the router's flags and the entry's.
fn setup(shared: &[OsString], e: &catalog::Entry) -> Result<ModelSetup> {
    let mut words: Vec<OsString> = vec!["serve".into()];
    words.extend(shared.iter().cloned());
    let own = entry_words(e)?;
    words.extend(own.iter().map(OsString::from));
    words.extend(["--alias".into(), e.name.clone().into()]);
    if let Some(msg) = super::habits::refused(&words) {
        bail!("model {}: {msg}", e.name);
    }
    let m = ServeLine::command()
        .try_get_matches_from(&words)
        .map_err(|err| anyhow::anyhow!("model {}: {}", e.name, err.render().to_string().trim()))?;
    let line = ServeLine::from_arg_matches(&m)
        .map_err(|err| anyhow::anyhow!("model {}: {err}", e.name))?;
    let a = line.args;
    if a.model.model.is_none() && a.model.hub.hf_repo.is_none() {
        bail!(
            "model {}: its preset names no model file (`model = FILE` or `hf-repo = ORG/NAME[:QUANT]`)",
            e.name
        );
    }
    let memory_cap = Arc::new(std::sync::Mutex::new(None));
    let (opts, load) = prepare_capped(&a, Some(memory_cap.clone()))?;
    let args = words[1..]
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    Ok(ModelSetup {
        opts,
        load,
        args,
        memory_cap,
    })
}

pub fn serve(a: &ServeArgs) -> Result<()> {
    let r = &a.router;
    if let Some(d) = r.models_dir.as_ref().filter(|d| !d.is_dir()) {
        bail!("--models-dir {}: not a directory", d.display());
    }
    if let Some(p) = r.models_preset.as_ref().filter(|p| !p.is_file()) {
        bail!("--models-preset {}: no such file", p.display());
    }
    let hub_cache = wgllm::hub::cache::hub_dir();
    let sources = catalog::Sources {
        hub_cache,
        models_dir: r.models_dir.clone(),
        preset: r.models_preset.clone(),
    };
    let agent = super::serve::agent_options(a)?;
    let cors_origins = super::serve::cors_origins(a, &agent);
    let server = ServerOptions {
        host: a.host.clone(),
        port: a.port,
        aliases: Vec::new(),
        tags: Vec::new(),
        model_path: "none".into(),
        api_keys: api_keys(a)?,
        metrics: a.metrics,
        slots: !a.no_slots,
        slot_save_path: None,
        defaults: Default::default(),
        cors_origins,
        max_body: a.max_body_mib << 20,
        timeout_s: a.timeout,
        threads_http: a.threads_http.max(0) as usize,
        verbose: a.verbose,
        service: Default::default(),
        pooling: wgllm::engine::Pooling::None,
        spm_infill: false,
        media_path: None,
        n_batch: a.model.batch_size,
        shutdown_grace_s: a.shutdown_grace,
        request_budget: a.request_budget_mib.saturating_mul(1 << 20),
        gcp: None,
        cors_proxy: super::serve::cors_proxy(a),
        agent,
    };
    let shared = shared_flags();
    let prepare: wgllm::server::router::Prepare = Arc::new(move |e| setup(&shared, e));
    let hub = match wgllm::hub::HubOptions::from_env() {
        Ok(mut h) => {
            h.offline = a.model.hub.offline;
            if let Some(t) = &a.model.hub.hf_token {
                h.token = Some(t.clone());
            }
            Some(h)
        }
        Err(_) => None,
    };
    let opts = RouterOptions {
        server,
        sources,
        models_max: r.models_max,
        memory_budget: r.models_memory_mib.map(|m| m.saturating_mul(1 << 20)),
        autoload: !r.no_models_autoload,
        hub,
    };
    wgllm::server::router::serve(opts, prepare, |addrs| {
        for a in addrs {
            log::info!("router is listening on http://{a}");
        }
    })
}
