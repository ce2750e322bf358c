//! Kernel knobs for measuring other shapes than the defaults, gathered in one struct.
//!
//! The `WGLLM_*` tuning variables are read here and nowhere else, once, by the caller that
//! opens the GPU ([`KernelTuning::from_env`]); ops read the copy in [`crate::gpu::Gpu`].
//! Every override is checked against the values [`super::kernels::KernelKey::all`]
//! enumerates, so a tuning choice can only select a kernel the offline check has seen.

use super::kernels;

/// Overrides of the kernel choices; `None` (the default) keeps the built-in choice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelTuning {
    /// `WGLLM_MATMUL_TILE=RxT`: (rows, tokens) per invocation of the CPU-shaped matmul.
    pub matmul_tile: Option<(u32, u32)>,
    /// `WGLLM_GPU_TILE=64x64|128x64|128x128`: (weight rows, tokens) per workgroup of the
    /// tiled prompt matmul. 128x64 and 128x128 fall back to the default choice where the
    /// adapter lacks the 24 or 32 KiB of workgroup memory they take.
    pub gpu_tile: Option<(u32, u32)>,
    /// `WGLLM_GPU_VEC`: weight rows per workgroup of the GPU matrix-vector matmul.
    pub gpu_vec_rows: Option<u32>,
    /// `WGLLM_TILE_MIN`: fewest tokens for which GPU-shaped kernels use the tiled matmul.
    pub tile_min: Option<u32>,
    /// `WGLLM_ATTN_TB`: tokens per invocation of the attention score and output kernels.
    pub attn_tb: Option<u32>,
    /// `WGLLM_ATTN_SPLIT`: most tokens for which GPU-shaped kernels split the attention
    /// output over cells.
    pub attn_split_max_tok: Option<u32>,
    /// `WGLLM_ATTN_TILE_MIN`: fewest tokens for which GPU-shaped kernels take the tiled
    /// prompt attention (`ops::attention`); a number above the ubatch turns it off.
    pub attn_tile_min: Option<u32>,
    /// `WGLLM_ATTN_CHUNK`: cells per workgroup (at least) of the GPU split attention
    /// output (`ops::attention`, 128 by default).
    pub attn_split_chunk: Option<u32>,
    /// `WGLLM_ATTN_FLASH=0|1`: GPU-shaped kernels take the flash attention kernel (for
    /// every batch, where the head fits it) or not (the default; see `ops::attention`).
    pub attn_flash: Option<bool>,
    /// `WGLLM_ATTN_KQ_LANES=0|1`: GPU-shaped kernels compute attention scores with 8
    /// invocations per cell (`attn_kq_lanes.wgsl`, the default) or one (`attn_kq.wgsl`).
    pub attn_kq_lanes: Option<bool>,
    /// `WGLLM_UNROLL=0|1`: kernels' short constant-bounded loops written out before
    /// compiling (`ops::unroll`), or not; by default where the adapter's compiler keeps
    /// loops as written ([`crate::gpu::AdapterSummary::keeps_loops`]).
    pub unroll: Option<bool>,
    /// `WGLLM_PARAMS_STORAGE=0|1`: kernels read their parameters from a read-only storage
    /// buffer rather than a uniform one (`ops::uniforms::params_in_storage`); by default
    /// where the driver specializes kernels on uniform values
    /// ([`crate::gpu::AdapterSummary::specializes_on_uniforms`]).
    pub params_storage: Option<bool>,
    /// (rows, tokens) per invocation of the CPU-shaped matmul for one token and for 8+
    /// tokens: what the tuner (`crate::tune`) measured best on an adapter, below
    /// `matmul_tile`, which overrides every size.
    pub cpu_decode_tile: Option<(u32, u32)>,
    pub cpu_prompt_tile: Option<(u32, u32)>,
    /// Whether the tuner measured a token drawn on the GPU cheaper than one read back and
    /// sampled on the host: what `--sampling auto` takes (`crate::tune::measure_draws`).
    pub gpu_draws: Option<bool>,
    /// `WGLLM_PROFILE=1`: time every dispatch alone before each graph run and log the
    /// totals per op (slow; for finding hot spots, not for measuring speed).
    pub profile: bool,
}

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

    /// These overrides where set, the tuned `base` elsewhere: what the user asked for
    /// (environment) wins over what the tuner measured.
    pub fn over(&self, base: &KernelTuning) -> KernelTuning {
        KernelTuning {
            matmul_tile: self.matmul_tile.or(base.matmul_tile),
            gpu_tile: self.gpu_tile.or(base.gpu_tile),
            gpu_vec_rows: self.gpu_vec_rows.or(base.gpu_vec_rows),
            tile_min: self.tile_min.or(base.tile_min),
            attn_tb: self.attn_tb.or(base.attn_tb),
            attn_split_max_tok: self.attn_split_max_tok.or(base.attn_split_max_tok),
            attn_tile_min: self.attn_tile_min.or(base.attn_tile_min),
            attn_split_chunk: self.attn_split_chunk.or(base.attn_split_chunk),
            attn_flash: self.attn_flash.or(base.attn_flash),
            attn_kq_lanes: self.attn_kq_lanes.or(base.attn_kq_lanes),
            unroll: self.unroll.or(base.unroll),
            params_storage: self.params_storage.or(base.params_storage),
            cpu_decode_tile: self.cpu_decode_tile.or(base.cpu_decode_tile),
            cpu_prompt_tile: self.cpu_prompt_tile.or(base.cpu_prompt_tile),
            gpu_draws: self.gpu_draws.or(base.gpu_draws),
            profile: self.profile || base.profile,
        }
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
            if !kernels::CPU_MATMUL_ROWS.contains(&r) || !kernels::CPU_MATMUL_TOKENS.contains(&t) {
                return bad(
                    var,
                    format!("{r}x{t}"),
                    format!(
                        "rows must be one of {} and tokens one of {}",
                        fmt_list(kernels::CPU_MATMUL_ROWS),
                        fmt_list(kernels::CPU_MATMUL_TOKENS)
                    ),
                );
            }
        }
        if let Some((m, n)) = self.gpu_tile {
            if !kernels::GPU_TILES.contains(&(m, n)) {
                return bad(
                    "WGLLM_GPU_TILE",
                    format!("{m}x{n}"),
                    "expected 64x64, 128x64 or 128x128".into(),
                );
            }
        }
        if let Some(r) = self.gpu_vec_rows {
            if !kernels::GPU_VEC_ROWS.contains(&r) {
                return bad(
                    "WGLLM_GPU_VEC",
                    r.to_string(),
                    format!("expected one of {}", fmt_list(kernels::GPU_VEC_ROWS)),
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
            if !kernels::ATTN_TB.contains(&tb) {
                return bad(
                    "WGLLM_ATTN_TB",
                    tb.to_string(),
                    format!("expected one of {}", fmt_list(kernels::ATTN_TB)),
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
