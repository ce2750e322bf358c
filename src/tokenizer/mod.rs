//! Text ↔ token ids, reproducing llama.cpp's tokenizer for the GGUF vocabularies
//! wgllm runs: byte-level BPE (`tokenizer.ggml.model = "gpt2"`, e.g. SmolLM2, Llama 3,
//! Qwen), SentencePiece BPE (`"llama"`, e.g. Gemma-3, Phi-3), SentencePiece-style BPE
//! over raw UTF-8 (`"gemma4"`) and WordPiece (`"bert"`).
//!
//! The token ids must match llama.cpp exactly, since the reference outputs (and users'
//! expectations) are keyed on them; so metadata defaults, special-token handling and
//! end-of-generation detection follow llama.cpp's rules rather than Hugging Face's.

mod bpe;
mod infill;
mod jinja_limits;
mod load;
pub mod pre;
mod pyjinja;
pub mod reasoning;
mod rerank;
mod special;
mod spm;
pub mod template;
mod wpm;

#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};

use crate::gguf::GgufFile;

pub use infill::{infill_prompt, infill_unsupported, InfillFile, InfillLimits, InfillParts};
use special::Fragment;
pub use template::{
    apply_chat_template, builtin_template, knows_tools, render_chat_template, ChatMessage,
    TemplateError, TemplateOptions, BUILTIN_TEMPLATES, CHATML, GEMMA,
};

/// Why a model's tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata key `{0}` is missing from the model file")]
    MissingKey(String),
    #[error("tokenizer metadata key `{key}` should be {expected}, found {found}")]
    BadType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error(
        "unsupported tokenizer model `{0}` (tokenizer.ggml.model); wgllm supports \"llama\" \
         (SentencePiece), \"gpt2\" (byte-level BPE), \"gemma4\" (SentencePiece-style BPE) \
         and \"bert\" (WordPiece)"
    )]
    UnknownModel(String),
    #[error(
        "unsupported pre-tokenizer `{name}` (tokenizer.ggml.pre): its text split is unknown \
         to wgllm, and a wrong split gives wrong token ids; supported: {supported}"
    )]
    UnknownPre { name: String, supported: String },
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    #[error("pre-tokenizer regex does not compile: {0}")]
    Regex(String),
}

/// Token attribute bits (llama.cpp's token types, plus strip flags and forced control).
pub(crate) mod attr {
    pub const NORMAL: u32 = 1 << 0;
    pub const UNKNOWN: u32 = 1 << 1;
    pub const CONTROL: u32 = 1 << 2;
    pub const USER_DEFINED: u32 = 1 << 3;
    pub const UNUSED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    /// Swallow ASCII whitespace before the token when parsing text.
    pub const LSTRIP: u32 = 1 << 6;
    /// Swallow ASCII whitespace after the token when parsing text.
    pub const RSTRIP: u32 = 1 << 7;

    /// From GGUF `tokenizer.ggml.token_type` (0 undefined, 1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte).
    pub fn from_gguf_type(t: i64) -> u32 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct TokenData {
    pub text: String,
    pub score: f32,
    pub attr: u32,
}

#[derive(Clone)]
enum Kind {
    Bpe(bpe::Bpe),
    Spm,
    Wpm(wpm::Wpm),
}

/// A model's vocabulary and tokenizer, built from GGUF metadata.
#[derive(Clone)]
pub struct Tokenizer {
    kind: Kind,
    model: String,
    pre: String,
    tokens: Vec<TokenData>,
    lookup: HashMap<String, u32>,
    /// Special/user-defined/unknown tokens, longest text first (stable by id).
    special_order: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    /// Separator (BERT's `[SEP]`, appended by WordPiece with the special tokens).
    sep: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    eog: BTreeSet<u32>,
    fim: Fim,
    chat_template: Option<String>,
    /// `tokenizer.chat_template.rerank`: text with `{query}` and `{document}`.
    rerank_template: Option<String>,
}

/// A vocabulary's fill-in-the-middle tokens, from metadata or found by their text as
/// llama.cpp does. Infill needs `pre`, `suf` and `mid`; `rep` and `sep` add the
/// repository-level layout (a project name, then one chunk per file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fim {
    pub pre: Option<u32>,
    pub suf: Option<u32>,
    pub mid: Option<u32>,
    pub pad: Option<u32>,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("n_vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        load::build(&|k| f.get(k))
    }

