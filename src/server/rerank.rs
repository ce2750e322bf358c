//! `/rerank` (also `/reranking`, `/v1/rerank`, `/v1/reranking`) for a server started with
//! `--reranking`: llama-server's request — `query`, `documents` (Jina's shape) or `texts`
//! (TEI's), `top_n`, and for TEI `return_text` — each document scored with the query by
//! the reranker's classifier head, the results sorted by score, best first.

use super::error::{ApiError, ApiResult};
use super::AppState;
use crate::engine::Pooling;
use crate::tokenizer::Tokenizer;
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// Most documents one request may carry.
const MAX_DOCUMENTS: usize = 1024;

/// A list of strings, or None for anything else (llama-server then takes the default).
fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v?.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// A rerank request as read from its body.
pub(super) struct RerankRequest {
    /// TEI's shape (the body names `texts`), else Jina's.
    pub tei: bool,
    pub documents: Vec<String>,
    /// Each document with the query, as the reranker reads them.
    pub prompts: Vec<Vec<u32>>,
    pub top_n: usize,
    pub return_text: bool,
    /// The `model` the body names, which the reply repeats.
    pub model: Option<String>,
}

impl RerankRequest {
    /// Reads `body` as llama-server does, each document laid out with the query, none
    /// longer than `max_tokens` (a slot's context).
    pub fn read(body: &Value, tok: &Tokenizer, max_tokens: usize) -> ApiResult<RerankRequest> {
        read(body, tok, max_tokens)
    }
}

fn read(body: &Value, tok: &Tokenizer, max_tokens: usize) -> ApiResult<RerankRequest> {
    let tei = body.get("texts").is_some();
    let query = match body.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err(ApiError::invalid("\"query\" must be a string")),
        None => return Err(ApiError::invalid("\"query\" must be provided")),
    };
    let documents = strings(body.get("documents"))
        .or_else(|| strings(body.get("texts")))
        .unwrap_or_default();
    if documents.is_empty() {
        return Err(ApiError::invalid(
            "\"documents\" must be a non-empty string array",
        ));
    }
    if documents.len() > MAX_DOCUMENTS {
        return Err(ApiError::invalid(format!(
            "{} documents: at most {MAX_DOCUMENTS} are taken in one request",
            documents.len()
        )));
    }
    let top_n = match body.get("top_n").and_then(Value::as_i64) {
        Some(n) => n.clamp(0, documents.len() as i64) as usize,
        None => documents.len(),
    };
    let return_text = tei && body.get("return_text").and_then(Value::as_bool) == Some(true);
    for text in std::iter::once(&query).chain(&documents) {
        super::budget::check_text(text)?;
    }
    let prompts = tok
        .rerank_prompts(&query, &documents, max_tokens)
        .map_err(ApiError::invalid)?;
    Ok(RerankRequest {
        tei,
        documents,
        prompts,
        top_n,
        return_text,
        model: body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

pub async fn rerank(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let service = s.service()?;
    if s.opts.pooling != Pooling::Rank {
        return Err(ApiError::not_supported(
            "This server does not support reranking. Start it with `--reranking`",
        ));
    }
    let body = super::off_runtime(|| super::wire::body_json(&body)).await?;
    let RerankRequest {
        tei,
        documents,
        prompts,
        top_n,
        return_text,
        model,
    } = super::off_runtime(|| {
        read(
            &body,
            service.tokenizer(),
            service.info().n_ctx_slot as usize,
        )
    })
    .await?;
    let n_tokens: usize = prompts.iter().map(Vec::len).sum();
    let scores = service.embed(prompts, Pooling::Rank).await?;
    let label = if tei { "score" } else { "relevance_score" };
    let mut results: Vec<(usize, f32)> = (scores.iter().enumerate())
        .map(|(i, rows)| {
            (
                i,
                rows.first()
                    .and_then(|r| r.first())
                    .copied()
                    .unwrap_or(-1e6),
            )
        })
        .collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1));
    results.truncate(top_n);
    let results: Vec<Value> = (results.into_iter())
        .map(|(i, score)| {
            let mut r = json!({"index": i, label: score});
            if return_text {
                r["text"] = json!(documents[i]);
            }
            r
        })
        .collect();
    if tei {
        return Ok(Json(Value::Array(results)));
    }
    let model = model.unwrap_or_else(|| s.model_name());
    Ok(Json(json!({
        "model": model,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    })))
}
