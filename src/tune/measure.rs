//! Timing the candidate kernel shapes on one device, on one layer of the model itself:
//! its Q/K/V, output, gate/up and down matrices, in the file's own types, for one decoded
//! token and for a prompt ubatch. Only the matmuls are timed: they are ~90 % of a step.

use crate::gguf::GgufFile;
use crate::gpu::{Gpu, GpuError, KernelShape, KernelTuning};
use crate::model::{GateUp, Hparams, LayerWeights};
use crate::ops::glu::Activation;
use crate::ops::matmul::{matmul, matmul_at, matmul_glu, MatmulOut};
use crate::ops::{run_repeated, Dispatch, View};
use std::sync::Arc;
use web_time::Instant;

/// Tokens of the timed prompt ubatch: enough for the tiled kernels to run full tiles.
pub const PROMPT_TOKENS: u32 = 64;

/// One candidate's times: microseconds for the layer's matmuls, per token.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateTime {
    pub kernels: KernelShape,
    /// What the candidate varies, as `WGLLM_*` would name it (`decode 2x1`, `prompt 4x8`,
    /// `decode rows 4`, `prompt tiles by size`).
    pub name: String,
    /// For a decode candidate the time of one token; for a prompt candidate the time of
    /// the ubatch divided by its tokens.
    pub us_per_token: f64,
    pub decode: bool,
}

/// The best of one kernel shape on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeChoice {
    pub kernels: KernelShape,
    /// The tuned fields (tiles, rows) of the best decode and prompt candidates.
    pub tuning: KernelTuning,
    pub decode_us: f64,
    pub prompt_us: f64,
}

impl ShapeChoice {
    /// What a token costs, decoded and in a prompt, equally weighted: the number the
    /// shape and backend choices minimise.
    pub fn score(&self) -> f64 {
        self.decode_us + self.prompt_us
    }
}

/// The layer's buffers and the dispatches of its matmuls for `n_tok` tokens.
struct LayerRun {
    lw: LayerWeights,
    x: View,
    attn: View,
    ffn: View,
    qkv: View,
    out: View,
    pairs: View,
}

impl LayerRun {
    fn new(gpu: &Gpu, f: &GgufFile, hp: &Hparams) -> Result<Self, GpuError> {
        // The first attention layer (a hybrid's convolution layers have none to time).
        let il = (0..hp.n_layer)
            .find(|&il| !hp.is_recurrent(il as usize))
            .unwrap_or(0);
        let lw = LayerWeights::load(gpu, f, hp, il)
            .map_err(|e| GpuError::Validation(format!("tuning: {e}")))?;
        let t = PROMPT_TOKENS as u64;
        let qkv_rows: u32 = lw.qkv.iter().map(|w| w.n_rows).sum();
        let buf = |name: &str, n: u64| -> Result<View, GpuError> {
            Ok(View::whole(&gpu.storage(name, n.max(1) * 4 * t)?))
        };
        Ok(LayerRun {
            x: buf("tune_x", hp.n_embd as u64)?,
            attn: buf("tune_attn", hp.n_embd_q() as u64)?,
            ffn: buf("tune_ffn", hp.n_ff as u64)?,
            qkv: buf("tune_qkv", qkv_rows as u64)?,
            out: buf("tune_out", hp.n_embd as u64)?,
            pairs: buf("tune_pairs", 2 * hp.n_ff as u64)?,
            lw,
        })
    }

    fn dispatches(&self, gpu: &Gpu, n_tok: u32) -> Result<Vec<Dispatch>, GpuError> {
        let mut d = Vec::new();
        let stride: u32 = self.lw.qkv.iter().map(|w| w.n_rows).sum();
        let mut at = 0;
        for w in &self.lw.qkv {
            let out = MatmulOut {
                row_offset: at,
                stride,
            };
            d.extend(matmul_at(gpu, w, &self.x, n_tok, &self.qkv, out)?);
            at += w.n_rows;
        }
        d.extend(matmul(gpu, &self.lw.wo, &self.attn, n_tok, &self.out)?);
        match &self.lw.gate_up {
            GateUp::Interleaved(w) => d.extend(matmul_glu(
                gpu,
                w,
                &self.x,
                n_tok,
                Activation::Silu,
                &self.ffn,
                &self.pairs,
            )?),
            GateUp::Split { gate, up } => {
                d.extend(matmul(gpu, gate, &self.x, n_tok, &self.pairs)?);
                d.extend(matmul(gpu, up, &self.x, n_tok, &self.pairs)?);
            }
        }
        d.extend(matmul(gpu, &self.lw.down, &self.ffn, n_tok, &self.out)?);
        Ok(d)
    }
}

