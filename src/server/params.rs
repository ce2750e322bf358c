//! A request body's generation settings, with llama-server's field names (and OpenAI's
//! where they differ), over the server's defaults from its flags. A field of the wrong
//! type is refused with its name, never ignored.

use super::error::{ApiError, ApiResult};
use crate::engine::service::Request;
use crate::engine::{SessionParams, ShiftPolicy};
use crate::sample::SamplerParams;
use crate::tokenizer::Tokenizer;
use serde_json::Value;

/// Most stop strings a request may give, and the longest each may be, in bytes: every
/// generated token is checked against all of them on the engine's thread, which every
/// slot shares (OpenAI's API takes 4).
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_BYTES: usize = 512;

/// Most prompts one completion request may carry: each becomes a request of its own,
/// queued for the slots with a copy of the request's settings.
pub const MAX_PROMPTS: usize = 256;
/// Most bytes of settings (grammar, biases) all the prompts' requests may copy in all.
const MAX_COPIED_SETTINGS: usize = 256 << 20;

/// What the server's flags set for every request.
#[derive(Clone, Debug, Default)]
pub struct Defaults {
    pub sampling: SamplerParams,
    /// `-n`: the most tokens a request generates when it does not say (-1: no limit).
    pub n_predict: i32,
    pub shift: ShiftPolicy,
    /// `--ignore-eos`: end-of-generation tokens are never sampled.
    pub ignore_eos: bool,
    /// `-bs` or `--sampling gpu`: requests draw on the GPU unless they say
    /// `"backend_sampling": false` (echoed as llama-server's `backend_sampling`).
    pub backend_sampling: bool,
    /// LoRA adapters loaded (`--lora`): a request's `lora` ids range below this.
    pub n_lora: usize,
    /// How chat replies' thinking is given back (`--reasoning-format`).
    pub reasoning: ReasoningDefaults,
}

/// The server's reasoning flags, which a chat request may override.
#[derive(Clone, Debug, Default)]
pub struct ReasoningDefaults {
    /// `--reasoning-format none`: thinking stays in `content` as written.
    pub keep_in_content: bool,
    /// `--reasoning on|off` (None: `auto`, on where the template has thinking): the
    /// template's `enable_thinking`.
    pub enable: Option<bool>,
    /// `--chat-template-kwargs`: variables every chat template render gets.
    pub template_kwargs: serde_json::Map<String, Value>,
    /// `--reasoning-budget`: tokens of thinking before the closing tag is forced (None:
    /// no limit).
    pub budget: Option<u32>,
    /// `--reasoning-budget-message`: forced before the closing tag.
    pub budget_message: String,
}

/// A LoRA setting as llama-server reads it (`lora` of a request, the body of `POST
/// /lora-adapters`): a list of `{"id", "scale"}`, adapters not listed at 0; an id the
/// server does not have, or a scale that is not a number, is refused (llama-server
/// skips them silently).
pub fn lora_scales(v: &Value, n_lora: usize, what: &str) -> ApiResult<Vec<f32>> {
    let Some(list) = v.as_array() else {
        return Err(ApiError::invalid(format!(
            "Error: '{what}' must be an array of objects with 'id' and 'scale' fields"
        )));
    };
    let mut scales = vec![0f32; n_lora];
    for entry in list {
        let f = Fields::of(entry).map_err(|_| {
            ApiError::invalid(format!(
                "each entry of '{what}' must be an object with 'id' and 'scale' fields"
            ))
        })?;
        let id = f.i64("id")?.ok_or_else(|| {
            ApiError::invalid(format!(
                "an entry of '{what}' has no 'id' (the adapter's index in /lora-adapters)"
            ))
        })?;
        let scale = f.f32("scale")?.unwrap_or(0.0);
        if !scale.is_finite() {
            return Err(ApiError::invalid(format!(
                "LoRA adapter {id}: scale {scale} is not a finite number"
            )));
        }
        match usize::try_from(id).ok().filter(|&i| i < n_lora) {
            Some(i) => scales[i] = scale,
            None => {
                return Err(ApiError::invalid(match n_lora {
                    0 => format!("LoRA adapter {id} does not exist: the server has no adapters (start it with --lora FILE)"),
                    n => format!("LoRA adapter {id} does not exist: the server has {n} (ids 0 to {})", n - 1),
                }))
            }
        }
    }
    Ok(scales)
}

