//! `/infill`: llama-server's fill-in-the-middle request (`input_prefix`, `input_suffix`,
//! `input_extra` files, `prompt`) laid out with the model's FIM tokens
//! ([`crate::tokenizer::infill_prompt`]) and answered as a native completion, streamed
//! or not. Models without FIM tokens are refused with the tokens they lack.

use super::error::{ApiError, ApiResult};
use super::params::{pieces, token_id, Fields};
use super::AppState;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::{infill_prompt, infill_unsupported, InfillFile, InfillLimits, InfillParts};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;

/// Most extra files one request may carry.
const MAX_EXTRA: usize = 1024;

pub async fn infill(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    let service = s.service()?;
    let tok = service.tokenizer();
    if let Some(why) = infill_unsupported(tok) {
        return Err(ApiError::not_supported(why));
    }
    // The room left for extra files counts the server's `-n`, not the request's
    // `n_predict`, as llama-server counts it.
    let lim = InfillLimits {
        n_batch: s.opts.n_batch,
        n_predict: s.opts.defaults.n_predict,
        n_ctx: service.info().n_ctx_slot,
        spm: s.opts.spm_infill,
    };
    let body = super::off_runtime(|| read(super::wire::body_json(&body)?, tok, lim)).await?;
    super::native::completion_of(&s, body).await
}

/// An `/infill` body read: the same body with its prompt laid out as tokens, to be
/// answered as a native completion (a model without FIM tokens gets as far as the
/// layout, which refuses it; the handler asks first).
pub fn read(mut body: Value, tok: &Tokenizer, lim: InfillLimits) -> ApiResult<Value> {
    let tokens = {
        let f = Fields::of(&body)?;
        let prompt = match f.value("prompt") {
            None => "",
            Some(Value::String(p)) => p.as_str(),
            Some(_) => return Err(ApiError::invalid("\"prompt\" must be a string")),
        };
        let prefix = f
            .value("input_prefix")
            .ok_or_else(|| ApiError::invalid("\"input_prefix\" is required"))?;
        let suffix = f
            .value("input_suffix")
            .ok_or_else(|| ApiError::invalid("\"input_suffix\" is required"))?;
        let parts = InfillParts {
            prefix: mixed(prefix, tok, "input_prefix")?,
            suffix: mixed(suffix, tok, "input_suffix")?,
            prompt: super::budget::encode(tok, prompt, false, true)?,
            extra: extra_files(f.value("input_extra"))?,
        };
        infill_prompt(tok, &parts, lim)
            .ok_or_else(|| ApiError::not_supported("Infill is not supported by this model"))?
    };
    body["prompt"] = json!(tokens);
    Ok(body)
}

/// `input_extra`: a list of `{"filename": string, "text": string}` (filename optional).
fn extra_files(v: Option<&Value>) -> ApiResult<Vec<InfillFile>> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = v else {
        return Err(ApiError::invalid(
            "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
        ));
    };
    if items.len() > MAX_EXTRA {
        return Err(ApiError::invalid(format!(
            "\"input_extra\" has {} files; at most {MAX_EXTRA} are taken",
            items.len()
        )));
    }
    items
        .iter()
        .map(|chunk| {
            let text = match chunk.get("text") {
                Some(Value::String(t)) => {
                    super::budget::check_text(t)?;
                    t.clone()
                }
                _ => {
                    return Err(ApiError::invalid(
                        "extra_context chunk must contain a \"text\" field with a string value",
                    ))
                }
            };
            let filename = match chunk.get("filename") {
                None | Some(Value::Null) => "tmp".to_string(),
                Some(Value::String(n)) => n.clone(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "extra_context chunk's \"filename\" field must be a string",
                    ))
                }
            };
            Ok(InfillFile { filename, text })
        })
        .collect()
}

/// A prefix or suffix: a string, token ids, or a list mixing both, tokenized without
/// special tokens (as llama-server's `tokenize_mixed`: special-token text stays text).
fn mixed(v: &Value, tok: &Tokenizer, what: &str) -> ApiResult<Vec<u32>> {
    let n_vocab = tok.n_vocab() as u64;
    let piece = |p: &Value, out: &mut Vec<u32>| -> ApiResult<()> {
        match p {
            Value::String(s) => out.extend(super::budget::encode(tok, s, false, false)?),
            Value::Number(n) => out.push(token_id(n, n_vocab, &format!("\"{what}\""))?),
            _ => {
                return Err(ApiError::invalid(format!(
                    "\"{what}\" is a string, token ids, or a list mixing both"
                )))
            }
        }
        Ok(())
    };
    let mut out = Vec::new();
    for p in pieces(v) {
        piece(p, &mut out)?;
    }
    Ok(out)
}
