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
}

impl SamplingArgs {
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
            ..SamplerParams::default()
        };
        p.validate()
            .map_err(|e| anyhow::anyhow!("invalid sampling flags: {e}"))?;
        Ok(p)
    }
}
