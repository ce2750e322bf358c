//! The tuning cache: one JSON file of what was measured, per adapter, driver, wgllm
//! version and model shape, so a device is measured once. Written whole to a temporary
//! file and renamed over the old one, so processes tuning at once never leave half a file.

use super::check::KernelCheck;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What measuring chose for one adapter (one backend's view of a device) and one model
/// shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    /// The device whatever the backend (see `super::hardware_id`): entries with the same
    /// hardware compete for `--backend auto`.
    pub hardware: String,
    pub adapter: String,
    /// `vulkan`, `metal`, `dx12` or `gl`.
    pub backend: String,
    pub driver: String,
    /// The shapes and types of the model's layer matrices (see `super::model_id`).
    pub model: String,
    /// The wgllm version that measured and a fingerprint of its kernel sources: changed
    /// kernels are measured again.
    pub wgllm: String,
    /// `cpu` or `gpu`.
    pub kernels: String,
    pub cpu_decode_tile: Option<(u32, u32)>,
    pub cpu_prompt_tile: Option<(u32, u32)>,
    pub gpu_vec_rows: Option<u32>,
    pub gpu_tile: Option<(u32, u32)>,
    /// One layer's matmuls, microseconds per token, decoded and in a prompt.
    pub decode_us: f64,
    pub prompt_us: f64,
    /// A token picked from the model's logits row with llama.cpp's default chain,
    /// microseconds: the GPU's busy time drawing it with the chosen kernels (its round
    /// trip left out: decoding ahead hides it), and the host's whole round trip reading the
    /// row back and sampling it (absent in caches written before they were measured; the
    /// key was renamed when the GPU's figure stopped counting its round trip, so entries
    /// holding the older figure count as unmeasured).
    #[serde(default)]
    pub draw_gpu_busy_us: Option<f64>,
    #[serde(default)]
    pub draw_host_us: Option<f64>,
    /// Whether the integer-dot matmuls measured faster than the float ones (after passing
    /// their check) for decoding and for prompts; `None`: not measured.
    #[serde(default)]
    pub int_dot_decode: Option<bool>,
    #[serde(default)]
    pub int_dot_prompt: Option<bool>,
    /// Whether the cooperative-matrix prompt matmul measured faster (after passing its
    /// check); `None`: not measured (the device has no matrices it can use).
    #[serde(default)]
    pub coop_matrix: Option<bool>,
    /// Every candidate's check against the portable kernels on this device, the dropped
    /// ones included (`super::check`).
    #[serde(default)]
    pub checks: Vec<KernelCheck>,
    /// Measured at a first use, to a time budget (a spread of the candidates, most
    /// promising first): `wgllm tune` may find better.
    #[serde(default)]
    pub first_use: bool,
    /// Candidates (and the draw) the budget left untimed.
    #[serde(default)]
    pub left: u32,
}

impl TuneEntry {
    /// Whether this entry answers for the same adapter, driver, version and model.
    pub fn same_key(&self, o: &TuneEntry) -> bool {
        self.hardware == o.hardware
            && self.backend == o.backend
            && self.adapter == o.adapter
            && self.driver == o.driver
            && self.model == o.model
            && self.wgllm == o.wgllm
    }

    /// What `--sampling auto` takes from this entry: draw on the GPU where that adds less
    /// to a token than the host's readback and sampling; `None` where neither was measured.
    pub fn gpu_draws(&self) -> Option<bool> {
        match (self.draw_gpu_busy_us, self.draw_host_us) {
            (Some(g), Some(h)) => Some(g < h),
            _ => None,
        }
    }

    /// The checks that failed: kernels never used on this device.
    pub fn dropped(&self) -> impl Iterator<Item = &KernelCheck> {
        self.checks.iter().filter(|c| !c.passed())
    }

    /// See `ShapeChoice::score`.
    pub fn score(&self) -> f64 {
        self.decode_us + self.prompt_us
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TuneCache {
    pub entries: Vec<TuneEntry>,
}

impl TuneCache {
    /// The file in `dir`.
    pub fn file(dir: &Path) -> PathBuf {
        dir.join("tune.json")
    }

    /// The cache in `dir`; empty when there is none yet. A file that does not parse (an
    /// older format, damage) is logged and treated as empty: it is only a cache.
    pub fn load(dir: &Path) -> TuneCache {
        let path = Self::file(dir);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return TuneCache::default();
        };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            log::warn!("ignoring the tuning cache {}: {e}", path.display());
            TuneCache::default()
        })
    }

    /// Replaces the entry with the same key (or adds it).
    pub fn put(&mut self, e: TuneEntry) {
        self.entries.retain(|o| !o.same_key(&e));
        self.entries.push(e);
    }

    pub fn find(&self, key: &TuneEntry) -> Option<&TuneEntry> {
        self.entries.iter().find(|e| e.same_key(key))
    }

    /// Writes the cache to `dir` (created if missing) through a temporary file.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let path = Self::file(dir);
        let tmp = dir.join(format!("tune.json.{}.tmp", std::process::id()));
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(backend: &str, decode_us: f64) -> TuneEntry {
        TuneEntry {
            hardware: "llvmpipe (Cpu)".into(),
            adapter: "llvmpipe".into(),
            backend: backend.into(),
            driver: "Mesa".into(),
            model: "llama 576x1536 q4_1".into(),
            wgllm: "0.1.0".into(),
            kernels: "cpu".into(),
            cpu_decode_tile: Some((2, 1)),
            cpu_prompt_tile: Some((4, 8)),
            gpu_vec_rows: None,
            gpu_tile: None,
            decode_us,
            prompt_us: 10.0,
            draw_gpu_busy_us: Some(300.0),
            draw_host_us: None,
            int_dot_decode: Some(true),
            int_dot_prompt: Some(false),
            coop_matrix: None,
            checks: vec![KernelCheck {
                name: "cpu decode int-dot".into(),
                nmse: 1e-4,
                bound: 1e-3,
            }],
            first_use: true,
            left: 3,
        }
    }

    #[test]
    fn round_trips_and_replaces_by_key() {
        let dir = std::env::temp_dir().join(format!("wgllm-tune-test-{}", std::process::id()));
        let mut c = TuneCache::default();
        c.put(entry("vulkan", 100.0));
        c.put(entry("gl", 120.0));
        c.put(entry("vulkan", 90.0));
        assert_eq!(c.entries.len(), 2);
        c.save(&dir).unwrap();
        let back = TuneCache::load(&dir);
        assert_eq!(back.entries, c.entries);
        assert_eq!(back.find(&entry("vulkan", 0.0)).unwrap().decode_us, 90.0);
        let mut other = entry("vulkan", 0.0);
        other.driver = "Mesa 24".into();
        assert!(
            back.find(&other).is_none(),
            "a new driver is measured again"
        );
        std::fs::write(TuneCache::file(&dir), "{not json").unwrap();
        assert!(TuneCache::load(&dir).entries.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