/// How many times slower than the best so far a shape's first candidate of a kind must be
/// for the shape's other candidates of that kind to be skipped.
const PRUNE: f64 = 3.0;

/// Seconds one run of `reps` repetitions takes.
fn run_secs(gpu: &Gpu, d: &[Dispatch], reps: u32) -> Result<f64, GpuError> {
    let start = Instant::now();
    run_repeated(gpu, d, reps)?;
    Ok(start.elapsed().as_secs_f64())
}

/// How long a measurement runs: `wgllm tune`'s, or a first use's (a model's first load
/// waits for it, so it is shorter and noisier; `wgllm tune` measures again).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Effort {
    /// Seconds of repetitions per timed run.
    pub run_secs: f64,
    /// Timed runs, the fastest kept.
    pub runs: u32,
    /// Time a spread of each kind's candidates, not all (each costs shader compiles,
    /// which dominate a first use on a fresh machine).
    pub sparse: bool,
}

impl Effort {
    pub const FULL: Effort = Effort {
        run_secs: 0.02,
        runs: 3,
        sparse: false,
    };
    pub const FIRST_USE: Effort = Effort {
        run_secs: 0.004,
        runs: 2,
        sparse: true,
    };
}

/// The time of one run of `d`: a warm-up (which compiles the pipelines), then runs of
/// enough repetitions to last `effort.run_secs`, the fastest of `effort.runs`. A
/// candidate 3x slower than `best` (seconds per run) stops after one run: it cannot win.
fn time_dispatches(gpu: &Gpu, d: &[Dispatch], best: f64, effort: Effort) -> Result<f64, GpuError> {
    run_secs(gpu, d, 1)?;
    let once = run_secs(gpu, d, 1)?.max(1e-7);
    if once > 3.0 * best {
        return Ok(once);
    }
    let reps = ((effort.run_secs / once).ceil() as u32).clamp(1, 200);
    let mut fastest = once;
    for _ in 0..effort.runs {
        fastest = fastest.min(run_secs(gpu, d, reps)? / reps as f64);
        if fastest > 3.0 * best || once > 0.5 {
            break;
        }
    }
    Ok(fastest)
}

/// The candidates of one shape: (decode?, name, tuning); `sparse`: the smallest, the
/// largest and a middle one of each kind (`wgllm tune` times them all).
fn candidates(kernels: KernelShape, sparse: bool) -> Vec<(bool, String, KernelTuning)> {
    let mut v = Vec::new();
    let t = KernelTuning::default;
    let gpu_rows: &[u32] = if sparse {
        &[4, 8, 16]
    } else {
        &[2, 4, 8, 16, 32]
    };
    let cpu_decode: &[u32] = if sparse { &[2, 8] } else { &[1, 2, 4, 8] };
    let cpu_prompt: &[(u32, u32)] = if sparse {
        &[(2, 8), (8, 8), (4, 16)]
    } else {
        &[(2, 4), (2, 8), (4, 4), (4, 8), (8, 8), (4, 16)]
    };
    match kernels {
        KernelShape::Gpu => {
            for &rows in gpu_rows {
                let tuning = KernelTuning {
                    gpu_vec_rows: Some(rows),
                    ..t()
                };
                v.push((true, format!("decode rows {rows}"), tuning));
            }
            // The prompt tile follows the matrix and batch sizes (`ops::matmul::gpu_tile`):
            // timing tiles on this 64-token ubatch would choose for that size alone (on an
            // H100 it chose 64x64, which ran 7B pp512 15 % slower than the sized choice).
            v.push((false, "prompt tiles by size".to_string(), t()));
        }
        _ => {
            for &r in cpu_decode {
                let tuning = KernelTuning {
                    cpu_decode_tile: Some((r, 1)),
                    ..t()
                };
                v.push((true, format!("decode {r}x1"), tuning));
            }
            for &(r, tb) in cpu_prompt {
                let tuning = KernelTuning {
                    cpu_prompt_tile: Some((r, tb)),
                    ..t()
                };
                v.push((false, format!("prompt {r}x{tb}"), tuning));
            }
        }
    }
    v
}