/// A request's settings besides its prompt.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub request: Request,
    pub stream: bool,
    pub n_probs: usize,
    pub return_tokens: bool,
    /// OpenAI's `stream_options.include_usage`.
    pub include_usage: bool,
    /// End-of-generation tokens are banned (shown in the echoed settings).
    pub ignore_eos: bool,
    /// llama-server's `response_fields`: only these (`a/b` nested) keys of the reply.
    pub response_fields: Option<Vec<String>>,
    /// Show the alternatives with each token's log-probability (OpenAI's
    /// `top_logprobs` > 0); the chosen token's alone otherwise.
    pub show_top: bool,
}

/// Typed access to a JSON object's optional fields.
pub struct Fields<'a>(pub &'a serde_json::Map<String, Value>);

impl<'a> Fields<'a> {
    pub fn of(body: &'a Value) -> ApiResult<Fields<'a>> {
        body.as_object()
            .map(Fields)
            .ok_or_else(|| ApiError::invalid("the request body must be a JSON object"))
    }
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    pub fn value(&self, k: &str) -> Option<&'a Value> {
        self.get(k)
    }
    pub fn f32(&self, k: &str) -> ApiResult<Option<f32>> {
        self.get(k)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| wrong(k, "a number"))
            })
            .transpose()
    }
    pub fn i64(&self, k: &str) -> ApiResult<Option<i64>> {
        self.get(k)
            .map(|v| {
                v.as_i64()
                    .or_else(|| v.as_f64().filter(|x| x.fract() == 0.0).map(|x| x as i64))
                    .ok_or_else(|| wrong(k, "an integer"))
            })
            .transpose()
    }
    pub fn bool(&self, k: &str) -> ApiResult<Option<bool>> {
        self.get(k)
            .map(|v| v.as_bool().ok_or_else(|| wrong(k, "true or false")))
            .transpose()
    }
    pub fn str(&self, k: &str) -> ApiResult<Option<&'a str>> {
        self.get(k)
            .map(|v| v.as_str().ok_or_else(|| wrong(k, "a string")))
            .transpose()
    }
}

/// The grammar a request constrains its output with: `grammar` (GBNF text), or
/// `json_schema` / OpenAI's `response_format` converted to a grammar, as llama-server
/// reads them (an empty schema means any object). Checked against the vocabulary here,
/// so that a bad one is a 400 before any work.
fn grammar(f: &Fields, tok: &Tokenizer) -> ApiResult<Option<String>> {
    let text = f.str("grammar")?.filter(|g| !g.is_empty());
    let mut schema = f.value("json_schema").cloned();
    if schema.is_some() && text.is_some() {
        return Err(ApiError::invalid("Cannot use both json_schema and grammar"));
    }
    if let Some(rf) = f.value("response_format") {
        let rf = Fields::of(rf).map_err(|_| wrong("response_format", "an object"))?;
        match rf.str("type")?.unwrap_or("") {
            "" | "text" => {}
            "json_object" => {
                if rf.value("schema").is_some() || schema.is_none() {
                    schema = Some(
                        rf.value("schema")
                            .cloned()
                            .unwrap_or_else(|| serde_json::json!({})),
                    );
                }
            }
            "json_schema" => {
                let wrapper = rf.value("json_schema").and_then(|w| w.get("schema"));
                schema = Some(wrapper.cloned().unwrap_or_else(|| serde_json::json!({})));
            }
            t => {
                return Err(ApiError::invalid(format!(
                    "response_format type must be one of \"text\" or \"json_object\", but got: {t}"
                )))
            }
        }
    }
    let text = match schema {
        Some(mut s) => {
            if s.as_object().is_some_and(|o| o.is_empty()) {
                s = serde_json::json!({"type": "object"});
            }
            crate::grammar::json_schema::to_grammar(&s)
                .map_err(|e| ApiError::invalid(format!("\"json_schema\": {e}")))?
        }
        None => match text {
            Some(t) => t.to_string(),
            None => return Ok(None),
        },
    };
    crate::grammar::Grammar::parse(&text, Some(tok))
        .map_err(|e| ApiError::invalid(format!("failed to parse grammar: {e}")))?;
    Ok(Some(text))
}