    /// Text to token ids, as llama.cpp's `llama_tokenize`.
    ///
    /// `add_special` adds BOS/EOS where the model's metadata asks for them;
    /// `parse_special` lets control tokens written in the text (e.g. `<|im_start|>`)
    /// become their ids. User-defined tokens are always recognised.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = special::partition(self, text, parse_special);
        let mut out = Vec::new();
        // WordPiece always opens with BOS ([CLS]) when special tokens are asked for.
        if add_special && (self.add_bos || matches!(self.kind, Kind::Wpm(_))) {
            out.extend(self.bos);
        }
        match &self.kind {
            Kind::Bpe(bpe) => {
                for f in frags {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => bpe.encode(t, &self.lookup, &mut out),
                    }
                }
            }
            Kind::Wpm(wpm) => {
                for f in frags {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => wpm.encode(t, &self.lookup, self.unk, &mut out),
                    }
                }
                if add_special {
                    out.extend(self.sep);
                }
            }
            Kind::Spm => {
                // A space is prefixed to raw text at the start and after each special token.
                let mut after_special = true;
                for f in frags {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 3);
                            if self.add_space_prefix && after_special {
                                s.push(' ');
                            }
                            s.push_str(t);
                            let s = s.replace(' ', "\u{2581}");
                            spm::tokenize(self, &s, &mut out);
                            after_special = false;
                        }
                    }
                }
            }
        }
        if add_special && self.add_bos && out.len() >= 2 && Some(out[1]) == self.bos {
            log::warn!("the prompt starts with BOS and the model adds one too: it now has two");
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The bytes a token stands for. `special` renders control/unknown tokens as their
    /// text; without it they are empty (llama.cpp's default for generated text).
    /// Bytes, not a string: a byte-level token can be part of a UTF-8 sequence.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            log::debug!("token_to_piece: id {id} is outside the vocabulary");
            return Vec::new();
        };
        let shown_if_special = attr::UNKNOWN | attr::CONTROL;
        if !special && t.attr & shown_if_special != 0 {
            return Vec::new();
        }
        if t.attr & (shown_if_special | attr::USER_DEFINED) != 0 {
            return t.text.as_bytes().to_vec();
        }
        if t.attr & attr::NORMAL != 0 {
            return match &self.kind {
                Kind::Bpe(b) if b.byte_encoded() => decode_alphabet(&t.text),
                Kind::Spm | Kind::Wpm(_) | Kind::Bpe(_) => {
                    t.text.replace('\u{2581}', " ").into_bytes()
                }
            };
        }
        if t.attr & attr::BYTE != 0 {
            return parse_byte_token(&t.text)
                .map(|b| vec![b])
                .unwrap_or_default();
        }
        Vec::new()
    }

    /// Token ids back to bytes, as llama.cpp's `llama_detokenize`: `remove_special` drops
    /// a leading BOS / trailing EOS the model would add, `unparse_special` renders
    /// control tokens; a SentencePiece space prefix is removed and, for vocabularies that
    /// ask for it, spaces before punctuation are cleaned up.
    pub fn detokenize(
        &self,
        tokens: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Vec<u8> {
        let mut toks = tokens;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && !toks.is_empty() && Some(toks[0]) == self.bos {
            remove_space = false;
            toks = &toks[1..];
        }
        if remove_special && self.add_eos && toks.last().is_some_and(|&t| Some(t) == self.eos) {
            toks = &toks[..toks.len() - 1];
        }
        let mut out = Vec::new();
        for &t in toks {
            let piece = self.token_to_piece(t, unparse_special);
            let skip = usize::from(remove_space && piece.first() == Some(&b' '));
            out.extend_from_slice(&piece[skip..]);
            remove_space = false;
        }
        if self.clean_spaces {
            out = clean_spaces(&out);
        }
        out
    }

    /// Convenience: token ids to text, control tokens hidden, invalid UTF-8 replaced.
    pub fn decode(&self, tokens: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(tokens, false, false)).into_owned()
    }

    /// Beginning-of-sequence token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (e.g. `<|im_end|>`, `<end_of_turn>`), if known.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// The fill-in-the-middle tokens the vocabulary has.
    pub fn fim(&self) -> Fim {
        self.fim
    }

    /// Whether generation stops at this token (EOS, EOT and llama.cpp's EOG list).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// `tokenizer.ggml.model`: "llama", "gpt2", "gemma4" or "bert".
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `tokenizer.ggml.pre` (empty when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }

    /// The vocabulary text of a token (in the model's own alphabet).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|t| t.text.as_str())
    }

    /// The id of an exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.lookup.get(text).copied()
    }

    /// Whether the token is a control token (rendered empty in generated text).
    pub fn is_control(&self, id: u32) -> bool {
        self.tokens
            .get(id as usize)
            .is_some_and(|t| t.attr & attr::CONTROL != 0)
    }

    /// Uses `template` in place of the GGUF's (`--chat-template`).
    pub fn set_chat_template(&mut self, template: &str) {
        self.chat_template = Some(template.to_string());
    }

    /// Uses `template` where the GGUF has none (a built-in one of the architecture).
    pub fn set_default_chat_template(&mut self, template: &str) {
        if self.chat_template.is_none() {
            self.chat_template = Some(template.to_string());
        }
    }

    /// `tokenizer.chat_template`, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders the model's chat template with its BOS/EOS texts. A model without a
    /// template gets ChatML, as llama.cpp's chat tools do.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.apply_chat_template_with(messages, add_generation_prompt, None, None)
    }

    /// [`Self::apply_chat_template`] with a `tools` list for templates that render one
    /// and further top-level variables (`enable_thinking`, `chat_template_kwargs`).
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        context: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, TemplateError> {
        let text = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("");
        render_chat_template(
            self.chat_template_or_chatml(),
            messages,
            &TemplateOptions {
                add_generation_prompt,
                bos_token: text(self.bos),
                eos_token: text(self.eos),
                now: None,
                tools,
                context,
            },
        )
    }

    /// The template messages are rendered with: the model's, else ChatML.
    pub fn chat_template_or_chatml(&self) -> &str {
        self.chat_template.as_deref().unwrap_or(template::CHATML)
    }

    /// The token for a raw byte: `<0xNN>`, else the byte itself as a one-byte text.
    pub(crate) fn byte_to_token(&self, b: u8) -> Option<u32> {
        self.token_id(&format!("<0x{b:02X}>"))
            .or_else(|| {
                b.is_ascii()
                    .then(|| self.token_id(&(b as char).to_string()))
                    .flatten()
            })
            .or_else(|| {
                log::debug!("no token for byte 0x{b:02X}; using the unknown token");
                self.unk
            })
    }
}

