//! `/embedding` and `/embeddings` (llama-server's request and reply) and `/v1/embeddings`
//! (OpenAI's), served by an engine made with `--embeddings`: each input (a string, token
//! ids, a list of either, content parts) tokenized with the model's special tokens,
//! embedded with the server's pooling and normalised as the request says (`embd_normalize`,
//! Euclidean by default), as floats or base64.

use super::error::{ApiError, ApiResult};
use super::params::{self, Fields};
use super::AppState;
use crate::engine::{normalize, Pooling};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::Value;
use std::sync::Arc;

/// Most inputs one request may carry.
const MAX_INPUTS: usize = 1024;

pub async fn native(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    embeddings(&s, body, false).await
}

pub async fn openai(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    embeddings(&s, body, true).await
}

/// An embeddings body read: each input's tokens and how to write the vectors.
pub struct EmbedRequest {
    pub inputs: Vec<Vec<u32>>,
    pub base64: bool,
    /// `embd_normalize`: -1 none, 0 max-abs, 1 taxicab, 2 Euclidean, >2 p-norm.
    pub norm: i32,
}

/// Reads an embeddings body (`oai`: OpenAI's route) for a model of `n_embd` that pools
/// as `pooling`, its reply's size held to the request budget.
pub fn read(
    body: &Value,
    tok: &crate::tokenizer::Tokenizer,
    oai: bool,
    pooling: Pooling,
    n_embd: u32,
) -> ApiResult<EmbedRequest> {
    let f = Fields::of(body)?;
    let input = match (f.value("input"), f.value("content")) {
        (Some(i), _) => i,
        (None, Some(c)) if !oai => c,
        _ => {
            return Err(ApiError::invalid(if oai {
                "\"input\" must be provided"
            } else {
                "\"input\" or \"content\" must be provided"
            }))
        }
    };
    let base64 = match f.value("encoding_format") {
        None => false,
        Some(Value::String(e)) if e == "float" => false,
        Some(Value::String(e)) if e == "base64" => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "\"encoding_format\" is either \"float\" or \"base64\"",
            ))
        }
    };
    let norm = match f.value("embd_normalize") {
        None => 2,
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|&n| n >= -1)
            .ok_or_else(|| {
                ApiError::invalid("\"embd_normalize\" is an integer from -1 (none) up")
            })?,
    };
    if oai && pooling == Pooling::None {
        return Err(ApiError::invalid(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
        ));
    }
    if input.as_array().is_some_and(Vec::is_empty) {
        return Err(ApiError::invalid("\"input\" is empty"));
    }
    let prompts = params::prompts(input);
    if prompts.len() > MAX_INPUTS {
        return Err(ApiError::invalid(format!(
            "{} inputs: at most {MAX_INPUTS} are taken in one request",
            prompts.len()
        )));
    }
    let inputs = prompts
        .into_iter()
        .map(|p| {
            let t = params::prompt_tokens(p, tok, true)?;
            if t.is_empty() {
                return Err(ApiError::invalid("Input content cannot be empty"));
            }
            Ok(t)
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    // Each number of the reply: the vector's f32 and its text (at most 24 bytes written
    // out; 6 in base64); one vector per input, or per token without pooling.
    let n_vectors = match pooling {
        Pooling::None => n_tokens,
        _ => inputs.len(),
    } as u64;
    let per_float = 4 + if base64 { 6 } else { 24 };
    super::budget::check(
        &format!("{n_vectors} embeddings of {n_embd} numbers"),
        n_vectors * n_embd as u64 * per_float,
        "send fewer or shorter inputs per request",
    )?;
    Ok(EmbedRequest {
        inputs,
        base64,
        norm,
    })
}

async fn embeddings(s: &AppState, body: Bytes, oai: bool) -> ApiResult<Response> {
    let service = s.service()?;
    if !service.info().embeddings {
        return Err(ApiError::not_supported(
            "This server does not support embeddings. Start it with `--embeddings`",
        ));
    }
    let pooling = s.opts.pooling;
    let (tok, n_embd) = (service.tokenizer(), service.info().n_embd);
    let EmbedRequest {
        inputs,
        base64,
        norm,
    } = super::off_runtime(|| {
        let body = super::wire::body_json(&body)?;
        read(&body, tok, oai, pooling, n_embd)
    })
    .await?;
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let vectors = service.embed(inputs, pooling).await?;
    // Unpooled per-token states are returned as they are, as llama-server does.
    let finish = |v: &Vec<f32>| match pooling {
        Pooling::None => v.clone(),
        _ => normalize(v, norm),
    };
    // Written out straight from the vectors (a tree of values would take 80 bytes a
    // number), each number as the f64 it widens to, as before.
    let out = if !oai {
        let items: Vec<NativeItem> = (vectors.iter().enumerate())
            .map(|(index, rows)| NativeItem {
                index,
                embedding: rows.iter().map(|r| Floats(finish(r))).collect(),
            })
            .collect();
        serde_json::to_vec(&items)
    } else {
        let data: Vec<OaiItem> = (vectors.iter().enumerate())
            .map(|(index, rows)| {
                let v = finish(&rows[0]);
                let embedding = if base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    OaiEmbedding::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    OaiEmbedding::Floats(Floats(v))
                };
                OaiItem {
                    embedding,
                    index,
                    object: "embedding",
                }
            })
            .collect();
        serde_json::to_vec(&OaiReply {
            model: s.model_name(),
            object: "list",
            usage: Usage {
                prompt_tokens: n_tokens,
                total_tokens: n_tokens,
            },
            data,
        })
    }
    .map_err(|e| ApiError::server(format!("writing the embeddings: {e}")))?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        out,
    )
        .into_response())
}

/// Numbers of a vector, written as the f64s they widen to.
struct Floats(Vec<f32>);

impl serde::Serialize for Floats {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|&x| x as f64))
    }
}

#[derive(serde::Serialize)]
struct NativeItem {
    index: usize,
    embedding: Vec<Floats>,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum OaiEmbedding {
    Floats(Floats),
    Base64(String),
}

#[derive(serde::Serialize)]
struct OaiItem {
    embedding: OaiEmbedding,
    index: usize,
    object: &'static str,
}

#[derive(serde::Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(serde::Serialize)]
struct OaiReply {
    model: String,
    object: &'static str,
    usage: Usage,
    data: Vec<OaiItem>,
}