fn wrong(k: &str, what: &str) -> ApiError {
    ApiError::invalid(format!("\"{k}\" must be {what}"))
}

/// Reads the generation settings of a completion request (`oai`: OpenAI's names such
/// as `max_tokens` are read too).
pub fn gen_params(body: &Value, d: &Defaults, tok: &Tokenizer) -> ApiResult<GenParams> {
    let f = Fields::of(body)?;
    let mut s = d.sampling.clone();
    if let Some(v) = f.f32("temperature")? {
        s.temp = v;
    }
    if let Some(v) = f.i64("top_k")? {
        s.top_k = v.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    }
    set(&f, "top_p", &mut s.top_p)?;
    set(&f, "min_p", &mut s.min_p)?;
    set(&f, "typical_p", &mut s.typical_p)?;
    set(&f, "repeat_penalty", &mut s.repeat_penalty)?;
    set(&f, "presence_penalty", &mut s.presence_penalty)?;
    set(&f, "frequency_penalty", &mut s.frequency_penalty)?;
    set(&f, "top_n_sigma", &mut s.top_n_sigma)?;
    set(&f, "xtc_probability", &mut s.xtc_probability)?;
    set(&f, "xtc_threshold", &mut s.xtc_threshold)?;
    set(&f, "dynatemp_range", &mut s.dynatemp_range)?;
    set(&f, "dynatemp_exponent", &mut s.dynatemp_exponent)?;
    set(&f, "dry_multiplier", &mut s.dry_multiplier)?;
    if let Some(v) = f.i64("repeat_last_n")? {
        s.repeat_last_n = if v < 0 { 4096 } else { v as usize };
    }
    if let Some(v) = f.i64("min_keep")? {
        s.min_keep = v.max(0) as usize;
    }
    if let Some(seed) = f.i64("seed")? {
        s.seed = if seed < 0 {
            SamplerParams::RANDOM_SEED
        } else {
            seed as u64 & 0xFFFF_FFFF
        };
    }
    if let Some(lb) = f.value("logit_bias") {
        s.logit_bias = logit_bias(lb, tok)?;
    }
    s.grammar = grammar(&f, tok)?;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(d.ignore_eos);
    // Absent: the server's -bs, else the engine's --sampling decides (auto: the
    // tuner's measurement).
    let backend_sampling = (f.bool("backend_sampling")?).or(d.backend_sampling.then_some(true));
    if ignore_eos {
        s.banned.extend(tok.eog_tokens());
    }
    s.validate().map_err(ApiError::invalid)?;
    let mut n_predict = d.n_predict;
    let asked = match f.i64("n_predict")? {
        Some(n) => Some(n),
        None => match f.i64("max_completion_tokens")? {
            Some(n) => Some(n),
            None => f.i64("max_tokens")?,
        },
    };
    if let Some(n) = asked {
        if n < -1 {
            return Err(ApiError::invalid(format!(
                "n_predict must be -1 (no limit) or a token count, got {n}"
            )));
        }
        // The request's own limit wins, -1 included; the server's -n is only the
        // default (today's llama-server: an older one capped requests at -n).
        n_predict = n.min(i32::MAX as i64) as i32;
    }
    let mut shift = d.shift;
    if let Some(k) = f.i64("n_keep")? {
        shift.keep = k.clamp(-1, i32::MAX as i64) as i32;
    }
    let n_probs = match f.i64("n_probs")? {
        Some(n) => n.clamp(0, 100) as usize,
        None => 0,
    };
    let slot = match f.i64("id_slot")? {
        Some(n) if n >= 0 => Some(n.min(u32::MAX as i64) as u32),
        _ => None,
    };
    let stop = match f.value("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| wrong("stop", "a string or an array of strings"))?,
        Some(_) => return Err(wrong("stop", "a string or an array of strings")),
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(format!(
            "'stop' has {} strings; at most {MAX_STOP_STRINGS} are taken",
            stop.len()
        )));
    }
    if let Some(w) = stop.iter().find(|w| w.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(format!(
            "a stop string is {} bytes long; at most {MAX_STOP_BYTES} are taken",
            w.len()
        )));
    }
    let include_usage = match f.value("stream_options") {
        Some(o) => Fields::of(o)?.bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    Ok(GenParams {
        request: Request {
            prompt: Vec::new(),
            images: Vec::new(),
            params: SessionParams {
                sampling: s,
                n_predict,
                shift,
                prompt_cache: None,
                n_probs,
                post_sampling_probs: f.bool("post_sampling_probs")?.unwrap_or(false),
                gpu_draws: backend_sampling,
                // Today's llama-server ignores a request's `speculative.*`: the server's
                // flags decide.
                speculative: None,
                // An empty list is no setting of its own, as in llama-server.
                lora: match f.value("lora") {
                    Some(Value::Array(a)) if a.is_empty() => None,
                    Some(v) => Some(lora_scales(v, d.n_lora, "lora")?),
                    None => None,
                },
            },
            cache_prompt: f.bool("cache_prompt")?.unwrap_or(true),
            slot,
            stop,
            n_indent: match f.i64("n_indent")? {
                None => 0,
                Some(n) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
            },
        },
        stream: f.bool("stream")?.unwrap_or(false),
        n_probs,
        return_tokens: f.bool("return_tokens")?.unwrap_or(false),
        include_usage,
        show_top: true,
        ignore_eos,
        response_fields: match f.value("response_fields") {
            None => None,
            Some(Value::Array(a)) if a.is_empty() => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|v| v.as_str().map(String::from))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| wrong("response_fields", "an array of strings"))?,
            ),
            Some(_) => return Err(wrong("response_fields", "an array of strings")),
        },
    })
}

