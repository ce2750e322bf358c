//! Speculative decoding flags, as today's llama.cpp spells them: `-md/--spec-draft-model`
//! (which implies `--spec-type draft-simple`), `--spec-draft-n-max`, `--spec-draft-n-min`,
//! `--spec-draft-p-min`; `--spec-type ngram-simple` with `--spec-ngram-simple-size-n/-m`.
//! The draft model runs on the target's GPU.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::engine::{Engine, NgramParams, SpecParams};

#[derive(Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// A draft model for speculative decoding: a small model with the target's
    /// vocabulary, which proposes tokens the target checks several at a time.
    #[arg(long = "spec-draft-model", visible_alias = "model-draft", alias = "md")]
    pub model_draft: Option<PathBuf>,
    /// Kinds of speculative decoding, comma-separated: none, draft-simple (a draft
    /// model's proposals; the default with -md) or ngram-simple (the sequence's own
    /// earlier tokens after a repeated n-gram).
    #[arg(long = "spec-type")]
    pub spec_type: Option<String>,
    /// Most tokens the draft model proposes after each sampled one.
    #[arg(long = "spec-draft-n-max", default_value_t = SpecParams::default().n_max)]
    pub n_max: u32,
    /// Fewer proposals than this are not checked.
    #[arg(long = "spec-draft-n-min", default_value_t = SpecParams::default().n_min)]
    pub n_min: u32,
    /// The draft model stops proposing at a token it gives less probability than this.
    #[arg(long = "spec-draft-p-min", visible_alias = "draft-p-min", default_value_t = SpecParams::default().p_min)]
    pub p_min: f32,
    /// ngram-simple: tokens matched.
    #[arg(long = "spec-ngram-simple-size-n", default_value_t = NgramParams::default().size_n)]
    pub ngram_n: usize,
    /// ngram-simple: most tokens proposed.
    #[arg(long = "spec-ngram-simple-size-m", default_value_t = NgramParams::default().size_m)]
    pub ngram_m: usize,
    /// Accepted for compatibility: ngram-simple takes the latest match, as llama.cpp's.
    #[arg(long = "spec-ngram-simple-min-hits")]
    pub ngram_min_hits: Option<u32>,
    /// Benchmarking only: keep proposal i with probability R_i (comma-separated), whatever
    /// the target samples, as llama.cpp's synthetic acceptance; the output is no longer
    /// the model's.
    #[arg(long = "spec-synth-rates", value_delimiter = ',')]
    pub synth_rates: Vec<f64>,
    /// Accepted for compatibility: the draft's layers are all on the GPU, as the target's.
    #[arg(
        long = "spec-draft-ngl",
        aliases = ["ngld", "gpu-layers-draft", "n-gpu-layers-draft"],
        allow_hyphen_values = true
    )]
    pub ngl: Option<String>,
}

/// What proposes tokens.
pub enum Speculation {
    Model(PathBuf, SpecParams),
    Ngram(NgramParams, SpecParams),
}

impl SpecArgs {
    /// The speculation asked for, checked before anything is loaded; None: none.
    pub fn speculation(&self) -> Result<Option<Speculation>> {
        let (mut simple, mut ngram) = (self.model_draft.is_some(), false);
        if let Some(types) = &self.spec_type {
            simple = false;
            for t in types.split(',').map(str::trim) {
                match t {
                    "none" => {}
                    "draft-simple" => simple = true,
                    "ngram-simple" => ngram = true,
                    "draft-eagle3" | "draft-mtp" | "draft-dflash" | "draft-dspark"
                    | "ngram-map-k" | "ngram-map-k4v" | "ngram-mod" | "ngram-cache" => bail!(
                        "--spec-type {t} is not built: wgllm speculates with a draft model (draft-simple, with -md FILE) or by n-gram lookup (ngram-simple)"
                    ),
                    _ => bail!(
                        "unknown --spec-type `{t}` (llama.cpp's kinds: none, draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache)"
                    ),
                }
            }
        }
        if simple && ngram {
            bail!(
                "--spec-type draft-simple,ngram-simple: wgllm uses one kind at a time; choose one"
            );
        }
        if simple && self.model_draft.is_none() {
            bail!("--spec-type draft-simple needs a draft model: add -md FILE");
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            bail!(
                "--spec-draft-p-min is a probability, from 0 to 1; got {}",
                self.p_min
            );
        }
        let params = SpecParams {
            n_max: self.n_max,
            n_min: self.n_min,
            p_min: self.p_min,
        };
        if ngram {
            if self.ngram_n == 0 || self.ngram_m == 0 {
                bail!("--spec-ngram-simple-size-n and -size-m are at least 1");
            }
            let p = NgramParams {
                size_n: self.ngram_n,
                size_m: self.ngram_m,
            };
            return Ok(Some(Speculation::Ngram(p, params)));
        }
        if !simple {
            if !self.synth_rates.is_empty() {
                bail!("--spec-synth-rates needs something that proposes tokens: add -md FILE");
            }
            return Ok(None);
        }
        if self.n_max == 0 {
            bail!("--spec-draft-n-max 0 would draft nothing: give at least 1, or leave out -md");
        }
        let path = self.model_draft.clone().unwrap_or_default();
        Ok(Some(Speculation::Model(path, params)))
    }

    /// Attaches what proposes tokens to the engine (loading a draft model onto its GPU).
    pub fn attach(&self, engine: &mut Engine) -> Result<()> {
        match self.speculation()? {
            Some(Speculation::Model(path, params)) => engine.load_draft(&path, params)?,
            Some(Speculation::Ngram(p, params)) => engine.attach_ngram_lookup(p, params)?,
            None => return Ok(()),
        }
        if !self.synth_rates.is_empty() {
            engine.set_synthetic_acceptance(self.synth_rates.clone())?;
        }
        Ok(())
    }
}
