//! Building a [`Tokenizer`] from GGUF metadata with llama.cpp's defaults and fix-ups:
//! per-model default special ids and BOS/EOS flags, metadata overrides, and detection
//! of end-of-turn / end-of-generation tokens by their text.

use std::collections::{BTreeSet, HashMap};

use crate::gguf::Value;

use super::{attr, bpe, pre, wpm, Fim, Kind, TokenData, Tokenizer, TokenizerError};

type Get<'a, 'v> = &'a dyn Fn(&str) -> Option<&'v Value>;

const K_MODEL: &str = "tokenizer.ggml.model";
const K_PRE: &str = "tokenizer.ggml.pre";
const K_TOKENS: &str = "tokenizer.ggml.tokens";
const K_SCORES: &str = "tokenizer.ggml.scores";
const K_TYPES: &str = "tokenizer.ggml.token_type";
const K_MERGES: &str = "tokenizer.ggml.merges";

/// Token texts llama.cpp takes as end-of-turn when no `eot_token_id` is given.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Token texts that end generation wherever they appear in the vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
];

/// Fill-in-the-middle token texts (pre, suf, mid, pad, rep, sep); pad/rep/sep end
/// generation, and all are treated as control tokens.
const FIM_TEXTS: [(&str, &[&str]); 6] = [
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_pad_token_id",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

fn force_control(tokens: &mut [TokenData], id: u32) {
    let t = &mut tokens[id as usize];
    if t.attr & attr::CONTROL == 0 {
        log::debug!(
            "token {id} {:?} looks like a control token; treating it as one",
            t.text
        );
        t.attr |= attr::CONTROL;
    }
}

fn bad_type(key: &str, expected: &'static str, v: &Value) -> TokenizerError {
    TokenizerError::BadType {
        key: key.to_string(),
        expected,
        found: v.type_name(),
    }
}

fn opt_str<'v>(get: Get<'_, 'v>, key: &str) -> Result<Option<&'v str>, TokenizerError> {
    get(key)
        .map(|v| v.as_str().ok_or_else(|| bad_type(key, "a string", v)))
        .transpose()
}

fn opt_bool(get: Get<'_, '_>, key: &str) -> Result<Option<bool>, TokenizerError> {
    get(key)
        .map(|v| v.as_bool().ok_or_else(|| bad_type(key, "a bool", v)))
        .transpose()
}

fn opt_id(get: Get<'_, '_>, key: &str) -> Result<Option<i64>, TokenizerError> {
    get(key)
        .map(|v| v.as_i64().ok_or_else(|| bad_type(key, "an integer", v)))
        .transpose()
}

fn opt_array<'v>(get: Get<'_, 'v>, key: &str) -> Result<Option<&'v [Value]>, TokenizerError> {
    get(key)
        .map(|v| v.as_array().ok_or_else(|| bad_type(key, "an array", v)))
        .transpose()
}

fn str_array<'v>(key: &str, arr: &'v [Value]) -> Result<Vec<&'v str>, TokenizerError> {
    arr.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| bad_type(key, "an array of strings", v))
        })
        .collect()
}

/// A special id from metadata, falling back to `default`; ids outside the vocabulary
/// are ignored (with a warning), as llama.cpp does.
fn special_id(
    get: Get<'_, '_>,
    key: &str,
    default: Option<u32>,
    n: usize,
) -> Result<Option<u32>, TokenizerError> {
    let default = default.filter(|&d| (d as usize) < n);
    Ok(match opt_id(get, key)? {
        None => default,
        Some(id) if id >= 0 && (id as usize) < n => Some(id as u32),
        Some(id) => {
            log::warn!("{key} = {id} is outside the vocabulary ({n} tokens); using {default:?}");
            default
        }
    })
}

