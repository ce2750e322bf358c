//! `wgllm embed`: embeddings of one or more texts, as llama-embedding computes them — each
//! text's token states after the final norm, pooled (`--pooling`) and normalised
//! (`--embd-normalize`, Euclidean by default).

use super::{load_engine, ModelArgs};
use anyhow::{bail, Context as _, Result};
use clap::Args;
use wgllm::engine::{normalize, Pooling};

#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text(s) to embed, split at each --embd-separator.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Where the texts of -p are split (llama-embedding's default: a newline).
    #[arg(long = "embd-separator", default_value = "\n")]
    pub separator: String,
    /// none, mean, cls, last or rank (a reranker's score of the text; default: what the
    /// model file declares, else none, as llama.cpp).
    #[arg(long)]
    pub pooling: Option<String>,
    /// -1 none, 0 to int16's range, 1 taxicab, 2 Euclidean, p > 2 the p-norm.
    #[arg(
        long = "embd-normalize",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub normalize: i32,
    /// '' (one line per embedding), array, or json (OpenAI's reply shape).
    #[arg(long = "embd-output-format", default_value = "")]
    pub format: String,
}

/// `--pooling` where given, else what the model file declares (none where it declares
/// nothing, as llama.cpp).
pub fn pooling(flag: Option<&str>, model: &std::path::Path) -> Result<Pooling> {
    match flag {
        Some(p) => p.parse::<Pooling>().map_err(anyhow::Error::msg),
        None => {
            let f = wgllm::gguf::GgufFile::open(model)
                .with_context(|| format!("reading {}", model.display()))?;
            Pooling::declared(&f).map_err(anyhow::Error::msg)
        }
    }
}

pub fn embed(a: &EmbedArgs) -> Result<()> {
    if !matches!(a.format.as_str(), "" | "array" | "json") {
        bail!(
            "--embd-output-format {}: choose '' (text lines), array or json",
            a.format
        );
    }
    let pooling = pooling(a.pooling.as_deref(), &a.model.path()?)?;
    let mut opts = a.model.options()?;
    opts.embeddings = true;
    opts.reranking = pooling == Pooling::Rank;
    let mut engine = load_engine(&a.model, &opts)?;
    let prompt = super::escapes::unescape(&a.prompt);
    let mut out: Vec<Vec<f32>> = Vec::new();
    for (i, text) in prompt.split(a.separator.as_str()).enumerate() {
        let tokens = engine.tokenizer.encode(text, true, true);
        let vectors = engine
            .embed(&tokens, pooling)
            .with_context(|| format!("text {i} ({} tokens)", tokens.len()))?;
        out.extend(vectors.iter().map(|v| normalize(v, a.normalize)));
    }
    match a.format.as_str() {
        "json" => {
            let data: Vec<serde_json::Value> = out
                .iter()
                .enumerate()
                .map(
                    |(i, v)| serde_json::json!({"object": "embedding", "index": i, "embedding": v}),
                )
                .collect();
            println!("{}", serde_json::json!({"object": "list", "data": data}));
        }
        "array" => println!("{}", serde_json::to_string(&out)?),
        _ => {
            for (i, v) in out.iter().enumerate() {
                let values: Vec<String> = v
                    .iter()
                    .map(|x| match a.normalize {
                        0 => format!("{x:.0}"),
                        _ => format!("{x:.6}"),
                    })
                    .collect();
                println!("embedding {i}: {}", values.join(" "));
            }
        }
    }
    Ok(())
}
