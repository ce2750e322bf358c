//! Sampling flags of every generating command, with llama.cpp's names and defaults.

use anyhow::{bail, Result};
use clap::Args;
use wgllm::engine::Engine;
use wgllm::sample::SamplerParams;

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature (<= 0: greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Locally typical sampling (1: off).
    #[arg(long = "typical", default_value_t = 1.0)]
    pub typical_p: f32,
    /// Keep tokens within this many standard deviations of the top logit (<= 0: off).
    #[arg(long = "top-nsigma", default_value_t = -1.0, allow_negative_numbers = true)]
    pub top_n_sigma: f32,
    /// XTC: the chance of removing the most likely tokens above the threshold (0: off).
    #[arg(long = "xtc-probability", default_value_t = 0.0)]
    pub xtc_probability: f32,
    #[arg(long = "xtc-threshold", default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// Dynamic temperature: temp ± this range by entropy (0: off).
    #[arg(long = "dynatemp-range", default_value_t = 0.0)]
    pub dynatemp_range: f32,
    #[arg(long = "dynatemp-exp", default_value_t = 1.0)]
    pub dynatemp_exponent: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (-1: the context size, 0: off).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i64,
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// DRY repetition penalty (not built: any value but 0 is refused).
    #[arg(long = "dry-multiplier", default_value_t = 0.0)]
    pub dry_multiplier: f32,
    /// RNG seed (-1: random). Sampling draws as llama.cpp does: the same seed gives
    /// llama.cpp's tokens wherever the logits agree.
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// Never end generation: end-of-generation tokens are not sampled.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// A GBNF grammar the generated text must follow (llama.cpp's grammar language).
    #[arg(long, value_name = "GRAMMAR")]
    pub grammar: Option<String>,
    /// Read the GBNF grammar from a file.
    #[arg(long = "grammar-file", value_name = "FILE")]
    pub grammar_file: Option<std::path::PathBuf>,
    /// A JSON schema the output must follow, e.g. '{"type": "object"}' for any object.
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA")]
    pub json_schema: Option<String>,
    /// Read the JSON schema from a file.
    #[arg(long = "json-schema-file", value_name = "FILE")]
    pub json_schema_file: Option<std::path::PathBuf>,
}

impl SamplingArgs {
    /// The grammar from whichever of --grammar, --grammar-file, -j, -jf was given (a JSON
    /// schema converted); its syntax is checked when a session opens with it.
    fn grammar(&self) -> Result<Option<String>> {
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("cannot read the {what} file {}: {e}", p.display()))
        };
        let given = [
            self.grammar.is_some(),
            self.grammar_file.is_some(),
            self.json_schema.is_some(),
            self.json_schema_file.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            bail!("give one of --grammar, --grammar-file, --json-schema (-j) and --json-schema-file (-jf), not several");
        }
        let schema = |text: &str, from: &str| -> Result<String> {
            let v: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| anyhow::anyhow!("{from} is not valid JSON: {e}"))?;
            Ok(wgllm::grammar::json_schema::to_grammar(&v)?)
        };
        Ok(if let Some(g) = &self.grammar {
            Some(g.clone())
        } else if let Some(p) = &self.grammar_file {
            Some(read(p, "grammar")?)
        } else if let Some(s) = &self.json_schema {
            Some(schema(s, "--json-schema")?)
        } else if let Some(p) = &self.json_schema_file {
            Some(schema(&read(p, "JSON schema")?, &p.display().to_string())?)
        } else {
            None
        })
    }

    pub fn params(&self, engine: &Engine) -> Result<SamplerParams> {
        let mut p = self.checked()?;
        if self.ignore_eos {
            p.banned = engine.tokenizer.eog_tokens().collect();
        }
        Ok(p)
    }

    /// The settings without `--ignore-eos` (which needs the model's tokens).
    pub fn checked(&self) -> Result<SamplerParams> {
        if self.repeat_penalty <= 0.0 {
            bail!(
                "--repeat-penalty must be positive, got {}",
                self.repeat_penalty
            );
        }
        let seed = if self.seed < 0 {
            SamplerParams::RANDOM_SEED
        } else {
            self.seed as u64
        };
        let p = SamplerParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            top_n_sigma: self.top_n_sigma,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            dynatemp_range: self.dynatemp_range,
            dynatemp_exponent: self.dynatemp_exponent,
            repeat_penalty: self.repeat_penalty,
            // llama.cpp's -1: as far back as the context reaches.
            repeat_last_n: if self.repeat_last_n < 0 {
                1 << 20
            } else {
                self.repeat_last_n as usize
            },
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            dry_multiplier: self.dry_multiplier,
            seed,
            grammar: self.grammar()?,
            ..SamplerParams::default()
        };
        p.validate()
            .map_err(|e| anyhow::anyhow!("invalid sampling flags: {e}"))?;
        Ok(p)
    }
}
