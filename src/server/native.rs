//! llama-server's own endpoints: `/health`, `/completion`, `/tokenize`, `/detokenize`,
//! `/apply-template`, `/props`, `/slots`.

use super::error::{ApiError, ApiResult};
use super::gen::{self, Completion, Item, Piece, Progress};
use super::params::{self, Fields, GenParams};
use super::wire::{body_json, futures_join, timings_json, token_json};
use super::AppState;
use crate::engine::service::{Finished, SlotAction};
use crate::tokenizer::Tokenizer;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// `/v1/systemone`: typed decisions read from a decision model's scores (llama-server's
/// laya, openjev, ... files, which name a `<arch>.decision.type`). None of their
/// architectures loads here, so every model answers as llama-server answers for a model
/// that is not one: 501, before the request is read.
pub async fn systemone(State(s): State<Arc<AppState>>) -> ApiResult<Response> {
    s.service()?;
    Err(ApiError::not_supported(
        "This model is not a decision model",
    ))
}

pub async fn health(State(s): State<Arc<AppState>>) -> Response {
    match s.service() {
        // Reloading the model after the GPU device was lost: unavailable, and why.
        Ok(service) => match service.stats().recovering {
            Some(why) => ApiError::unavailable(why).into_response(),
            None => Json(json!({"status": "ok"})).into_response(),
        },
        Err(e) => e.into_response(),
    }
}

pub async fn completion(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    let body = super::off_runtime(|| body_json(&body)).await?;
    completion_of(&s, body).await
}

/// A native completion of a parsed body (also `/infill`'s, with its prompt laid out).
pub async fn completion_of(s: &Arc<AppState>, body: Value) -> ApiResult<Response> {
    let service = s.service()?;
    let tok = service.tokenizer();
    let p = super::off_runtime(|| params::gen_params(&body, &s.opts.defaults, tok)).await?;
    let input = s.image_input(service);
    let mut reqs =
        super::off_runtime(|| params::completion_requests(&body, &p, tok, &input)).await?;
    params::check_replies(&reqs, &p, service.info().n_ctx_slot)?;
    if p.stream {
        let req = reqs.remove(0);
        let start = gen::start_stream(service, req).await?;
        let tok = tok.clone();
        let settings = settings_json(&p, &s.model_name());
        let model = s.model_name();
        let (return_progress, per_token) = {
            let f = Fields::of(&body)?;
            (
                f.bool("return_progress")?.unwrap_or(false),
                f.bool("timings_per_token")?.unwrap_or(false),
            )
        };
        let n_prompt = start.n_prompt;
        let mut clock = StreamClock::default();
        return Ok(gen::sse(
            start,
            move |item| match item {
                Item::Progress(pr) => {
                    clock.progress(&pr);
                    if !return_progress {
                        return String::new();
                    }
                    let mut v = json!({
                        "index": 0, "content": "", "tokens": [0], "stop": false, "id_slot": -1,
                        "tokens_predicted": 0, "tokens_evaluated": pr.total,
                        "prompt_progress": pr.json(),
                    });
                    if per_token {
                        v["timings"] = clock.prompt_timings(&pr);
                    }
                    gen::data(&v)
                }
                Item::Piece(pc) => {
                    clock.piece(pc);
                    let mut v = json!({
                        "index": 0,
                        "content": pc.text,
                        "tokens": pc.token.into_iter().collect::<Vec<_>>(),
                        "stop": false,
                        "id_slot": -1,
                        "tokens_predicted": clock.n_gen,
                        "tokens_evaluated": n_prompt,
                    });
                    if p.n_probs > 0 {
                        v["completion_probabilities"] = probs_json(
                            &tok,
                            std::slice::from_ref(pc),
                            p.n_probs,
                            p.request.params.post_sampling_probs,
                        );
                    }
                    if per_token {
                        v["timings"] = clock.gen_timings(n_prompt);
                    }
                    gen::data(&v)
                }
                Item::End(end) => {
                    let mut v = final_json(end, "", &[], &settings, &model);
                    v["content"] = json!("");
                    gen::data(&v)
                }
                Item::Error(e) => format!("error: {}\n\n", json!({"error": e.object()})),
            },
            None,
        ));
    }
    let runs = reqs.into_iter().enumerate().map(|(i, req)| {
        let service = service.clone();
        async move { (i, req.prompt.clone(), gen::complete(&service, req).await) }
    });
    let mut results = Vec::new();
    for (i, prompt, r) in futures_join(runs).await {
        let c = r?;
        let mut v = completion_json(&c, &p, tok, &s.model_name());
        v["index"] = json!(i);
        v["prompt"] = json!(prompt
            .iter()
            .map(|&t| String::from_utf8_lossy(&tok.token_to_piece(t, true)).into_owned())
            .collect::<String>());
        if let Some(fields) = &p.response_fields {
            v = pick_fields(&v, fields)?;
        }
        results.push(v);
    }
    Ok(Json(if results.len() == 1 {
        results.pop().unwrap()
    } else {
        Value::Array(results)
    })
    .into_response())
}