fn set(f: &Fields, k: &str, out: &mut f32) -> ApiResult<()> {
    if let Some(v) = f.f32(k)? {
        *out = v;
    }
    Ok(())
}

/// llama-server's `logit_bias`: `[[token or text, bias or false], ...]`, or OpenAI's
/// `{"token id": bias}`. A text applies to each of its tokens; `false` bans.
fn logit_bias(v: &Value, tok: &Tokenizer) -> ApiResult<Vec<(u32, f32)>> {
    let n_vocab = tok.n_vocab() as i64;
    let bias = |b: &Value| -> ApiResult<f32> {
        match b {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            b => b
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| wrong("logit_bias", "pairs of a token and a number or false")),
        }
    };
    let id = |t: i64| -> ApiResult<u32> {
        if (0..n_vocab).contains(&t) {
            Ok(t as u32)
        } else {
            Err(ApiError::invalid(format!(
                "logit_bias: token {t} is out of the vocabulary (0..{n_vocab})"
            )))
        }
    };
    let mut out = Vec::new();
    match v {
        Value::Array(pairs) => {
            for p in pairs {
                let Some([t, b]) = p
                    .as_array()
                    .and_then(|a| <&[Value; 2]>::try_from(a.as_slice()).ok())
                else {
                    return Err(wrong(
                        "logit_bias",
                        "pairs of a token and a number or false",
                    ));
                };
                let b = bias(b)?;
                match t {
                    Value::String(text) => out.extend(
                        super::budget::encode(tok, text, false, false)?
                            .into_iter()
                            .map(|t| (t, b)),
                    ),
                    t => out.push((
                        id(t.as_i64().ok_or_else(|| {
                            wrong("logit_bias", "pairs of a token and a number or false")
                        })?)?,
                        b,
                    )),
                }
            }
        }
        Value::Object(m) => {
            // A key is a token id, or text whose tokens all get the bias (llama-server's
            // reading of OpenAI's map).
            for (k, b) in m {
                let b = bias(b)?;
                match k.parse::<i64>() {
                    Ok(t) => out.push((id(t)?, b)),
                    Err(_) => out.extend(
                        super::budget::encode(tok, k, false, false)?
                            .into_iter()
                            .map(|t| (t, b)),
                    ),
                }
            }
        }
        _ => return Err(wrong("logit_bias", "an array of pairs or an object")),
    }
    Ok(out)
}

