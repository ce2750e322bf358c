//! `/metrics` in Prometheus' text format, with llama-server's `llamacpp:*` names, plus
//! the three gauges an inference-aware router reads to pick a replica (queued requests,
//! running requests, KV-cache utilisation: the Kubernetes Gateway API Inference
//! Extension's model-server protocol).

use super::error::{ApiError, ApiResult};
use super::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus::{Counter, Encoder, Gauge, Opts, Registry, TextEncoder};
use std::sync::Arc;

pub async fn metrics(State(s): State<Arc<AppState>>) -> ApiResult<Response> {
    if !s.opts.metrics {
        return Err(ApiError::not_supported(
            "This server does not support metrics endpoint. Start it with `--metrics`",
        ));
    }
    let st = s.service()?.stats();
    let rate = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    // The throughput gauges cover the window since the previous scrape, as
    // llama-server's do: a scrape after an idle spell (or during sleep) reports 0.
    let since = {
        let mut last = s.metrics_window.lock().unwrap();
        let now = Window::of(&st);
        std::mem::replace(&mut *last, now)
    };
    let r = Registry::new();
    let counter = |name: &str, help: &str, v: f64| -> prometheus::Result<()> {
        let c = Counter::with_opts(Opts::new(format!("llamacpp:{name}"), help))?;
        c.inc_by(v.max(0.0));
        r.register(Box::new(c))
    };
    let gauge = |name: &str, help: &str, v: f64| -> prometheus::Result<()> {
        let g = Gauge::with_opts(Opts::new(format!("llamacpp:{name}"), help))?;
        g.set(v);
        r.register(Box::new(g))
    };
    let built = (|| -> prometheus::Result<()> {
        counter(
            "prompt_tokens_total",
            "Number of prompt tokens processed, excluding cached tokens",
            st.prompt_tokens_total as f64,
        )?;
        counter(
            "prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache",
            st.prompt_tokens_cached_total as f64,
        )?;
        counter(
            "prompt_seconds_total",
            "Total time spent processing prompts",
            st.prompt_seconds_total,
        )?;
        counter(
            "tokens_predicted_total",
            "Number of generation tokens processed",
            st.tokens_predicted_total as f64,
        )?;
        counter(
            "tokens_predicted_seconds_total",
            "Total time spent generating tokens",
            st.tokens_predicted_seconds_total,
        )?;
        counter(
            "n_decode_total",
            "Total number of decode calls",
            st.n_decode_total as f64,
        )?;
        counter(
            "n_tokens_max",
            "Largest observed sequence length (prompt + generation)",
            st.n_tokens_max as f64,
        )?;
        // No speculative decoding here: these stay zero, present for dashboards that read them.
        counter(
            "spec_decode_num_draft_tokens_total",
            "Speculative: Total draft tokens generated",
            0.0,
        )?;
        counter(
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            0.0,
        )?;
        counter(
            "spec_decode_num_drafts_total",
            "Speculative: Total speculative decoding verification steps",
            0.0,
        )?;
        counter(
            "requests_total",
            "Requests started on a slot",
            st.requests_total as f64,
        )?;
        gauge(
            "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s",
            rate(
                st.prompt_tokens_total.saturating_sub(since.prompt_tokens),
                (st.prompt_seconds_total - since.prompt_secs).max(0.0),
            ),
        )?;
        gauge(
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            rate(
                st.tokens_predicted_total
                    .saturating_sub(since.predicted_tokens),
                (st.tokens_predicted_seconds_total - since.predicted_secs).max(0.0),
            ),
        )?;
        gauge(
            "requests_processing",
            "Number of requests processing",
            st.requests_processing as f64,
        )?;
        gauge(
            "requests_deferred",
            "Number of requests deferred",
            st.requests_deferred as f64,
        )?;
        gauge(
            "n_busy_slots_per_decode",
            "Average number of busy slots per decode call",
            if st.n_decode_total > 0 {
                st.n_busy_slots_total as f64 / st.n_decode_total as f64
            } else {
                0.0
            },
        )?;
        gauge(
            "kv_cache_tokens",
            "KV-cache cells in use",
            st.kv_cells_used as f64,
        )?;
        gauge(
            "kv_cache_usage_ratio",
            "KV-cache usage. 1 means 100 percent usage",
            if st.kv_cells_total > 0 {
                st.kv_cells_used as f64 / st.kv_cells_total as f64
            } else {
                0.0
            },
        )?;
        // wgllm's own: the GPU memory its buffers hold now, and the host memory of the
        // prompt cache (which grows by design up to --cache-ram).
        for (name, help, v) in [
            (
                "wgllm:gpu_buffer_bytes",
                "Bytes of GPU buffers alive on the model's device",
                st.gpu_buffer_bytes,
            ),
            (
                "wgllm:prompt_cache_bytes",
                "Bytes of slot snapshots held in the host prompt cache",
                st.prompt_cache_bytes,
            ),
        ] {
            let g = Gauge::with_opts(Opts::new(name, help))?;
            g.set(v as f64);
            r.register(Box::new(g))?;
        }
        Ok(())
    })();
    built.map_err(|e| ApiError::server(format!("building the metrics: {e}")))?;
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&r.gather(), &mut out)
        .map_err(|e| ApiError::server(format!("writing the metrics: {e}")))?;
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .saturating_sub(s.started.elapsed().as_secs());
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4".to_string(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                start.to_string(),
            ),
        ],
        out,
    )
        .into_response())
}

/// The throughput counters at a scrape: the next scrape's gauges are rates since then.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Window {
    prompt_tokens: u64,
    prompt_secs: f64,
    predicted_tokens: u64,
    predicted_secs: f64,
}

impl Window {
    fn of(st: &crate::engine::service::Stats) -> Self {
        Window {
            prompt_tokens: st.prompt_tokens_total,
            prompt_secs: st.prompt_seconds_total,
            predicted_tokens: st.tokens_predicted_total,
            predicted_secs: st.tokens_predicted_seconds_total,
        }
    }
}
