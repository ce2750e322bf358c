//! `wgllm tokenize`: text to token ids with the model's own tokenizer, as llama-tokenize
//! prints them. Reads only the vocabulary from the file: no GPU, no weights.

use super::escapes::unescape_bytes;
use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use wgllm::gguf::GgufFile;
use wgllm::tokenizer::Tokenizer;

#[derive(Args)]
pub struct TokenizeArgs {
    /// Path to a GGUF model (a vocabulary-only GGUF is enough).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Text to tokenize.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the text from a file, every byte of it (a trailing newline is a token too).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Read the text from standard input (takes precedence over -f and -p).
    #[arg(long)]
    pub stdin: bool,
    /// Print only the ids, as a Python list: [1, 2, 3].
    #[arg(long)]
    pub ids: bool,
    /// Do not add BOS (nor EOS/SEP) even if the model adds them.
    #[arg(long)]
    pub no_bos: bool,
    /// Tokenize special-token texts such as `<|im_start|>` as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print the number of tokens at the end.
    #[arg(long)]
    pub show_count: bool,
    /// Take the text literally: by default `\n \t \\ \xNN …` are processed, in -p, -f
    /// and --stdin alike, as llama-tokenize does.
    #[arg(long)]
    pub no_escape: bool,
    /// Accepted for llama.cpp habits: escapes are processed by default.
    #[arg(short = 'e', long = "escape", hide = true)]
    pub escape: bool,
}

/// The text to tokenize, read and unescaped as llama-tokenize reads it.
fn input(a: &TokenizeArgs) -> Result<String> {
    let raw: Vec<u8> = if a.stdin {
        let mut v = Vec::new();
        std::io::stdin()
            .read_to_end(&mut v)
            .context("reading standard input")?;
        v
    } else if let Some(f) = &a.file {
        std::fs::read(f).with_context(|| format!("reading {}", f.display()))?
    } else if let Some(p) = &a.prompt {
        p.clone().into_bytes()
    } else {
        bail!("no text: pass -p TEXT, -f FILE or --stdin");
    };
    let bytes = if a.no_escape {
        raw
    } else {
        unescape_bytes(&raw)
    };
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the text is not valid UTF-8 (byte {} after escapes are processed); \
             wgllm tokenizes Unicode text only",
            e.utf8_error().valid_up_to()
        )
    })
}

pub fn tokenize(a: &TokenizeArgs) -> Result<()> {
    let text = input(a)?;
    let gguf = GgufFile::open(&a.model)
        .with_context(|| format!("opening the model {}", a.model.display()))?;
    let tok = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("reading the tokenizer of {}", a.model.display()))?;
    let add_special = tok.add_bos() && !a.no_bos;
    let ids = tok.encode(&text, add_special, !a.no_parse_special);

    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if a.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        for &id in &ids {
            write!(out, "{id:6} -> '")?;
            out.write_all(&tok.token_to_piece(id, true))?;
            writeln!(out, "'")?;
        }
    }
    if a.show_count {
        writeln!(out, "Total number of tokens: {}", ids.len())?;
    }
    out.flush()?;
    Ok(())
}
