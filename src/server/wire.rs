//! What every endpoint shares on the wire: a request body read as JSON, replies' ids and
//! clocks, llama-server's timings and token pieces, and requests run side by side.

use super::error::{ApiError, ApiResult};
use crate::engine::Timings;
use crate::tokenizer::Tokenizer;
use axum::body::Bytes;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// A request body as JSON.
pub fn body_json(body: &Bytes) -> ApiResult<Value> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    super::budget::check_body(body)?;
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid JSON in the request body: {e}")))
}

/// Seconds since the Unix epoch, as replies' `created` fields give them.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A reply id: `prefix` (with its separator) and 32 letters and digits, from the clock and a counter mixed
/// (unique within the process and across restarts; not a secret).
pub fn reply_id(prefix: &str) -> String {
    const ABC: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // splitmix64 over (time, counter): well spread letters from both.
    let mut x = t ^ n.rotate_left(40);
    let id: String = (0..32)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ABC[((z ^ (z >> 31)) % ABC.len() as u64) as usize] as char
        })
        .collect();
    format!("{prefix}{id}")
}

/// Runs futures side by side and returns their outputs in order. Dropping the returned
/// future (a client that went away) aborts them all, which cancels their requests.
pub async fn futures_join<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, f) in futs.enumerate() {
        set.spawn(async move { (i, f.await) });
    }
    let mut out: Vec<(usize, T)> = Vec::with_capacity(set.len());
    while let Some(r) = set.join_next().await {
        if let Ok(v) = r {
            out.push(v);
        }
    }
    out.sort_by_key(|v| v.0);
    out.into_iter().map(|v| v.1).collect()
}

/// llama-server's `timings` object of a finished request.
pub fn timings_json(t: &Timings, n_cached: usize, n_generated: usize) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let rate = |ms: f64, n: usize| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    let (pm, em) = (ms(t.prompt), ms(t.eval));
    let mut v = json!({
        "cache_n": n_cached,
        "prompt_n": t.prompt_tokens,
        "prompt_ms": pm,
        "prompt_per_token_ms": per(pm, t.prompt_tokens),
        "prompt_per_second": rate(pm, t.prompt_tokens),
        "predicted_n": n_generated,
        "predicted_ms": em,
        // The first token comes from the prompt's logits: n tokens took n - 1 decodes.
        "predicted_per_token_ms": per(em, n_generated.saturating_sub(1)),
        "predicted_per_second": rate(em, n_generated.saturating_sub(1)),
    });
    // A draft model's proposals and those kept, as llama-server reports them.
    if t.draft_n > 0 {
        v["draft_n"] = json!(t.draft_n);
        v["draft_n_accepted"] = json!(t.draft_accepted);
    }
    v
}

/// A piece's text and bytes as llama-server shows a token.
pub fn token_json(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_to_piece(id, false);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}
