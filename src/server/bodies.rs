//! Every endpoint's body that is more than a name read as its handler reads it (the
//! same functions, the request budget's checks included), with no engine behind: into
//! the requests it queues (generation, /rerank, /infill), the inputs it embeds, or the
//! reply it gets (/tokenize, /detokenize). What the request-body fuzz target runs (and
//! its regression inputs in the tests), so that no body can panic, hang or exhaust the
//! server before the engine sees it.

use super::chat::ChatRequest;
use super::media::ImageInput;
use super::params::{self, Defaults};
use super::wire::body_json;
use super::{anthropic, openai, responses};
use crate::engine::service::Request;
use crate::grammar::Grammar;
use crate::tokenizer::Tokenizer;
use axum::body::Bytes;

/// The endpoints whose bodies become generation requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/completion`, `/completions`.
    Completion,
    /// `/v1/completions`.
    OpenAiCompletion,
    /// `/v1/chat/completions`, `/chat/completions/input_tokens`, `/apply-template`.
    Chat,
    /// `/v1/messages`, `/v1/messages/count_tokens`.
    Anthropic,
    /// `/v1/responses`, `/v1/responses/input_tokens`.
    Responses,
    /// `/rerank` and its aliases: a request per document.
    Rerank,
    /// `/tokenize`: one request of the tokens (its reply written out too).
    Tokenize,
    /// `/detokenize`: no request (the text is made).
    Detokenize,
    /// `/embedding(s)` and `/v1/embeddings` (read as OpenAI's): a request per input.
    Embeddings,
    /// `/infill`: the prompt laid out (with the model's FIM tokens), then a completion.
    Infill,
}

impl Endpoint {
    /// In the order the fuzz target's first byte picks them (new ones go last, so
    /// recorded inputs keep their endpoint).
    pub const ALL: [Endpoint; 10] = [
        Endpoint::Completion,
        Endpoint::OpenAiCompletion,
        Endpoint::Chat,
        Endpoint::Anthropic,
        Endpoint::Responses,
        Endpoint::Rerank,
        Endpoint::Tokenize,
        Endpoint::Detokenize,
        Endpoint::Embeddings,
        Endpoint::Infill,
    ];
}

/// The embedding width /embeddings' replies are bounded with here (a server's own is
/// its model's).
const EMBED_WIDTH: u32 = 1024;

/// The slot context /rerank's prompts are bounded by here (a server's own is its
/// `-c / -np`).
const RERANK_SLOT_TOKENS: usize = 4096;

/// The server's defaults when no flag changes them.
pub fn default_settings() -> Defaults {
    Defaults {
        sampling: Default::default(),
        n_predict: -1,
        shift: Default::default(),
        ignore_eos: false,
        backend_sampling: false,
        n_lora: 0,
        reasoning: Default::default(),
    }
}

/// The requests `body` queues at `endpoint`, each grammar parsed as the engine parses it;
/// the error text the client would get otherwise.
pub fn requests(
    endpoint: Endpoint,
    body: &[u8],
    tok: &Tokenizer,
    d: &Defaults,
) -> Result<Vec<Request>, String> {
    let reqs = read(endpoint, &Bytes::copy_from_slice(body), tok, d).map_err(|e| e.message)?;
    for r in &reqs {
        if let Some(g) = &r.params.sampling.grammar {
            Grammar::parse(g, Some(tok)).map_err(|e| e.to_string())?;
        }
    }
    Ok(reqs)
}

fn read(
    endpoint: Endpoint,
    body: &Bytes,
    tok: &Tokenizer,
    d: &Defaults,
) -> super::error::ApiResult<Vec<Request>> {
    let body = body_json(body)?;
    Ok(match endpoint {
        Endpoint::Completion => {
            let p = params::gen_params(&body, d, tok)?;
            params::completion_requests(&body, &p, tok, &ImageInput::default())?
        }
        Endpoint::OpenAiCompletion => {
            let mut p = params::gen_params(&body, d, tok)?;
            openai::oai_n_probs(&body, &mut p, false)?;
            params::completion_requests(&body, &p, tok, &ImageInput::default())?
        }
        Endpoint::Chat => {
            let mut p = params::gen_params(&body, d, tok)?;
            openai::oai_n_probs(&body, &mut p, true)?;
            vec![
                ChatRequest::request(&body, &p.request, tok, &ImageInput::default(), &d.reasoning)?
                    .1,
            ]
        }
        Endpoint::Anthropic => {
            let body = anthropic::as_chat(&body)?;
            let p = params::gen_params(&body, d, tok)?;
            vec![
                ChatRequest::request(&body, &p.request, tok, &ImageInput::default(), &d.reasoning)?
                    .1,
            ]
        }
        Endpoint::Responses => {
            let body = responses::as_chat(&body)?;
            let p = params::gen_params(&body, d, tok)?;
            let mut req = p.request.clone();
            req.prompt =
                openai::chat_prompt(&body, tok, &ImageInput::default(), &d.reasoning)?.tokens;
            vec![req]
        }
        Endpoint::Rerank => {
            as_requests(super::rerank::RerankRequest::read(&body, tok, RERANK_SLOT_TOKENS)?.prompts)
        }
        Endpoint::Tokenize => as_requests(vec![super::native::tokenize_reply(&body, tok)?.1]),
        Endpoint::Detokenize => {
            super::native::detokenize_text(&body, tok)?;
            Vec::new()
        }
        Endpoint::Embeddings => {
            let pooling = crate::engine::Pooling::Mean;
            as_requests(super::embeddings::read(&body, tok, true, pooling, EMBED_WIDTH)?.inputs)
        }
        Endpoint::Infill => {
            let lim = crate::tokenizer::InfillLimits {
                n_batch: 2048,
                n_predict: -1,
                n_ctx: RERANK_SLOT_TOKENS as u32,
                spm: false,
            };
            let body = super::infill::read(body, tok, lim)?;
            let p = params::gen_params(&body, d, tok)?;
            params::completion_requests(&body, &p, tok, &ImageInput::default())?
        }
    })
}

/// Token lists as requests of default settings.
fn as_requests(prompts: Vec<Vec<u32>>) -> Vec<Request> {
    (prompts.into_iter())
        .map(|prompt| Request {
            prompt,
            ..Default::default()
        })
        .collect()
}