/// Times the candidates of both kernel shapes (or of shape `only`) on `gpu` with
/// layer 0 of the model in `f`; `report` sees each time as it is measured. Returns the
/// best of each shape measured.
pub fn measure(
    gpu: &Arc<Gpu>,
    f: &GgufFile,
    hp: &Hparams,
    only: Option<KernelShape>,
    effort: Effort,
    report: &mut dyn FnMut(&CandidateTime),
) -> Result<Vec<ShapeChoice>, GpuError> {
    let layer = LayerRun::new(gpu, f, hp)?;
    let mut out = Vec::new();
    // The fastest so far over both shapes: a candidate far behind it stops early.
    let (mut fastest_decode, mut fastest_prompt) = (f64::MAX, f64::MAX);
    // The shape the adapter type suggests first, so that the cut-off bites early.
    let shapes = if gpu.is_cpu {
        [KernelShape::Cpu, KernelShape::Gpu]
    } else {
        [KernelShape::Gpu, KernelShape::Cpu]
    };
    // A sparse (first-use) measurement times only the shape the adapter type suggests,
    // unless told which: the other has not won on that type of adapter (lavapipe's GPU
    // shape decodes 4-5x slower; an H100's CPU shape several times slower), and its
    // compiles would be most of a first load.
    let n_shapes = if effort.sparse { 1 } else { 2 };
    let chosen: Vec<KernelShape> = match only {
        Some(shape) => vec![shape],
        None => shapes.into_iter().take(n_shapes).collect(),
    };
    for kernels in chosen {
        let mut best = ShapeChoice {
            kernels,
            tuning: KernelTuning::default(),
            decode_us: f64::MAX,
            prompt_us: f64::MAX,
        };
        // A shape whose first candidate of a kind is PRUNE times slower than the best of
        // that kind so far skips its other candidates of that kind (each costs a shader
        // compile and runs): on lavapipe the GPU shape's first decode candidate is 4-5x
        // the CPU shape's best, and pruning there halves a first-use tune on 2 cores.
        let (mut first_decode, mut first_prompt) = (true, true);
        let (mut skip_decode, mut skip_prompt) = (false, false);
        for (decode, name, tuning) in candidates(kernels, effort.sparse) {
            if (decode && skip_decode) || (!decode && skip_prompt) {
                continue;
            }
            let g = gpu.retuned(kernels, tuning.clone());
            let n_tok = if decode { 1 } else { PROMPT_TOKENS };
            let d = layer.dispatches(&g, n_tok)?;
            let so_far = if decode {
                fastest_decode
            } else {
                fastest_prompt
            };
            let secs = time_dispatches(&g, &d, so_far * 1e-6 * n_tok as f64, effort)?;
            let us = secs * 1e6 / n_tok as f64;
            let first = if decode {
                std::mem::replace(&mut first_decode, false)
            } else {
                std::mem::replace(&mut first_prompt, false)
            };
            if first && us > PRUNE * so_far {
                if decode {
                    skip_decode = true;
                } else {
                    skip_prompt = true;
                }
            }
            if decode {
                fastest_decode = fastest_decode.min(us);
            } else {
                fastest_prompt = fastest_prompt.min(us);
            }
            report(&CandidateTime {
                kernels,
                name,
                us_per_token: us,
                decode,
            });
            if decode && us < best.decode_us {
                best.decode_us = us;
                best.tuning.cpu_decode_tile = tuning.cpu_decode_tile;
                best.tuning.gpu_vec_rows = tuning.gpu_vec_rows;
            } else if !decode && us < best.prompt_us {
                best.prompt_us = us;
                best.tuning.cpu_prompt_tile = tuning.cpu_prompt_tile;
                best.tuning.gpu_tile = tuning.gpu_tile;
            }
        }
        out.push(best);
    }
    gpu.check()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first use times a spread of each kind on the suggested shape; `wgllm tune` all.
    #[test]
    fn first_use_times_a_spread_of_the_candidates() {
        let names =
            |k, sparse| -> Vec<String> { candidates(k, sparse).into_iter().map(|c| c.1).collect() };
        assert_eq!(
            names(KernelShape::Cpu, true),
            [
                "decode 2x1",
                "decode 8x1",
                "prompt 2x8",
                "prompt 8x8",
                "prompt 4x16"
            ]
        );
        assert_eq!(names(KernelShape::Cpu, false).len(), 10);
        assert_eq!(names(KernelShape::Gpu, true).len(), 4);
        assert_eq!(names(KernelShape::Gpu, false).len(), 6);
        for k in [KernelShape::Cpu, KernelShape::Gpu] {
            let all = names(k, false);
            assert!(names(k, true).iter().all(|n| all.contains(n)));
        }
    }
}

