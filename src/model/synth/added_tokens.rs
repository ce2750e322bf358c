//! A model with tokens added to its vocabulary, as a fine-tune that adds special tokens
//! makes one (SmolVLM's language model is SmolLM2 with its image tokens added): every key
//! and tensor copied, the new tokens appended as control tokens, and the token embedding
//! (and an output head of its own) given a random row for each, of the size of the
//! model's own rows. The model's text behaviour is unchanged; the new rows only matter
//! where a prompt holds the new tokens.

use super::Rng;
use crate::gguf::{GgufFile, GgufWriter, Value};
use crate::quant::{self, quantize_row};

/// The tokens SmolVLM adds to SmolLM2's vocabulary: those llama.cpp's mtmd places
/// around an image's tiles, and the chat's end of turn.
pub fn smolvlm_tokens() -> Vec<String> {
    let mut v: Vec<String> = [
        "<fake_token_around_image>",
        "<image>",
        "<end_of_utterance>",
        "<global-img>",
    ]
    .map(String::from)
    .to_vec();
    for r in 1..=6 {
        for c in 1..=6 {
            v.push(format!("<row_{r}_col_{c}>"));
        }
    }
    v
}

/// `src` with `tokens` added (control tokens, in order, after its last); refuses a token
/// the vocabulary has already, and a file whose embedding rows it cannot extend.
pub fn with_added_tokens(src: &GgufFile, tokens: &[String]) -> Result<GgufWriter, String> {
    with_added_tokens_of_type(src, tokens, CONTROL)
}

/// llama.cpp's token types: control tokens are matched in text only where special tokens
/// are parsed and never printed; user-defined ones (Qwen 3's `<think>`) are always
/// matched and printed.
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;

/// [`with_added_tokens`] with the added tokens of `token_type`.
pub fn with_added_tokens_of_type(
    src: &GgufFile,
    tokens: &[String],
    token_type: i32,
) -> Result<GgufWriter, String> {
    let arch = src.architecture().map_err(|e| e.to_string())?.to_string();
    let old = src
        .get_array("tokenizer.ggml.tokens")
        .map_err(|e| e.to_string())?;
    let n_old = old.len() as u64;
    for (i, t) in tokens.iter().enumerate() {
        if t.is_empty() {
            return Err("an empty token cannot be added".into());
        }
        if tokens[..i].contains(t) {
            return Err(format!("{t} is listed twice"));
        }
        if old.iter().any(|v| v.as_str() == Some(t)) {
            return Err(format!("{}: the vocabulary has {t} already", src.path));
        }
    }
    let n_new = n_old + tokens.len() as u64;
    let mut w = GgufWriter::new();
    for (k, v) in &src.metadata {
        let v = match k.as_str() {
            "general.alignment" => continue,
            "tokenizer.ggml.tokens" => {
                let mut a = old.to_vec();
                a.extend(tokens.iter().map(|t| Value::String(t.clone())));
                Value::Array(a)
            }
            "tokenizer.ggml.token_type" => {
                let mut a = v.as_array().unwrap_or_default().to_vec();
                // The array's own element type.
                let ty = match a.first() {
                    Some(Value::U32(_)) => Value::U32(token_type as u32),
                    _ => Value::I32(token_type),
                };
                a.extend(std::iter::repeat_n(ty, tokens.len()));
                Value::Array(a)
            }
            // A SentencePiece vocabulary's scores: the added tokens score 0.
            "tokenizer.ggml.scores" => {
                let mut a = v.as_array().unwrap_or_default().to_vec();
                a.extend(std::iter::repeat_n(Value::F32(0.0), tokens.len()));
                Value::Array(a)
            }
            key if key == format!("{arch}.vocab_size") => Value::U32(n_new as u32),
            _ => v.clone(),
        };
        w.meta(k, v);
    }
    let mut rng = Rng(0x70c3);
    for t in &src.tensors {
        let data = src.tensor_data(t).to_vec();
        let vocab_rows = matches!(t.name.as_str(), "token_embd.weight" | "output.weight")
            && t.dims.len() == 2
            && t.dims[1] == n_old;
        if !vocab_rows {
            w.tensor(&t.name, &t.dims, t.ty, data);
            continue;
        }
        let cols = t.dims[0] as usize;
        let row_bytes = t.ty.row_bytes(cols as u64).ok_or_else(|| {
            format!(
                "{}: {} has type {}, whose rows cannot be added to",
                src.path, t.name, t.ty
            )
        })? as usize;
        if quant::format(t.ty).is_none() {
            return Err(format!(
                "{}: {} has type {}, which wgllm does not write",
                src.path, t.name, t.ty
            ));
        }
        // The new rows as large as the first rows of the model's own (their RMS).
        let mut row = vec![0f32; cols];
        let mut sq = 0f64;
        let n_probe = n_old.min(64) as usize;
        for r in 0..n_probe {
            quant::dequantize_row(t.ty, &data[r * row_bytes..(r + 1) * row_bytes], &mut row);
            sq += row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>();
        }
        let rms = (sq / (n_probe * cols) as f64).sqrt() as f32;
        let mut data = data;
        for _ in tokens {
            // normalish has a deviation of 1/sqrt(3).
            let v: Vec<f32> = (0..cols)
                .map(|_| rng.normalish() * rms * 3f32.sqrt())
                .collect();
            data.extend(quantize_row(t.ty, &v));
        }
        w.tensor(&t.name, &[t.dims[0], n_new], t.ty, data);
    }
    Ok(w)
}