/// llama-server's `response_fields`: only the named keys; `a/b` is looked up nested and
/// kept under its whole name. A name given twice is kept once; what the copies add up
/// to is held to the request budget (names of nested parts copy them again).
fn pick_fields(v: &Value, fields: &[String]) -> ApiResult<Value> {
    let mut out = serde_json::Map::new();
    let mut bytes = 0u64;
    for f in fields {
        if out.contains_key(f) {
            continue;
        }
        let found = f.split('/').try_fold(v, |at, k| at.get(k));
        if let Some(x) = found {
            bytes += super::budget::json_size(x) + f.len() as u64;
            super::budget::check(
                &format!("the {} fields selected (response_fields)", out.len() + 1),
                bytes,
                "select fewer fields, or fewer nested parts of the same field",
            )?;
            out.insert(f.clone(), x.clone());
        }
    }
    Ok(Value::Object(out))
}

/// `/completion`'s reply.
fn completion_json(c: &Completion, p: &GenParams, tok: &Tokenizer, model: &str) -> Value {
    let settings = settings_json(p, model);
    let tokens: Vec<u32> = if p.return_tokens {
        c.pieces.iter().filter_map(|x| x.token).collect()
    } else {
        Vec::new()
    };
    let mut v = final_json(&c.end, &c.text, &tokens, &settings, model);
    if p.n_probs > 0 {
        v["completion_probabilities"] = probs_json(
            tok,
            &c.pieces,
            p.n_probs,
            p.request.params.post_sampling_probs,
        );
    }
    v
}

fn final_json(end: &Finished, text: &str, tokens: &[u32], settings: &Value, model: &str) -> Value {
    json!({
        "index": 0,
        "content": text,
        "tokens": tokens,
        "id_slot": end.slot,
        "stop": true,
        "model": model,
        "tokens_predicted": end.n_generated,
        "tokens_evaluated": end.n_prompt,
        "generation_settings": settings,
        "has_new_line": text.contains('\n'),
        "truncated": end.truncated,
        "stop_type": gen::stop_type(&end.stop),
        "stopping_word": match &end.stop {
            crate::engine::service::StopReason::Word(w) => w.as_str(),
            _ => "",
        },
        "tokens_cached": (end.n_prompt + end.n_generated).saturating_sub(1),
        "timings": timings_json(&end.timings, end.n_cached, end.n_generated),
    })
}

/// Timings while a request runs (`timings_per_token`), from the stream's own clock.
fn live_timings(
    cache_n: usize,
    prompt_n: usize,
    prompt_ms: f64,
    n_gen: usize,
    gen_ms: f64,
) -> Value {
    let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let rate = |ms: f64, n: usize| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    let steps = n_gen.saturating_sub(1);
    json!({
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per(prompt_ms, prompt_n),
        "prompt_per_second": rate(prompt_ms, prompt_n),
        "predicted_n": n_gen,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": per(gen_ms, steps),
        "predicted_per_second": rate(gen_ms, steps),
    })
}

/// A stream's own clock for `timings_per_token`: the prompt time of the last progress
/// report, and the tokens generated since the first piece.
#[derive(Default)]
pub struct StreamClock {
    prompt_ms: f64,
    first_piece_at: Option<std::time::Instant>,
    /// Generated tokens so far (the held-back tail is a piece without one).
    pub n_gen: usize,
}

impl StreamClock {
    pub fn progress(&mut self, pr: &Progress) {
        self.prompt_ms = pr.ms;
    }

    pub fn piece(&mut self, pc: &Piece) {
        self.n_gen += pc.token.is_some() as usize;
        self.first_piece_at
            .get_or_insert_with(std::time::Instant::now);
    }

    /// Timings while the prompt is processed.
    pub fn prompt_timings(&self, pr: &Progress) -> Value {
        live_timings(pr.cache, pr.processed - pr.cache, self.prompt_ms, 0, 0.0)
    }

    /// Timings while tokens are generated.
    pub fn gen_timings(&self, n_prompt: usize) -> Value {
        let gen_ms = self
            .first_piece_at
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        live_timings(0, n_prompt, self.prompt_ms, self.n_gen, gen_ms)
    }
}

