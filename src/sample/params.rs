//! The sampler's settings ([`SamplerParams`]), llama.cpp's defaults and checks.

/// Sampling settings; the defaults are llama.cpp's (`common_params_sampling`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Temperature; `<= 0` keeps only the most likely token (greedy).
    pub temp: f32,
    /// Dynamic temperature: the temperature ranges over `temp ± dynatemp_range` with the
    /// normalised entropy of the candidates; `<= 0` disables.
    pub dynatemp_range: f32,
    /// Dynamic temperature: the exponent applied to the normalised entropy.
    pub dynatemp_exponent: f32,
    /// Keep the k most likely tokens; `<= 0` keeps all.
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; `<= 0` disables.
    pub min_p: f32,
    /// Locally typical sampling; `>= 1` disables.
    pub typical_p: f32,
    /// Keep tokens whose logit is within `top_n_sigma` standard deviations of the
    /// largest; `<= 0` disables.
    pub top_n_sigma: f32,
    /// XTC: the chance, per token, of removing all but the least likely of the tokens
    /// above `xtc_threshold`; `<= 0` disables.
    pub xtc_probability: f32,
    /// XTC threshold; `> 0.5` disables XTC.
    pub xtc_threshold: f32,
    /// The fewest candidates top-p, min-p, typical-p and XTC leave (0: no minimum).
    pub min_keep: usize,
    /// Penalty for tokens seen in the last `repeat_last_n`; `1.0` disables.
    pub repeat_penalty: f32,
    /// Subtracted from a logit once per occurrence in the last `repeat_last_n` tokens.
    pub frequency_penalty: f32,
    /// Subtracted from a logit once if the token occurs in the last `repeat_last_n`.
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at; `0` disables them.
    pub repeat_last_n: usize,
    /// DRY repetition penalty. Not implemented: must stay 0 ([`SamplerParams::validate`]).
    pub dry_multiplier: f32,
    /// Added to the given tokens' logits before anything else (`-inf` bans a token).
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed; only its low 32 bits are used, as llama.cpp's seed is a `uint32_t`.
    /// [`SamplerParams::RANDOM_SEED`] (low bits all ones) picks a fresh one.
    pub seed: u64,
    /// Tokens never sampled: a logit bias of -inf after `logit_bias` (what llama.cpp's
    /// --ignore-eos adds for the end-of-generation tokens).
    pub banned: Vec<u32>,
    /// A GBNF grammar the generated text must follow (llama.cpp's `--grammar`; JSON
    /// schemas arrive converted by [`crate::grammar::json_schema`]).
    pub grammar: Option<String>,
    /// A budget of thinking tokens (llama-server's `--reasoning-budget`).
    pub thinking_budget: Option<super::budget::ThinkingBudget>,
}

impl SamplerParams {
    /// llama.cpp's `LLAMA_DEFAULT_SEED`: draw a seed from the system.
    pub const RANDOM_SEED: u64 = 0xFFFF_FFFF;

    /// Argmax decoding (llama.cpp's `--temp 0`).
    pub fn greedy() -> Self {
        Self {
            temp: 0.0,
            ..Self::default()
        }
    }

    /// Rejects settings llama.cpp refuses (non-finite or non-positive repeat penalty,
    /// non-finite frequency/presence penalties, NaN elsewhere) and DRY, which is not built.
    pub fn validate(&self) -> Result<(), String> {
        let r = self.repeat_penalty;
        if !r.is_finite() || r <= 0.0 || !(1.0 / r).is_finite() {
            return Err(format!(
                "repeat_penalty must be finite and greater than 0, got {r}"
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !v.is_finite() {
                return Err(format!("{name} must be finite, got {v}"));
            }
        }
        for (name, v) in [
            ("temp", self.temp),
            ("dynatemp_range", self.dynatemp_range),
            ("dynatemp_exponent", self.dynatemp_exponent),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("typical_p", self.typical_p),
            ("top_n_sigma", self.top_n_sigma),
            ("xtc_probability", self.xtc_probability),
            ("xtc_threshold", self.xtc_threshold),
        ] {
            if v.is_nan() {
                return Err(format!("{name} must be a number, got NaN"));
            }
        }
        if let Some(&(t, _)) = self.logit_bias.iter().find(|(_, b)| b.is_nan()) {
            return Err(format!("logit_bias for token {t} is NaN"));
        }
        if self.dry_multiplier != 0.0 {
            return Err(format!(
                "DRY sampling is not built (dry_multiplier must be 0, got {})",
                self.dry_multiplier
            ));
        }
        Ok(())
    }

    /// The 32-bit seed llama.cpp would use, or `None` for a random one.
    pub(super) fn seed_u32(&self) -> Option<u32> {
        let s = self.seed as u32;
        (s != Self::RANDOM_SEED as u32).then_some(s)
    }

    pub(crate) fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && !(self.repeat_penalty == 1.0
                && self.frequency_penalty == 0.0
                && self.presence_penalty == 0.0)
    }

    pub(crate) fn xtc_on(&self) -> bool {
        !(self.xtc_probability <= 0.0 || self.xtc_threshold > 0.5)
    }
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temp: 0.8,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            min_keep: 0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repeat_last_n: 64,
            dry_multiplier: 0.0,
            logit_bias: Vec::new(),
            seed: Self::RANDOM_SEED,
            banned: Vec::new(),
            grammar: None,
            thinking_budget: None,
        }
    }
}

/// A fresh 32-bit seed (never `RANDOM_SEED` itself, so it can be passed back).
pub(super) fn fresh_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        web_time::SystemTime::now()
            .duration_since(web_time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let x = h.finish();
    let s = (x ^ (x >> 32)) as u32;
    if s == SamplerParams::RANDOM_SEED as u32 {
        0
    } else {
        s
    }
}