pub(super) fn build(get: Get<'_, '_>) -> Result<Tokenizer, TokenizerError> {
    let model = opt_str(get, K_MODEL)?.ok_or_else(|| TokenizerError::MissingKey(K_MODEL.into()))?;
    let pre = opt_str(get, K_PRE)?.unwrap_or("");

    let words =
        opt_array(get, K_TOKENS)?.ok_or_else(|| TokenizerError::MissingKey(K_TOKENS.into()))?;
    let words = str_array(K_TOKENS, words)?;
    let n = words.len();
    if n == 0 {
        return Err(TokenizerError::Invalid(format!("{K_TOKENS} is empty")));
    }

    // Per-model defaults, before metadata overrides.
    let bpe = |pre: &str| -> Result<(bpe::Bpe, pre::PreTokenizer), TokenizerError> {
        let p = pre::lookup(pre)?;
        let merges =
            opt_array(get, K_MERGES)?.ok_or_else(|| TokenizerError::MissingKey(K_MERGES.into()))?;
        Ok((bpe::Bpe::new(p, &str_array(K_MERGES, merges)?)?, p))
    };
    let mut sep = None;
    let (kind, mut bos, mut eos, mut unk, mut add_bos, mut add_space_prefix, clean_spaces) =
        match model {
            "llama" => (Kind::Spm, Some(1), Some(2), Some(0), true, true, false),
            "gpt2" => {
                let (b, p) = bpe(pre)?;
                (
                    Kind::Bpe(b),
                    Some(11),
                    Some(11),
                    None,
                    p.add_bos,
                    false,
                    p.clean_spaces,
                )
            }
            // SentencePiece-style BPE: the pre-tokenizer is implied by the model.
            "gemma4" => {
                let (b, p) = bpe("gemma4")?;
                (
                    Kind::Bpe(b),
                    None,
                    None,
                    None,
                    p.add_bos,
                    false,
                    p.clean_spaces,
                )
            }
            "bert" => {
                // Uncased BERT unless the file says otherwise; accents go with case.
                let lowercase =
                    opt_bool(get, "tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
                let strip_accents =
                    opt_bool(get, "tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);
                let w = wpm::Wpm {
                    lowercase,
                    strip_accents,
                    max_token_len: words.iter().map(|w| w.len()).max().unwrap_or(0),
                };
                sep = Some(102);
                (Kind::Wpm(w), Some(101), None, Some(100), true, false, true)
            }
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };
    if let Some(v) = opt_bool(get, "tokenizer.ggml.add_space_prefix")? {
        add_space_prefix = v;
    }
    let scores: Option<Vec<f32>> = match opt_array(get, K_SCORES)? {
        None => None,
        Some(a) if a.len() < n => {
            return Err(TokenizerError::Invalid(format!(
                "{K_SCORES} has {} entries for {n} tokens",
                a.len()
            )));
        }
        Some(a) => Some(
            a.iter()
                .map(|v| {
                    v.as_f64()
                        .map(|f| f as f32)
                        .ok_or_else(|| bad_type(K_SCORES, "an array of numbers", v))
                })
                .collect::<Result<_, _>>()?,
        ),
    };
    let types: Option<Vec<i64>> = match opt_array(get, K_TYPES)? {
        None => None,
        Some(a) if a.len() < n => {
            return Err(TokenizerError::Invalid(format!(
                "{K_TYPES} has {} entries for {n} tokens",
                a.len()
            )));
        }
        Some(a) => Some(
            a.iter()
                .map(|v| {
                    v.as_i64()
                        .ok_or_else(|| bad_type(K_TYPES, "an array of integers", v))
                })
                .collect::<Result<_, _>>()?,
        ),
    };

    let mut tokens = Vec::with_capacity(n);
    let mut lookup = HashMap::with_capacity(n);
    for (i, w) in words.iter().enumerate() {
        let text = if w.is_empty() {
            log::warn!("empty token at index {i}");
            format!("[EMPTY_{i}]")
        } else {
            w.to_string()
        };
        if let Some(prev) = lookup.insert(text.clone(), i as u32) {
            return Err(TokenizerError::Invalid(format!(
                "duplicate token {text:?} at ids {prev} and {i}"
            )));
        }
        tokens.push(TokenData {
            text,
            score: scores.as_ref().map_or(0.0, |s| s[i]),
            attr: types
                .as_ref()
                .map_or(attr::NORMAL, |t| attr::from_gguf_type(t[i])),
        });
    }

    bos = special_id(get, "tokenizer.ggml.bos_token_id", bos, n)?;
    eos = special_id(get, "tokenizer.ggml.eos_token_id", eos, n)?;
    unk = special_id(get, "tokenizer.ggml.unknown_token_id", unk, n)?;
    sep = special_id(get, "tokenizer.ggml.seperator_token_id", sep, n)?;
    let mut eot = special_id(get, "tokenizer.ggml.eot_token_id", None, n)?;
    let mut eom = special_id(get, "tokenizer.ggml.eom_token_id", None, n)?;
    let pad = special_id(get, "tokenizer.ggml.padding_token_id", None, n)?;
    let mut fim = [None; 6];
    for (slot, (key, _)) in fim.iter_mut().zip(FIM_TEXTS) {
        *slot = special_id(get, key, None, n)?;
    }

    if let Some(v) = opt_bool(get, "tokenizer.ggml.add_bos_token")? {
        add_bos = v;
    }
    let add_eos = opt_bool(get, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    if add_bos && bos.is_none() {
        return Err(TokenizerError::Invalid(
            "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"
                .into(),
        ));
    }
    if add_eos && eos.is_none() {
        return Err(TokenizerError::Invalid(
            "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set"
                .into(),
        ));
    }

    // Find end-of-turn, end-of-message and FIM tokens by text; whatever is found this
    // way is forced to be a control token, so it is hidden in generated text.
    for id in 0..n as u32 {
        let text = tokens[id as usize].text.as_str();
        if eot.is_none() && EOT_TEXTS.contains(&text) {
            eot = Some(id);
            force_control(&mut tokens, id);
        }
        let text = tokens[id as usize].text.as_str();
        if eom.is_none() && text == "<|eom_id|>" {
            eom = Some(id);
            force_control(&mut tokens, id);
        }
        for (slot, (_, texts)) in fim.iter_mut().zip(FIM_TEXTS) {
            if slot.is_none() && texts.contains(&tokens[id as usize].text.as_str()) {
                *slot = Some(id);
                force_control(&mut tokens, id);
            }
        }
    }

    let mut eog: BTreeSet<u32> = fim[3..].iter().flatten().copied().collect();
    for id in 0..n as u32 {
        if EOG_TEXTS.contains(&tokens[id as usize].text.as_str()) {
            eog.insert(id);
            force_control(&mut tokens, id);
        }
    }
    eog.extend(eos);
    eog.extend(eot);
    eog.extend(eom);

    // Per-model strip attributes (Phi-3 eats the whitespace after its special tokens).
    let name = opt_str(get, "general.name")?.unwrap_or("").to_lowercase();
    let is_special =
        |t: &TokenData| t.attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0;
    if name.contains("phi-3") || name.contains("phi3") {
        for t in tokens
            .iter_mut()
            .filter(|t| is_special(t) || t.text == "</s>")
        {
            t.attr |= attr::RSTRIP;
        }
        for t in tokens
            .iter_mut()
            .filter(|t| ["<unk>", "<s>", "<|endoftext|>"].contains(&t.text.as_str()))
        {
            t.attr &= !attr::RSTRIP;
        }
    }

    let mut special_order: Vec<u32> = (0..n as u32)
        .filter(|&i| is_special(&tokens[i as usize]))
        .collect();
    special_order.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].text.len()));

    let chat_template = opt_str(get, "tokenizer.chat_template")?.map(str::to_string);
    // A reranker's layout of query and document (Qwen3-Reranker's converter writes it).
    let rerank_template = opt_str(get, "tokenizer.chat_template.rerank")?.map(str::to_string);

    log::debug!(
        "tokenizer: model {model}, pre {pre:?}, {n} tokens, bos {bos:?}, eos {eos:?}, eot {eot:?}, eog {eog:?}, \
         add_bos {add_bos}, add_eos {add_eos}, {} special tokens",
        special_order.len()
    );

    Ok(Tokenizer {
        kind,
        model: model.to_string(),
        pre: pre.to_string(),
        tokens,
        lookup,
        special_order,
        bos,
        eos,
        eot,
        sep,
        unk,
        pad,
        add_bos,
        add_eos,
        add_space_prefix,
        clean_spaces,
        eog,
        fim: Fim {
            pre: fim[0],
            suf: fim[1],
            mid: fim[2],
            pad: fim[3],
            rep: fim[4],
            sep: fim[5],
        },
        chat_template,
        rerank_template,
    })
}