/// The settings a request ran with, as llama-server echoes them.
pub fn settings_json(p: &GenParams, model: &str) -> Value {
    let s = &p.request.params.sampling;
    json!({
        "model": model,
        "n_predict": p.request.params.n_predict,
        "seed": s.seed,
        "temperature": s.temp,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": s.dry_multiplier,
        "n_keep": p.request.params.shift.keep,
        "n_probs": p.n_probs,
        "min_keep": s.min_keep,
        "stop": p.request.stop,
        "stream": p.stream,
        "ignore_eos": p.ignore_eos,
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "mirostat": 0,
        "max_tokens": p.request.params.n_predict,
        "n_discard": 0,
        "post_sampling_probs": p.request.params.post_sampling_probs,
        "backend_sampling": p.request.params.gpu_draws == Some(true),
        "timings_per_token": false,
        // -inf (a ban) is written as null, as llama-server writes it.
        "logit_bias": (s.logit_bias.iter().copied())
            .chain(s.banned.iter().map(|&t| (t, f32::NEG_INFINITY)))
            .map(|(t, b)| json!({"bias": if b.is_finite() { json!(b) } else { Value::Null }, "token": t}))
            .collect::<Vec<_>>(),
        "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    })
}

/// `completion_probabilities`: per generated token its log-probability and the most
/// likely alternatives.
fn probs_json(tok: &Tokenizer, pieces: &[Piece], n: usize, post: bool) -> Value {
    if n == 0 {
        return Value::Null;
    }
    // Probabilities after the sampler chain are shown as such; the model's own as
    // log-probabilities (never -inf: llama-server writes the lowest float).
    let entry = |id: u32, p: f32| {
        let (text, bytes) = token_json(tok, id);
        if post {
            json!({"id": id, "token": text, "bytes": bytes, "prob": p})
        } else {
            let lp = if p > 0.0 {
                (p as f64).ln()
            } else {
                f32::MIN as f64
            };
            json!({"id": id, "token": text, "bytes": bytes, "logprob": lp})
        }
    };
    Value::Array(
        pieces
            .iter()
            .filter_map(|pc| {
                let (pr, token) = (pc.probs.as_ref()?, pc.token?);
                let mut v = entry(token, pr.prob);
                let top: Vec<Value> = pr.top.iter().map(|&(t, p)| entry(t, p)).collect();
                v[if post { "top_probs" } else { "top_logprobs" }] = Value::Array(top);
                Some(v)
            })
            .collect(),
    )
}

pub async fn tokenize(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    let service = s.service()?;
    let tok = service.tokenizer();
    let (out, _) = super::off_runtime(|| tokenize_reply(&body_json(&body)?, tok)).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        out,
    )
        .into_response())
}

/// `/tokenize`'s reply to `body`, written out as it is built (never as a tree of
/// values), its size checked against the request budget as it grows; with the tokens.
pub fn tokenize_reply(body: &Value, tok: &Tokenizer) -> ApiResult<(String, Vec<u32>)> {
    use std::fmt::Write as _;
    let f = Fields::of(body)?;
    let add_special = f.bool("add_special")?.unwrap_or(false);
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let tokens = match f.value("content") {
        None => Vec::new(),
        Some(Value::String(c)) => super::budget::encode(tok, c, add_special, parse_special)?,
        Some(v) => params::prompt_tokens(v, tok, add_special)?,
    };
    let mut out = String::from("{\"tokens\":[");
    let too_big = |out: &String| {
        super::budget::check(
            &format!("the reply listing {} tokens", tokens.len()),
            out.len() as u64,
            "tokenize a shorter text, or without with_pieces",
        )
    };
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    for (i, &t) in tokens.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        if with_pieces {
            let piece = match String::from_utf8(tok.token_to_piece(t, true)) {
                Ok(s) => Value::String(s),
                Err(e) => json!(e.into_bytes()),
            };
            let _ = write!(out, "{sep}{{\"id\":{t},\"piece\":{piece}}}");
        } else {
            let _ = write!(out, "{sep}{t}");
        }
        if i % 4096 == 0 {
            too_big(&out)?;
        }
    }
    out.push_str("]}");
    too_big(&out)?;
    Ok((out, tokens))
}

pub async fn detokenize(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let service = s.service()?;
    let tok = service.tokenizer();
    let content = super::off_runtime(|| detokenize_text(&body_json(&body)?, tok)).await?;
    Ok(Json(json!({ "content": content })))
}

