//! Kernel knobs for measuring other shapes than the defaults: what they may be set to.
//!
//! The knobs are plain data the device carries ([`crate::gpu::KernelTuning`]). The
//! `WGLLM_*` tuning variables are read here and nowhere else, once, by the caller that
//! opens the GPU ([`KernelTuning::from_env`]); ops read the copy in [`crate::gpu::Gpu`].
//! Every override is checked against the values [`super::KernelKey::all`]
//! enumerates, so a tuning choice can only select a kernel the offline check has seen.

use super::{attention, matmul};
pub use crate::gpu::KernelTuning;

/// A tuning value outside what the kernels support.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {msg}")]
pub struct TuningError {
    pub var: &'static str,
    pub value: String,
    pub msg: String,
}

fn fmt_list(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

fn parse_pair(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once('x')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

impl KernelTuning {
    /// Reads the `WGLLM_*` tuning variables of the process environment.
    pub fn from_env() -> Result<KernelTuning, TuningError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds the tuning from any variable lookup (the environment, or a test's table).
    /// An empty value counts as unset.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<KernelTuning, TuningError> {
        let get = |var: &'static str| lookup(var).filter(|v| !v.trim().is_empty());
        let bad = |var: &'static str, value: &str, msg: &str| TuningError {
            var,
            value: value.to_string(),
            msg: msg.to_string(),
        };
        let pair = |var: &'static str| -> Result<Option<(u32, u32)>, TuningError> {
            get(var)
                .map(|v| parse_pair(&v).ok_or_else(|| bad(var, &v, "expected RxT, e.g. 2x4")))
                .transpose()
        };
        let num = |var: &'static str| -> Result<Option<u32>, TuningError> {
            get(var)
                .map(|v| {
                    v.trim()
                        .parse()
                        .map_err(|_| bad(var, &v, "expected a whole number"))
                })
                .transpose()
        };
        let profile = match get("WGLLM_PROFILE").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(bad("WGLLM_PROFILE", v, "expected 0 or 1")),
        };
        let switch = |var: &'static str| -> Result<Option<bool>, TuningError> {
            match get(var).as_deref().map(str::trim) {
                None => Ok(None),
                Some("0") => Ok(Some(false)),
                Some("1") => Ok(Some(true)),
                Some(v) => Err(bad(var, v, "expected 0 or 1")),
            }
        };
        let t = KernelTuning {
            matmul_tile: pair("WGLLM_MATMUL_TILE")?,
            attn_flash: switch("WGLLM_ATTN_FLASH")?,
            attn_kq_lanes: switch("WGLLM_ATTN_KQ_LANES")?,
            int_dot: switch("WGLLM_INT_DOT")?,
            coop_matrix: switch("WGLLM_COOP_MATRIX")?,
            unroll: switch("WGLLM_UNROLL")?,
            params_storage: switch("WGLLM_PARAMS_STORAGE")?,
            gpu_tile: pair("WGLLM_GPU_TILE")?,
            gpu_vec_rows: num("WGLLM_GPU_VEC")?,
            tile_min: num("WGLLM_TILE_MIN")?,
            attn_tb: num("WGLLM_ATTN_TB")?,
            attn_split_max_tok: num("WGLLM_ATTN_SPLIT")?,
            attn_tile_min: num("WGLLM_ATTN_TILE_MIN")?,
            attn_split_chunk: num("WGLLM_ATTN_CHUNK")?,
            profile,
            ..Default::default()
        };
        t.validate()?;
        Ok(t)
    }

    /// Checks every override against the kernel variants that exist.
    pub fn validate(&self) -> Result<(), TuningError> {
        let bad =
            |var: &'static str, value: String, msg: String| Err(TuningError { var, value, msg });
        let tiles = [
            ("WGLLM_MATMUL_TILE", self.matmul_tile),
            ("tuned decode tile", self.cpu_decode_tile),
            ("tuned prompt tile", self.cpu_prompt_tile),
        ];
        for (var, tile) in tiles {
            let Some((r, t)) = tile else { continue };
            if !matmul::CPU_MATMUL_ROWS.contains(&r) || !matmul::CPU_MATMUL_TOKENS.contains(&t) {
                return bad(
                    var,
                    format!("{r}x{t}"),
                    format!(
                        "rows must be one of {} and tokens one of {}",
                        fmt_list(matmul::CPU_MATMUL_ROWS),
                        fmt_list(matmul::CPU_MATMUL_TOKENS)
                    ),
                );
            }
        }
        if let Some((m, n)) = self.gpu_tile {
            if !matmul::GPU_TILES.contains(&(m, n)) {
                return bad(
                    "WGLLM_GPU_TILE",
                    format!("{m}x{n}"),
                    "expected 64x64, 128x64 or 128x128".into(),
                );
            }
        }
        if let Some(r) = self.gpu_vec_rows {
            if !matmul::GPU_VEC_ROWS.contains(&r) {
                return bad(
                    "WGLLM_GPU_VEC",
                    r.to_string(),
                    format!("expected one of {}", fmt_list(matmul::GPU_VEC_ROWS)),
                );
            }
        }
        if self.tile_min == Some(0) {
            return bad("WGLLM_TILE_MIN", "0".into(), "expected at least 1".into());
        }
        for (var, v) in [
            ("WGLLM_ATTN_TILE_MIN", self.attn_tile_min),
            ("WGLLM_ATTN_CHUNK", self.attn_split_chunk),
        ] {
            if v == Some(0) {
                return bad(var, "0".into(), "expected at least 1".into());
            }
        }
        if let Some(tb) = self.attn_tb {
            if !attention::ATTN_TB.contains(&tb) {
                return bad(
                    "WGLLM_ATTN_TB",
                    tb.to_string(),
                    format!("expected one of {}", fmt_list(attention::ATTN_TB)),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<KernelTuning, TuningError> {
        KernelTuning::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn no_variables_means_no_overrides() {
        assert_eq!(from(&[]).unwrap(), KernelTuning::default());
    }

    #[test]
    fn parses_every_variable() {
        let t = from(&[
            ("WGLLM_MATMUL_TILE", "4x8"),
            ("WGLLM_GPU_TILE", "128x64"),
            ("WGLLM_GPU_VEC", "8"),
            ("WGLLM_TILE_MIN", "16"),
            ("WGLLM_ATTN_TB", "1"),
            ("WGLLM_ATTN_SPLIT", "8"),
            ("WGLLM_ATTN_FLASH", "1"),
            ("WGLLM_ATTN_KQ_LANES", "0"),
            ("WGLLM_INT_DOT", "1"),
            ("WGLLM_COOP_MATRIX", "1"),
            ("WGLLM_ATTN_TILE_MIN", "64"),
            ("WGLLM_ATTN_CHUNK", "64"),
            ("WGLLM_UNROLL", "0"),
            ("WGLLM_PARAMS_STORAGE", "1"),
            ("WGLLM_PROFILE", "1"),
        ])
        .unwrap();
        assert_eq!(
            t,
            KernelTuning {
                matmul_tile: Some((4, 8)),
                gpu_tile: Some((128, 64)),
                gpu_vec_rows: Some(8),
                tile_min: Some(16),
                attn_tb: Some(1),
                attn_split_max_tok: Some(8),
                attn_flash: Some(true),
                attn_kq_lanes: Some(false),
                int_dot: Some(true),
                coop_matrix: Some(true),
                attn_tile_min: Some(64),
                attn_split_chunk: Some(64),
                unroll: Some(false),
                params_storage: Some(true),
                profile: true,
                ..Default::default()
            }
        );
    }

    #[test]
    fn refuses_values_outside_the_variant_space() {
        for (var, value) in [
            ("WGLLM_MATMUL_TILE", "3x1"),
            ("WGLLM_MATMUL_TILE", "2"),
            ("WGLLM_GPU_TILE", "32x32"),
            ("WGLLM_GPU_VEC", "6"),
            ("WGLLM_GPU_VEC", "64"),
            ("WGLLM_TILE_MIN", "0"),
            ("WGLLM_TILE_MIN", "many"),
            ("WGLLM_ATTN_TB", "3"),
            ("WGLLM_ATTN_SPLIT", "-1"),
            ("WGLLM_ATTN_FLASH", "on"),
            ("WGLLM_ATTN_KQ_LANES", "2"),
            ("WGLLM_INT_DOT", "2"),
            ("WGLLM_COOP_MATRIX", "yes"),
            ("WGLLM_ATTN_TILE_MIN", "0"),
            ("WGLLM_ATTN_CHUNK", "0"),
            ("WGLLM_UNROLL", "yes"),
            ("WGLLM_PROFILE", "yes"),
        ] {
            let e = from(&[(var, value)]).unwrap_err();
            assert_eq!(e.var, var, "{value}");
            assert!(e.to_string().contains(var), "{e}");
        }
    }
}
