//! Fill-in-the-middle prompts laid out as llama-server's `/infill` lays them out, so a
//! code model sees the same tokens from either server.
//!
//! With a repository token (`rep`) and a file separator (`sep`) the extra files come
//! first in the repository-level layout (a project name, then each file's name and text);
//! without them each extra chunk follows a plain-text separator line. Then the prefix,
//! the suffix and the middle marker, in prefix-suffix-middle order, or suffix-prefix-middle
//! (`spm`) for the models trained that way. What does not fit is cut as llama.cpp cuts
//! it: the prefix keeps its last tokens (three quarters of a batch at most), the suffix
//! its first ones (what is left of a quarter batch), the extra files their last tokens
//! (what the context leaves after a batch and twice the tokens to generate).

use super::Tokenizer;

/// One extra file given as context (llama-server's `input_extra` item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfillFile {
    pub filename: String,
    pub text: String,
}

/// The parts of a fill-in-the-middle request, tokenized (no BOS).
#[derive(Clone, Debug, Default)]
pub struct InfillParts {
    /// The code before the gap.
    pub prefix: Vec<u32>,
    /// The code after the gap.
    pub suffix: Vec<u32>,
    /// The start of the middle, already written (`prompt`); it follows the prefix.
    pub prompt: Vec<u32>,
    pub extra: Vec<InfillFile>,
}

/// The sizes that decide how much of each part is kept.
#[derive(Clone, Copy, Debug)]
pub struct InfillLimits {
    pub n_batch: u32,
    /// Tokens the request may generate (-1: no limit, as llama-server counts it).
    pub n_predict: i32,
    /// A sequence's context.
    pub n_ctx: u32,
    /// Suffix-prefix-middle order (`--spm-infill`).
    pub spm: bool,
}

/// Why a vocabulary cannot do infill: the FIM tokens it lacks, in llama-server's words.
pub fn infill_unsupported(tok: &Tokenizer) -> Option<String> {
    let fim = tok.fim();
    let mut missing = String::new();
    for (has, what) in [
        (fim.pre, "prefix"),
        (fim.suf, "suffix"),
        (fim.mid, "middle"),
    ] {
        if has.is_none() {
            missing.push_str(&format!("{what} token is missing. "));
        }
    }
    (!missing.is_empty()).then(|| format!("Infill is not supported by this model: {missing}"))
}

/// The prompt for a fill-in-the-middle request. `None` when the vocabulary lacks the
/// prefix, suffix or middle token (see [`infill_unsupported`]).
pub fn infill_prompt(tok: &Tokenizer, parts: &InfillParts, lim: InfillLimits) -> Option<Vec<u32>> {
    let fim = tok.fim();
    let (pre, suf, mid) = (fim.pre?, fim.suf?, fim.mid?);
    let text = |s: &str| tok.encode(s, false, false);

    let mut extra = Vec::new();
    if let Some(rep) = fim.rep {
        extra.push(rep);
        extra.extend(text("myproject\n"));
    }
    for file in &parts.extra {
        match fim.sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(text(&format!("{}\n", file.filename)));
            }
            None => extra.extend(text("\n\n--- snippet ---\n\n")),
        }
        extra.extend(text(&file.text));
    }
    if let Some(sep) = fim.sep {
        extra.push(sep);
        extra.extend(text("filename\n"));
    }

    let quarter = (lim.n_batch / 4) as usize;
    let n_prefix = parts.prefix.len().min(3 * quarter);
    let n_suffix = parts
        .suffix
        .len()
        .min(quarter.saturating_sub(2 + parts.prompt.len()));
    let room = lim.n_ctx as i64 - lim.n_batch as i64 - 2 * lim.n_predict as i64;
    let n_extra = (room.max(0) as usize).min(extra.len());

    let mut prefix = vec![pre];
    prefix.extend_from_slice(&parts.prefix[parts.prefix.len() - n_prefix..]);
    prefix.extend_from_slice(&parts.prompt);
    let mut suffix = vec![suf];
    suffix.extend_from_slice(&parts.suffix[..n_suffix]);
    let (first, second) = if lim.spm {
        (suffix, prefix)
    } else {
        (prefix, suffix)
    };

    let mut out = extra[extra.len() - n_extra..].to_vec();
    if tok.add_bos() {
        out.extend(tok.bos());
    }
    out.extend(first);
    out.extend(second);
    out.push(mid);
    Some(out)
}
