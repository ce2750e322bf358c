//! An attention for the tuner's checks: a prompt ubatch with a model's heads over an f16
//! cache, on random inputs, run through whichever attention kernels a device and tuning
//! take. Kernels that change the attention (the cooperative-matrix flash kernel) are
//! checked against the portable attention's output on the same device with it.

use super::PROMPT_TOKENS;
use crate::gpu::{Gpu, GpuError};
use crate::kv::KvType;
use crate::ops::attention::{attention_with, AttnShape, AttnViews, FlashKernel};
use crate::ops::softmax::SoftmaxParams;
use crate::ops::{run_repeated, View};

/// Cells of the cache the attention check reads: several of the flash kernels' chunks.
const ATTN_CHECK_CELLS: u32 = 320;

/// The mask of `n_tok` tokens at the end of `n_kv` cells, causal: token t sits at cell
/// n_kv - n_tok + t and sees the cells up to it.
pub(super) fn causal_mask(n_tok: u32, n_kv: u32) -> Vec<f32> {
    (0..n_tok * n_kv)
        .map(|i| {
            let (t, c) = (i / n_kv, i % n_kv);
            if c > n_kv - n_tok + t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect()
}

/// A prompt ubatch's attention with the model's heads, for checking the kernels a
/// candidate takes it through: [`PROMPT_TOKENS`] tokens at the end of
/// [`ATTN_CHECK_CELLS`] cells of an f16 cache (the default), causal, on random inputs.
pub(super) struct AttnRun {
    shape: AttnShape,
    sp: SoftmaxParams,
    q: View,
    k: View,
    v: View,
    mask: View,
}

impl AttnRun {
    /// For heads of (head_dim, n_head, n_head_kv) and the softmax's `scale`; None where
    /// attention takes no such heads (or `gpu` has no f16 cache).
    pub(super) fn new(
        gpu: &Gpu,
        (hd, nh, nkv): (u32, u32, u32),
        scale: f32,
        seed: u64,
    ) -> Result<Option<AttnRun>, GpuError> {
        if hd == 0 || !hd.is_multiple_of(4) || nkv == 0 || !nh.is_multiple_of(nkv) || !gpu.has_f16 {
            return Ok(None);
        }
        let (n_tok, n_kv) = (PROMPT_TOKENS, ATTN_CHECK_CELLS);
        let shape = AttnShape {
            head_dim: hd,
            n_head: nh,
            n_head_kv: nkv,
            n_tok,
            n_kv,
            k_type: KvType::F16,
            v_type: KvType::F16,
            flash: false,
            rot_k: 0,
            rot_v: 0,
        };
        let sp = SoftmaxParams {
            scale,
            max_bias: 0.0,
            n_head: nh,
            softcap: 0.0,
        };
        let mut rng = crate::model::synth::Rng(seed);
        let mut random = |n: u32| -> Vec<f32> { (0..n).map(|_| rng.normalish()).collect() };
        let q = random(hd * nh * n_tok);
        let kv_len = hd * nkv * n_kv;
        let (k, v) = (random(kv_len), random(kv_len));
        let mask = causal_mask(n_tok, n_kv);
        let up = |name: &str, words: &[u32]| -> Result<View, GpuError> {
            Ok(View::whole(&gpu.upload(name, bytemuck::cast_slice(words))?))
        };
        Ok(Some(AttnRun {
            q: up("check_q", bytemuck::cast_slice(&q))?,
            k: up("check_k", &KvType::F16.encode(&k))?,
            v: up("check_v", &KvType::F16.encode(&v))?,
            mask: up("check_mask", bytemuck::cast_slice(&mask))?,
            shape,
            sp,
        }))
    }

    /// The output on `gpu` through flash kernel `fk` (with `flash`: the flash path, where
    /// the kernels are GPU-shaped; else the score, softmax and output kernels).
    pub(super) fn output(
        &self,
        gpu: &Gpu,
        flash: bool,
        fk: FlashKernel,
    ) -> Result<Vec<f32>, GpuError> {
        let s = AttnShape {
            flash,
            ..self.shape
        };
        let scratch = |name: &str, n: u64| -> Result<View, GpuError> {
            Ok(View::whole(&gpu.storage(name, n.max(1) * 4)?))
        };
        let n_out = self.q.size / 4;
        let dst = scratch("check_attn_out", n_out)?;
        let nan = vec![f32::NAN; n_out as usize];
        gpu.write(&dst.buf, 0, bytemuck::cast_slice(&nan));
        let io = AttnViews {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            mask: &self.mask,
            scores: &scratch("check_scores", s.scores_len(gpu)?)?,
            partials: &scratch("check_partials", s.partials_len(gpu))?,
            dst: &dst,
            sinks: None,
        };
        let d = attention_with(gpu, &s, &self.sp, &io, fk)?;
        run_repeated(gpu, &d, 1)?;
        let bytes = gpu.read_bytes(&dst.buf, 0, n_out * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::FLOAT_BOUND;
    use super::*;
    use crate::gpu::{KernelShape, KernelTuning};

    /// The attention check's machinery on a test device: the f16-tile flash kernel with
    /// its products as loops (the cooperative-matrix kernel's structure) and the plain
    /// flash kernel both within the float bound of the portable attention, the f16 tiles
    /// measurably not equal to it (so the comparison sees the kernel it ran).
    #[test]
    fn attention_check_compares_the_flash_kernels_with_the_portable_attention() {
        let gpu = Gpu::new(&crate::gpu::GpuOptions {
            backend: crate::gpu::Backend::Vulkan,
            ..Default::default()
        })
        .unwrap();
        assert!(gpu.has_f16, "the test device (lavapipe) has shader-f16");
        let run = AttnRun::new(&gpu, (64, 9, 3), 0.125, 1).unwrap().unwrap();
        let plain = gpu.retuned(KernelShape::Cpu, KernelTuning::default());
        let want = run.output(&plain, false, FlashKernel::Plain).unwrap();
        let g = gpu.retuned(KernelShape::Gpu, KernelTuning::default());
        let nmse = |fk| crate::ops::nmse(&want, &run.output(&g, true, fk).unwrap());
        let flash = nmse(FlashKernel::Plain);
        assert!(flash < FLOAT_BOUND, "plain flash {flash:e}");
        let tiles = nmse(FlashKernel::Coop { mma: false });
        assert!(tiles < FLOAT_BOUND && tiles > 1e-12, "f16 tiles {tiles:e}");
        // Heads attention does not take.
        assert!(AttnRun::new(&gpu, (0, 9, 3), 0.125, 1).unwrap().is_none());
        assert!(AttnRun::new(&gpu, (64, 9, 0), 0.125, 1).unwrap().is_none());
    }
}
