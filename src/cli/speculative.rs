//! Speculative decoding flags, as today's llama.cpp spells them: `-md/--spec-draft-model`
//! (which implies `--spec-type draft-simple`), `--spec-draft-n-max`, `--spec-draft-n-min`,
//! `--spec-draft-p-min`. The draft runs on the target's GPU.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::engine::{Engine, SpecParams};

#[derive(Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// A draft model for speculative decoding: a small model with the target's
    /// vocabulary, which proposes tokens the target checks several at a time.
    #[arg(long = "spec-draft-model", visible_alias = "model-draft", alias = "md")]
    pub model_draft: Option<PathBuf>,
    /// Kinds of speculative decoding, comma-separated: none or draft-simple (what a draft
    /// model gives; the default with -md).
    #[arg(long = "spec-type")]
    pub spec_type: Option<String>,
    /// Most tokens the draft proposes after each sampled one.
    #[arg(long = "spec-draft-n-max", default_value_t = SpecParams::default().n_max)]
    pub n_max: u32,
    /// Fewer proposals than this are not checked.
    #[arg(long = "spec-draft-n-min", default_value_t = SpecParams::default().n_min)]
    pub n_min: u32,
    /// The draft stops proposing at a token it gives less probability than this.
    #[arg(long = "spec-draft-p-min", visible_alias = "draft-p-min", default_value_t = SpecParams::default().p_min)]
    pub p_min: f32,
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

impl SpecArgs {
    /// The draft file and its settings, checked before anything is loaded; None: no
    /// speculative decoding.
    pub fn draft(&self) -> Result<Option<(PathBuf, SpecParams)>> {
        let mut simple = self.model_draft.is_some();
        if let Some(types) = &self.spec_type {
            simple = false;
            for t in types.split(',').map(str::trim) {
                match t {
                    "none" => {}
                    "draft-simple" => simple = true,
                    "draft-eagle3" | "draft-mtp" | "draft-dflash" | "draft-dspark"
                    | "ngram-simple" | "ngram-map-k" | "ngram-map-k4v" | "ngram-mod"
                    | "ngram-cache" => bail!(
                        "--spec-type {t} is not built: wgllm speculates with a draft model only (--spec-type draft-simple with -md FILE)"
                    ),
                    _ => bail!(
                        "unknown --spec-type `{t}` (llama.cpp's kinds: none, draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache)"
                    ),
                }
            }
        }
        let Some(path) = self.model_draft.clone().filter(|_| simple) else {
            if simple {
                bail!("--spec-type draft-simple needs a draft model: add -md FILE");
            }
            return Ok(None);
        };
        if self.n_max == 0 {
            bail!("--spec-draft-n-max 0 would draft nothing: give at least 1, or leave out -md");
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            bail!(
                "--spec-draft-p-min is a probability, from 0 to 1; got {}",
                self.p_min
            );
        }
        Ok(Some((
            path,
            SpecParams {
                n_max: self.n_max,
                n_min: self.n_min,
                p_min: self.p_min,
            },
        )))
    }

    /// Loads the draft model onto the engine's GPU, if one was given.
    pub fn attach(&self, engine: &mut Engine) -> Result<()> {
        match self.draft()? {
            Some((path, params)) => {
                engine.load_draft(&path, params)?;
                if !self.synth_rates.is_empty() {
                    engine.set_synthetic_acceptance(self.synth_rates.clone())?;
                }
            }
            None if !self.synth_rates.is_empty() => {
                bail!("--spec-synth-rates needs a draft model to propose tokens: add -md FILE")
            }
            None => {}
        }
        Ok(())
    }
}
