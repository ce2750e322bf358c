//! Where a model runs: the devices it is split over, the main one (the embeddings, the
//! output head, the step inputs and GPU sampling), and the device of each layer. Plain
//! data over open devices: the model uploads each layer's weights to its device, the
//! memory puts each layer's cache there, and the graph builder records each node on the
//! device of the layer it belongs to.

use super::{Gpu, GpuError};
use std::sync::Arc;

/// The devices of a model and the device of each of its layers.
#[derive(Clone)]
pub struct Placement {
    gpus: Vec<Arc<Gpu>>,
    main: usize,
    /// Index into `gpus` of each layer, in order.
    layers: Vec<usize>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field(
                "gpus",
                &self.gpus.iter().map(|g| &g.info.name).collect::<Vec<_>>(),
            )
            .field("main", &self.main)
            .field("layers", &self.layers)
            .finish()
    }
}

impl Placement {
    /// Every layer on one device.
    pub fn single(gpu: Arc<Gpu>, n_layer: usize) -> Self {
        Placement {
            gpus: vec![gpu],
            main: 0,
            layers: vec![0; n_layer],
        }
    }

    /// `n_layer` layers over `gpus` in proportion to `split` (one share per device; all
    /// zero or empty: equal shares), as llama.cpp's `-sm layer -ts` assigns them: layer
    /// `il` goes to the first device whose running share exceeds `il / (n_layer + 1)`
    /// (the output layer counts as one more, as there), so the same `-ts` puts the same
    /// layers on each device as llama.cpp does. `main` holds the rest.
    pub fn by_shares(
        gpus: Vec<Arc<Gpu>>,
        main: usize,
        split: &[f32],
        n_layer: usize,
    ) -> Result<Self, GpuError> {
        let layers = layers_by_shares(gpus.len(), split, n_layer)?;
        Self::new(gpus, main, layers)
    }

    /// `layers[il]` indexes `gpus`; `main` too.
    pub fn new(gpus: Vec<Arc<Gpu>>, main: usize, layers: Vec<usize>) -> Result<Self, GpuError> {
        if gpus.is_empty() {
            return Err(GpuError::Validation("a placement needs a device".into()));
        }
        if main >= gpus.len() || layers.iter().any(|&d| d >= gpus.len()) {
            return Err(GpuError::Validation(format!(
                "the main device ({main}) and every layer's device must be one of the {} devices",
                gpus.len()
            )));
        }
        Ok(Placement { gpus, main, layers })
    }

    /// The same placement over `gpus` instead, one for one: the same devices with other
    /// kernel choices (`Gpu::retuned`), which hold the same buffers.
    pub fn with_gpus(&self, gpus: Vec<Arc<Gpu>>) -> Result<Self, GpuError> {
        if gpus.len() != self.gpus.len() {
            return Err(GpuError::Validation(format!(
                "{} devices for a placement over {}",
                gpus.len(),
                self.gpus.len()
            )));
        }
        Placement::new(gpus, self.main, self.layers.clone())
    }

    /// The device of the embeddings, the output head, the step inputs and sampling.
    pub fn main(&self) -> &Arc<Gpu> {
        &self.gpus[self.main]
    }

    pub fn main_index(&self) -> usize {
        self.main
    }

    pub fn gpus(&self) -> &[Arc<Gpu>] {
        &self.gpus
    }

    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// The index of layer `il`'s device (the main device past the last layer).
    pub fn layer_device(&self, il: usize) -> usize {
        self.layers.get(il).copied().unwrap_or(self.main)
    }

    /// Layer `il`'s device.
    pub fn layer(&self, il: usize) -> &Arc<Gpu> {
        &self.gpus[self.layer_device(il)]
    }

    /// Whether more than one device does work.
    pub fn is_split(&self) -> bool {
        self.gpus.len() > 1
    }