/// `/detokenize`'s text for `body`, where the request budget allows it.
pub fn detokenize_text(body: &Value, tok: &Tokenizer) -> ApiResult<String> {
    let f = Fields::of(body)?;
    let tokens = match f.value("tokens") {
        None => Vec::new(),
        Some(v) => params::prompt_tokens(v, tok, false)?,
    };
    // The text is at most the tokens' pieces; written out, each byte at most an escape.
    let bound: u64 = (tokens.iter())
        .map(|&t| tok.token_text(t).map_or(16, str::len) as u64)
        .sum();
    super::budget::check(
        &format!("the text of {} tokens", tokens.len()),
        bound * 7,
        "detokenize fewer tokens at once",
    )?;
    Ok(tok.decode(&tokens))
}

pub async fn apply_template(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let service = s.service()?;
    let body = super::off_runtime(|| body_json(&body)).await?;
    let prompt = super::off_runtime(|| {
        let chat =
            super::chat::ChatRequest::read(&body, service.tokenizer(), &s.opts.defaults.reasoning)?;
        let prompt = chat.render(service.tokenizer())?;
        // Written out, each byte at most an escape (the render itself is bounded by the
        // template's fuel and limits).
        super::budget::check(
            &format!("the rendered prompt of {} bytes", prompt.len()),
            prompt.len() as u64 * 7,
            "send shorter messages",
        )?;
        Ok::<_, ApiError>(prompt)
    })
    .await?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// The build, in llama-server's shape (`b<build>-<commit>`): wgllm's version in place of
/// llama.cpp's build number.
pub fn build_info() -> String {
    format!("b{}-wgllm", env!("CARGO_PKG_VERSION"))
}

pub async fn props(State(s): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let service = s.service()?;
    let info = service.info();
    let d = &s.opts.defaults;
    let p = GenParams {
        request: crate::engine::service::Request {
            params: crate::engine::SessionParams {
                sampling: d.sampling.clone(),
                n_predict: d.n_predict,
                shift: d.shift,
                ..Default::default()
            },
            ..Default::default()
        },
        stream: false,
        n_probs: 0,
        return_tokens: false,
        include_usage: false,
        show_top: false,
        ignore_eos: d.ignore_eos,
        response_fields: None,
    };
    let settings = json!({
        "params": settings_json(&p, &s.model_name()),
        "n_ctx": info.n_ctx_slot,
    });
    let tok = service.tokenizer();
    let piece = |t: Option<u32>| {
        t.map(|t| tok.token_text(t).unwrap_or("").to_string())
            .unwrap_or_default()
    };
    Ok(Json(json!({
        "default_generation_settings": settings,
        "total_slots": info.n_slots,
        "model_alias": s.model_name(),
        "model_path": s.opts.model_path.display().to_string(),
        "modalities": {"vision": service.image_prep().is_some(), "video": false, "audio": false},
        "media_marker": super::media::marker(),
        "chat_template": tok.chat_template().unwrap_or(crate::tokenizer::CHATML),
        "bos_token": piece(tok.bos()),
        "eos_token": piece(tok.eos()),
        "build_info": build_info(),
        "is_sleeping": service.is_sleeping(),
        "endpoint_slots": s.opts.slots,
        "endpoint_props": false,
        "endpoint_metrics": s.opts.metrics,
        "ui": false,
        "cors_proxy_enabled": s.opts.cors_proxy,
    })))
}

pub async fn set_props() -> ApiError {
    ApiError::not_supported("changing server properties at run time is not supported")
}

pub async fn slots(State(s): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    if !s.opts.slots {
        return Err(ApiError::not_supported(
            "This server does not support slots endpoint. Start it with `--slots`",
        ));
    }
    let service = s.service()?;
    let list = service.slots().await;
    Ok(Json(Value::Array(
        list.iter()
            .map(|x| {
                let sp = &x.params.sampling;
                let mut v = json!({
                    "id": x.id,
                    "n_ctx": x.n_ctx,
                    "speculative": false,
                    "is_processing": x.is_processing,
                });
                // A slot that never ran a request has no settings to show.
                if let Some(k) = x.request {
                    v["id_task"] = json!(k);
                    v["n_prompt_tokens"] = json!(x.n_cached);
                    v["params"] = json!({
                        "n_predict": x.params.n_predict,
                        "seed": sp.seed,
                        "temperature": sp.temp,
                        "top_k": sp.top_k,
                        "top_p": sp.top_p,
                        "min_p": sp.min_p,
                        "n_probs": x.params.n_probs,
                    });
                    v["next_token"] = json!([{
                        "has_next_token": x.is_processing,
                        "has_new_line": false,
                        "n_remain": if x.is_processing { x.params.n_predict - x.n_decoded as i32 } else { -1 },
                        "n_decoded": if x.is_processing { x.n_decoded } else { 0 },
                    }]);
                }
                v
            })
            .collect(),
    )))
}

pub async fn slot_action(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    if s.opts.slot_save_path.is_none() {
        return Err(ApiError::not_supported(
            "This server does not support slots action. Start it with `--slot-save-path`",
        ));
    }
    let service = s.service()?;
    let id: u32 = id
        .parse()
        .map_err(|_| ApiError::invalid("Invalid slot ID"))?;
    let body = super::off_runtime(|| body_json(&body)).await?;
    let f = Fields::of(&body)?;
    let file = |f: &Fields| -> ApiResult<(String, std::path::PathBuf)> {
        let dir = s.opts.slot_save_path.as_ref().unwrap();
        let name = f
            .str("filename")?
            .ok_or_else(|| ApiError::invalid("\"filename\" is required"))?;
        if !valid_filename(name) {
            return Err(ApiError::invalid("Invalid filename"));
        }
        Ok((name.to_string(), dir.join(name)))
    };
    let action = q.get("action").map(String::as_str).unwrap_or("");
    match action {
        "save" => {
            let (name, path) = file(&f)?;
            let r = service.slot_action(id, SlotAction::Save(path)).await?;
            Ok(Json(json!({
                "id_slot": id, "filename": name, "n_saved": r.tokens,
                "n_written": std::fs::metadata(s.opts.slot_save_path.as_ref().unwrap().join(&name)).map_or(0, |m| m.len()),
                "timings": {"save_ms": r.ms},
            })))
        }
        "restore" => {
            let (name, path) = file(&f)?;
            if !path.exists() {
                return Err(ApiError::invalid(format!("no slot file \"{name}\"")));
            }
            let n_read = std::fs::metadata(&path).map_or(0, |m| m.len());
            let r = service.slot_action(id, SlotAction::Restore(path)).await?;
            Ok(Json(json!({
                "id_slot": id, "filename": name, "n_restored": r.tokens, "n_read": n_read,
                "timings": {"restore_ms": r.ms},
            })))
        }
        "erase" => {
            let r = service.slot_action(id, SlotAction::Erase).await?;
            Ok(Json(json!({"id_slot": id, "n_erased": r.tokens})))
        }
        _ => Err(ApiError::invalid("Invalid action")),
    }
}

/// A file name with no directory parts: no separators, not `.` or `..`, nothing hidden
/// or control characters, at most 255 bytes.
pub fn valid_filename(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.starts_with('.')
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c == ':' || c.is_control())
}