/// The parts of a prompt that may be a list: its items, or the value itself.
pub fn pieces(v: &Value) -> std::slice::Iter<'_, Value> {
    match v {
        Value::Array(items) => items.iter(),
        p => std::slice::from_ref(p).iter(),
    }
}

/// A token id given in a request (`place` says where), checked against the vocabulary.
pub fn token_id(n: &serde_json::Number, n_vocab: u64, place: &str) -> ApiResult<u32> {
    n.as_u64()
        .filter(|&t| t < n_vocab)
        .map(|t| t as u32)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "invalid token {n} in {place} (the vocabulary has {n_vocab} tokens)"
            ))
        })
}

/// A prompt as llama-server takes it: a string, token ids, or a list mixing both
/// (strings tokenized without BOS after the first piece). BOS is added where the model
/// wants one (`add_special`).
pub fn prompt_tokens(v: &Value, tok: &Tokenizer, add_special: bool) -> ApiResult<Vec<u32>> {
    let n_vocab = tok.n_vocab() as u64;
    let mut out = Vec::new();
    let mut first = true;
    let mut piece = |p: &Value, out: &mut Vec<u32>| -> ApiResult<()> {
        match p {
            Value::Object(o) => {
                if o.contains_key("multimodal_data") {
                    return Err(ApiError::invalid(
                        "Multimodal data provided, but this request does not take it: images go in /completion and chat requests to a server started with --mmproj",
                    ));
                }
                let text = match (o.get("prompt_string"), o.get("content")) {
                    (Some(Value::String(s)), _) => s.clone(),
                    (None, Some(parts)) => content_text(parts)?,
                    _ => {
                        return Err(ApiError::invalid(
                            "a prompt object needs \"prompt_string\" or \"content\" parts",
                        ))
                    }
                };
                out.extend(super::budget::encode(
                    tok,
                    &text,
                    add_special && first,
                    true,
                )?);
            }
            Value::String(s) => {
                out.extend(super::budget::encode(tok, s, add_special && first, true)?);
            }
            Value::Number(n) => out.push(token_id(n, n_vocab, "the prompt")?),
            _ => {
                return Err(ApiError::invalid(
                    "a prompt is a string, token ids, or a list mixing both",
                ))
            }
        }
        first = false;
        Ok(())
    };
    for p in pieces(v) {
        piece(p, &mut out)?;
    }
    Ok(out)
}

/// A prompt object with images (`{"prompt_string": ..., "multimodal_data": [base64,
/// ...]}`, the server's media marker where each goes), read as llama-server reads it;
/// `None` for any other prompt.
fn media_prompt(
    v: &Value,
    tok: &Tokenizer,
    input: &super::media::ImageInput,
) -> ApiResult<Option<crate::engine::MediaPrompt>> {
    let Some(data) = v.as_object().and_then(|o| o.get("multimodal_data")) else {
        return Ok(None);
    };
    let Some(Value::String(text)) = v.get("prompt_string") else {
        return Err(ApiError::invalid(
            "a prompt with \"multimodal_data\" needs its text in \"prompt_string\"",
        ));
    };
    let Value::Array(items) = data else {
        return Err(ApiError::invalid(
            "\"multimodal_data\" is a list of base64 strings",
        ));
    };
    let files = (items.iter())
        .map(|d| match d {
            Value::String(s) => super::media::base64_bytes(s),
            _ => Err(ApiError::invalid(
                "\"multimodal_data\" is a list of base64 strings",
            )),
        })
        .collect::<ApiResult<Vec<_>>>()?;
    if files.is_empty() {
        return Err(ApiError::invalid("\"multimodal_data\" is empty"));
    }
    input.prompt(tok, text, &files, true).map(Some)
}

/// The text of a prompt object's `content`: its text parts joined (OpenAI's content
/// parts; other kinds need a multimodal model).
fn content_text(parts: &Value) -> ApiResult<String> {
    let Value::Array(parts) = parts else {
        return Err(ApiError::invalid(
            "\"content\" is a list of parts ({\"type\": \"text\", \"text\": ...})",
        ));
    };
    let mut text = String::new();
    for p in parts {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some("image_url" | "input_audio" | "input_video"), _) => {
                return Err(ApiError::invalid(
                    "only text parts are taken here: images go in /completion and chat requests to a server started with --mmproj",
                ))
            }
            (Some("text"), _) => {
                return Err(ApiError::invalid("a text part needs \"text\" as a string"))
            }
            (kind, _) => {
                return Err(ApiError::invalid(format!(
                    "unknown content part type {}",
                    kind.map_or("(none)".to_string(), |k| format!("\"{k}\""))
                )))
            }
        }
    }
    Ok(text)
}