    /// The layers on device `d`, as (first, count) runs.
    pub fn layer_runs(&self, d: usize) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (il, &dev) in self.layers.iter().enumerate() {
            if dev != d {
                continue;
            }
            match runs.last_mut() {
                Some((first, n)) if *first + *n == il => *n += 1,
                _ => runs.push((il, 1)),
            }
        }
        runs
    }

    /// "layers 0-14 on llvmpipe (Vulkan), 15-29 on llvmpipe (Gl); main: ...": for logs.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = (0..self.gpus.len())
            .map(|d| {
                let runs = self.layer_runs(d);
                let g = &self.gpus[d];
                let what = if runs.is_empty() {
                    "no layers".to_string()
                } else {
                    format!("layers {}", runs_text(&runs))
                };
                let main = if d == self.main { ", main" } else { "" };
                format!("{what} on {} ({}){main}", g.info.name, g.info.backend)
            })
            .collect();
        parts.join("; ")
    }
}

/// Layer runs as (first, count) written "0-14,20" (empty: "").
pub fn runs_text(runs: &[(usize, usize)]) -> String {
    let parts: Vec<String> = (runs.iter())
        .map(|&(a, n)| match n {
            1 => a.to_string(),
            _ => format!("{a}-{}", a + n - 1),
        })
        .collect();
    parts.join(",")
}

/// The device index of each of `n_layer` layers over `n_dev` devices by shares (see
/// [`Placement::by_shares`]).
pub fn layers_by_shares(
    n_dev: usize,
    split: &[f32],
    n_layer: usize,
) -> Result<Vec<usize>, GpuError> {
    if n_dev == 0 {
        return Err(GpuError::Validation("a split needs a device".into()));
    }
    if !split.is_empty() && split.len() != n_dev {
        return Err(GpuError::Validation(format!(
            "-ts gives {} shares for {n_dev} devices: give one per device (--device)",
            split.len()
        )));
    }
    if split.iter().any(|s| !s.is_finite() || *s < 0.0) {
        return Err(GpuError::Validation(format!(
            "-ts {split:?}: shares must be zero or positive numbers"
        )));
    }
    // Shares too large to sum in f32 are scaled by the largest first (the same split).
    let scaled: Vec<f32>;
    let split = if split.iter().sum::<f32>().is_finite() {
        split
    } else {
        let max = split.iter().fold(0f32, |a, &b| a.max(b));
        scaled = split.iter().map(|s| s / max).collect();
        &scaled[..]
    };
    let total: f32 = split.iter().sum();
    let shares: Vec<f32> = if total > 0.0 {
        split.iter().map(|s| s / total).collect()
    } else {
        vec![1.0 / n_dev as f32; n_dev]
    };
    // Running shares, as llama.cpp's upper_bound over its cumulative split.
    let mut ends = Vec::with_capacity(n_dev);
    let mut acc = 0.0f32;
    for s in &shares {
        acc += s;
        ends.push(acc);
    }
    let n_gpu_layers = (n_layer + 1) as f32;
    Ok((0..n_layer)
        .map(|il| {
            let at = il as f32 / n_gpu_layers;
            ends.iter()
                .position(|&e| e > at)
                .unwrap_or(n_dev - 1)
                .min(n_dev - 1)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::layers_by_shares;

    #[test]
    fn shares_follow_llama_cpp() {
        // 30 layers, 1:1: il / 31 < 0.5 for il <= 15.
        let l = layers_by_shares(2, &[1.0, 1.0], 30).unwrap();
        assert_eq!(l.iter().filter(|&&d| d == 0).count(), 16);
        assert!(l.windows(2).all(|w| w[0] <= w[1]));
        // 3:1 puts three quarters of the 31 on the first.
        let l = layers_by_shares(2, &[3.0, 1.0], 30).unwrap();
        assert_eq!(l.iter().filter(|&&d| d == 0).count(), 24);
        // No shares: even; a zero share gets nothing.
        assert_eq!(layers_by_shares(2, &[], 4).unwrap(), vec![0, 0, 0, 1]);
        assert_eq!(layers_by_shares(2, &[0.0, 1.0], 4).unwrap(), vec![1; 4]);
        assert!(layers_by_shares(2, &[1.0], 4).is_err());
        assert!(layers_by_shares(2, &[-1.0, 1.0], 4).is_err());
    }
}