/// Microseconds per token of the two ways to pick it from a logits row (the default
/// chain, llama.cpp's defaults), as each adds to a decoded token. Drawn on the GPU, the
/// token is the next step's input and the engine decodes ahead, so the host's wait for
/// it overlaps the next step: what it adds is the device's busy time, timed over draws
/// run back to back in one submit (both passes each), less one empty round trip (an
/// 8-byte readback). Read back whole and sampled on the host, the device idles through
/// the whole round trip. `--sampling auto` takes the cheaper. (Timing each GPU draw as
/// its own round trip made `auto` pick the host where decoding ahead is faster.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrawTimes {
    pub gpu_us: f64,
    pub host_us: f64,
    /// The empty round trip (an 8-byte readback) that `gpu_us` leaves out.
    pub trip_us: f64,
}

/// Times [`DrawTimes`] on `gpu` (with its kernel shape) for a vocabulary of `n_vocab`,
/// the fastest of `effort.runs` runs of a few tokens each.
#[cfg(not(target_arch = "wasm32"))]
pub fn measure_draws(gpu: &Gpu, n_vocab: u32, effort: Effort) -> Result<DrawTimes, GpuError> {
    use crate::ops::sample::{cand_bytes, sample, SampleBuffers};
    use crate::sample::{gpu_row, Sampler, SamplerParams, RING_MAX};
    let params = SamplerParams::default();
    let row = gpu_row(&params, n_vocab as usize)
        .map_err(GpuError::Validation)?
        .with_uniform(0.5);
    let mut rng = crate::model::synth::Rng(0x9e37_79b9_7f4a_7c15);
    let logits: Vec<f32> = (0..n_vocab).map(|_| 5.0 * rng.normalish()).collect();
    let buf = |name: &str, bytes: u64| -> Result<View, GpuError> {
        Ok(View::whole(&gpu.storage(name, bytes.max(16))?))
    };
    let logits_buf = buf("tune_logits", n_vocab as u64 * 4)?;
    gpu.write(&logits_buf.buf, 0, bytemuck::cast_slice(&logits));
    let rows = buf("tune_rows", std::mem::size_of_val(&row) as u64)?;
    gpu.write(&rows.buf, 0, bytemuck::bytes_of(&row));
    let (empty, cand, ring, result) = (
        buf("tune_empty", 16)?,
        buf("tune_cand", cand_bytes(n_vocab, 1))?,
        buf("tune_ring", (RING_MAX as u64 + 2) * 4)?,
        buf("tune_result", 8)?,
    );
    let d = sample(
        gpu,
        &SampleBuffers {
            logits: &logits_buf,
            rows: &rows,
            counts: &empty,
            bias: &empty,
            cand: &cand,
            ring: &ring,
            result: &result,
            // No row asks for probabilities: nothing is written there.
            probs: &buf("tune_probs", 16)?,
        },
        n_vocab,
        1,
        row.k,
        RING_MAX,
    )?;
    let mut sampler = Sampler::new(params, n_vocab as usize);
    let tokens = 4;
    let (mut gpu_us, mut host_us, mut trip_us) = (f64::MAX, f64::MAX, f64::MAX);
    // The first round warms up (pipelines, clocks); the fastest of the rest counts.
    for _ in 0..effort.runs.max(1) + 1 {
        let start = Instant::now();
        for _ in 0..tokens {
            gpu.read_bytes(&result.buf, 0, 8)?;
        }
        let trip = start.elapsed().as_secs_f64() * 1e6 / tokens as f64;
        trip_us = trip_us.min(trip);
        // Back to back in one submit, as a draw runs between decode steps when the
        // engine decodes ahead: the device's busy time, less the one round trip.
        let start = Instant::now();
        crate::ops::run_repeated(gpu, &d, tokens)?;
        gpu.read_bytes(&result.buf, 0, 8)?;
        let busy = (start.elapsed().as_secs_f64() * 1e6 - trip).max(0.0) / tokens as f64;
        gpu_us = gpu_us.min(busy);
        let start = Instant::now();
        for _ in 0..tokens {
            let bytes = gpu.read_bytes(&logits_buf.buf, 0, n_vocab as u64 * 4)?;
            let row: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            std::hint::black_box(sampler.sample(&row));
        }
        host_us = host_us.min(start.elapsed().as_secs_f64() * 1e6 / tokens as f64);
    }
    gpu.check()?;
    Ok(DrawTimes {
        gpu_us,
        host_us,
        trip_us,
    })
}