/// `<0xNN>` → the byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2 alphabet text back to raw bytes. A character outside the alphabet is written
/// as `[UNK_BYTE_0x<its utf-8 hex><token text>]`, as llama.cpp does.
fn decode_alphabet(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match bpe::alphabet_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                let hex: String = c
                    .encode_utf8(&mut buf)
                    .bytes()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                out.extend_from_slice(format!("[UNK_BYTE_0x{hex}{text}]").as_bytes());
            }
        }
    }
    out
}

/// Hugging Face's `clean_up_tokenization_spaces`, in llama.cpp's three passes:
/// drop a space before `? ! . ,`; turn ` ' ` into `'`; drop a space before `'s 'm 're 've`.
fn clean_spaces(text: &[u8]) -> Vec<u8> {
    // Pass 1.
    let mut a = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // Pass 2: the space after a lone apostrophe is skipped, and no longer counts as the
    // previous character of what follows it.
    let mut src = a;
    let mut b = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            b.pop();
            b.push(x);
            src[i + 1] = 0;
            i += 2;
            continue;
        }
        b.push(x);
        i += 1;
    }
    // Pass 3.
    let mut c = Vec::with_capacity(b.len());
    for (i, &x) in b.iter().enumerate() {
        if i > 0 && b[i - 1] == b' ' && x == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let x2 = b.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e')));
            if drop {
                c.pop();
            }
        }
        c.push(x);
    }
    c
}