/// `GET /lora-adapters`: the loaded adapters with the scales requests take when they
/// give none, as llama-server lists them.
pub async fn lora_adapters(State(s): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let service = s.service()?;
    let scales = service.lora_scales(None).await?;
    Ok(Json(lora_list(&service.info().loras, &scales)))
}

/// `POST /lora-adapters`: a list of `{"id", "scale"}` sets those scales (adapters not
/// listed go to 0) for requests started from now on.
pub async fn set_lora_adapters(
    State(s): State<Arc<AppState>>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let service = s.service()?;
    let body = super::off_runtime(|| body_json(&body)).await?;
    if !body.is_array() {
        return Err(ApiError::invalid("Request body must be an array"));
    }
    let n = service.info().loras.len();
    let scales = params::lora_scales(&body, n, "the request body")?;
    service.lora_scales(Some(scales)).await?;
    Ok(Json(json!({ "success": true })))
}

fn lora_list(loras: &[crate::engine::service::LoraInfo], scales: &[f32]) -> Value {
    Value::Array(
        (loras.iter().enumerate())
            .map(|(i, a)| {
                json!({
                    "id": i,
                    "path": a.path,
                    "scale": scales.get(i).copied().unwrap_or(0.0),
                    "task_name": a.task_name,
                    "prompt_prefix": a.prompt_prefix,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::valid_filename;

    #[test]
    fn slot_file_names_stay_in_their_directory() {
        for ok in ["slot1.bin", "a-b_c.bin", "x"] {
            assert!(valid_filename(ok), "{ok}");
        }
        for bad in [
            "", ".", "..", "../x", "a/b", "a\\b", ".hidden", "c:x", "a\nb",
        ] {
            assert!(!valid_filename(bad), "{bad:?}");
        }
    }
}