/// The requests of a completion body: one per prompt (see [`prompts`]), each with the
/// body's settings; an empty prompt is refused.
pub fn completion_requests(
    body: &Value,
    p: &GenParams,
    tok: &Tokenizer,
    input: &super::media::ImageInput,
) -> ApiResult<Vec<Request>> {
    let prompt = Fields::of(body)?
        .value("prompt")
        .ok_or_else(|| ApiError::invalid("\"prompt\" is required"))?;
    let prompts = prompts(prompt);
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(format!(
            "the request has {} prompts; at most {MAX_PROMPTS} are taken in one request",
            prompts.len()
        )));
    }
    // Each prompt's request carries a copy of the settings: bound what they add up to.
    let sp = &p.request.params.sampling;
    let settings_bytes = sp.grammar.as_ref().map_or(0, String::len)
        + 8 * (sp.logit_bias.len() + sp.banned.len())
        + 1024;
    if prompts.len().saturating_mul(settings_bytes) > MAX_COPIED_SETTINGS {
        return Err(ApiError::invalid(format!(
            "{} prompts with these settings ({settings_bytes} bytes of grammar and biases each) add up to more than {} MiB; send fewer prompts per request",
            prompts.len(),
            MAX_COPIED_SETTINGS >> 20
        )));
    }
    let reqs = prompts
        .into_iter()
        .map(|pr| {
            let mut r = p.request.clone();
            match media_prompt(pr, tok, input)? {
                Some(m) => (r.prompt, r.images) = (m.tokens, m.images),
                None => r.prompt = prompt_tokens(pr, tok, true)?,
            }
            if r.prompt.is_empty() {
                return Err(ApiError::invalid("empty prompt: the input has no tokens"));
            }
            Ok(r)
        })
        .collect::<ApiResult<Vec<_>>>()?;
    if p.stream && reqs.len() > 1 {
        return Err(ApiError::invalid("streaming takes one prompt"));
    }
    Ok(reqs)
}

/// Refuses completions whose replies, not streamed, could not be held within the
/// request budget ([`super::budget::check_generation`]); a stream is never built whole.
pub fn check_replies(reqs: &[Request], p: &GenParams, n_ctx_slot: u32) -> ApiResult<()> {
    if p.stream {
        return Ok(());
    }
    let n_min = reqs.iter().map(|r| r.prompt.len()).min().unwrap_or(0);
    let n_predict = p.request.params.n_predict;
    super::budget::check_generation(reqs.len(), n_predict, p.n_probs, n_ctx_slot, n_min)
}

/// The prompts of a request: one, or several (a list whose items are strings or token
/// lists, each a prompt of its own).
pub fn prompts(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(items)
            if items.len() > 1
                && items
                    .iter()
                    .all(|i| i.is_string() || i.is_array() || i.is_object()) =>
        {
            items.iter().collect()
        }
        Value::Array(items)
            if items.len() == 1 && (items[0].is_array() || items[0].is_object()) =>
        {
            vec![&items[0]]
        }
        v => vec![v],
    }
}

#[cfg(test)]
mod tests {
    use super::prompts;
    use serde_json::json;

    #[test]
    fn one_prompt_or_several_as_llama_server_reads_them() {
        let n = |v: serde_json::Value| prompts(&v).len();
        assert_eq!(n(json!("text")), 1);
        assert_eq!(n(json!([1, 2, 3])), 1);
        assert_eq!(n(json!([1, "mixed", 3])), 1);
        assert_eq!(n(json!(["a"])), 1);
        assert_eq!(n(json!([[1, 2]])), 1);
        assert_eq!(n(json!(["a", "b"])), 2);
        assert_eq!(n(json!([[1, 2], "b", {"prompt_string": "c"}])), 3);
    }
}
