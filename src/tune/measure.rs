//! Timing the candidate kernel shapes on one device, on one layer of the model itself:
//! its Q/K/V, output, gate/up and down matrices, in the file's own types, for one decoded
//! token and for a prompt ubatch. Only the matmuls are timed: they are ~90 % of a step.

#[cfg(not(target_arch = "wasm32"))]
use super::attn_run::AttnRun;
use super::check::{self, KernelCheck};
use crate::gguf::GgufFile;
use crate::gpu::{Gpu, GpuError, KernelShape, KernelTuning};
use crate::graph::GraphBuilder;
use crate::model::{GateUp, Hparams, LayerWeights};
#[cfg(not(target_arch = "wasm32"))]
use crate::ops::attention::{flash_coop, FlashKernel};
use crate::ops::glu::Activation;
use crate::ops::matmul_q8;
use crate::ops::{run_repeated, Dispatch, View, Weight};
use std::sync::Arc;
use web_time::Instant;

pub use super::PROMPT_TOKENS;

/// One candidate's times: microseconds for the layer's matmuls, per token.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateTime {
    pub kernels: KernelShape,
    /// What the candidate varies, as `WGLLM_*` would name it (`decode 2x1`, `prompt 4x8`,
    /// `decode rows 4`, `prompt tiles by size`).
    pub name: String,
    /// For a decode candidate the time of one token; for a prompt candidate the time of
    /// the ubatch divided by its tokens. `None`: not timed (it failed its check, or only
    /// checks were asked for).
    pub us_per_token: Option<f64>,
    pub decode: bool,
    /// Its check against the portable kernels on the device (`None` where checks cannot
    /// run: in a browser).
    pub check: Option<KernelCheck>,
}

impl CandidateTime {
    /// Its time, or why it has none: `12.3 us per token`, `dropped (normalized error
    /// 4.2e-2 over 1e-3)`, `checked (normalized error 3.1e-6)`.
    pub fn outcome(&self) -> String {
        match (&self.check, self.us_per_token) {
            (Some(c), _) if !c.passed() => format!(
                "dropped (normalized error {:.1e} over {:.0e})",
                c.nmse, c.bound
            ),
            (_, Some(us)) => format!("{us:.1} us per token"),
            (Some(c), None) => format!("checked (normalized error {:.1e})", c.nmse),
            (None, None) => "not timed".into(),
        }
    }
}

/// The best of one kernel shape on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeChoice {
    pub kernels: KernelShape,
    /// The tuned fields (tiles, rows) of the best decode and prompt candidates.
    pub tuning: KernelTuning,
    pub decode_us: f64,
    pub prompt_us: f64,
    /// Every candidate's check on the device, the dropped ones included.
    pub checks: Vec<KernelCheck>,
    /// Candidates not timed because the time budget was spent (left to `wgllm tune`).
    pub left: u32,
}

impl ShapeChoice {
    /// What a token costs, decoded and in a prompt, equally weighted: the number the
    /// shape and backend choices minimise.
    pub fn score(&self) -> f64 {
        self.decode_us + self.prompt_us
    }
}

/// The layer's buffers and the dispatches of its matmuls for `n_tok` tokens. Each
/// product has an output of its own, so that a check sees every one.
struct LayerRun {
    lw: LayerWeights,
    /// The feed-forward timed: the layer's own, or a mixture of experts' first expert.
    gate_up: GateUp,
    down: Arc<Weight>,
    /// Inputs: the layer's input, the attention output, the FFN's activation (written by
    /// a fused gate/up product, else random).
    x: View,
    attn: View,
    ffn: View,
    /// Outputs: Q/K/V stacked, the attention output's product, the gate/up pairs (or the
    /// gate's product, with `up` the up's), the down product.
    qkv: View,
    wo_out: View,
    pairs: View,
    up: View,
    down_out: View,
    /// Values per row of x (the model's width).
    n_embd: u32,
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
        let (gate_up, down) = lw.ffn.dense();
        let n_ff = match &gate_up {
            GateUp::Interleaved(w) => w.n_rows / 2,
            GateUp::Split { up, .. } => up.n_rows,
        };
        Ok(LayerRun {
            x: buf("tune_x", hp.n_embd as u64)?,
            attn: buf("tune_attn", lw.wo.n_cols as u64)?,
            ffn: buf("tune_ffn", down.n_cols.max(n_ff) as u64)?,
            qkv: buf("tune_qkv", qkv_rows as u64)?,
            wo_out: buf("tune_wo_out", lw.wo.n_rows as u64)?,
            pairs: buf("tune_pairs", 2 * n_ff as u64)?,
            up: buf("tune_up", n_ff as u64)?,
            down_out: buf("tune_down_out", down.n_rows as u64)?,
            n_embd: hp.n_embd,
            lw,
            gate_up,
            down,
        })
    }

    /// Every weight of the layer: whether the integer-dot kernel takes any.
    fn takes_int_dot(&self) -> bool {
        let mut ws: Vec<&Weight> = self.lw.qkv.iter().map(|w| &**w).collect();
        ws.push(&self.lw.wo);
        ws.push(&self.down);
        match &self.gate_up {
            GateUp::Interleaved(w) => ws.push(w),
            GateUp::Split { gate, up } => ws.extend([&**gate, &**up]),
        }
        ws.into_iter().any(matmul_q8::takes)
    }

    /// The layer's products for `n_tok` tokens as the graph builder records them on
    /// `gpu` (with its tuning): the same kernels, the integer-dot choice and each input
    /// quantized once, that a model's graph takes.
    fn dispatches(&self, gpu: &Arc<Gpu>, n_tok: u32) -> Result<Vec<Dispatch>, GpuError> {
        let mut b = GraphBuilder::new_on(gpu.clone());
        let tensor = |b: &mut GraphBuilder, v: &View, rows: u32| b.input(v.clone(), [rows, n_tok]);
        let stride: u32 = self.lw.qkv.iter().map(|w| w.n_rows).sum();
        let x = tensor(&mut b, &self.x, self.n_embd);
        let qkv = tensor(&mut b, &self.qkv, stride);
        let mut at = 0;
        for w in &self.lw.qkv {
            b.matmul_rows_into(w, x, qkv, at);
            at += w.n_rows;
        }
        let wo = &self.lw.wo;
        let attn = tensor(&mut b, &self.attn, wo.n_cols);
        let wo_out = tensor(&mut b, &self.wo_out, wo.n_rows);
        b.matmul_into(wo, attn, wo_out);
        let ffn = tensor(&mut b, &self.ffn, self.down.n_cols);
        match &self.gate_up {
            GateUp::Interleaved(w) => b.matmul_glu_into(w, x, Activation::Silu, ffn)?,
            GateUp::Split { gate, up } => {
                let gate_out = tensor(&mut b, &self.pairs, gate.n_rows);
                let up_out = tensor(&mut b, &self.up, up.n_rows);
                b.matmul_into(gate, x, gate_out);
                b.matmul_into(up, x, up_out);
            }
        }
        let down_out = tensor(&mut b, &self.down_out, self.down.n_rows);
        b.matmul_into(&self.down, ffn, down_out);
        b.build()?.into_dispatches()
    }

    /// Random inputs (the same for every `seed`) and outputs all NaN (so that a kernel
    /// that leaves an output unwritten fails), written before each check.
    #[cfg(not(target_arch = "wasm32"))]
    fn fill(&self, gpu: &Gpu, seed: u64) {
        let mut rng = crate::model::synth::Rng(seed);
        for v in [&self.x, &self.attn, &self.ffn] {
            let n = (v.size / 4) as usize;
            let data: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
            gpu.write(&v.buf, v.offset, bytemuck::cast_slice(&data));
        }
        for v in [
            &self.qkv,
            &self.wo_out,
            &self.pairs,
            &self.up,
            &self.down_out,
        ] {
            let nan = vec![f32::NAN; (v.size / 4) as usize];
            gpu.write(&v.buf, v.offset, bytemuck::cast_slice(&nan));
        }
    }

    /// The outputs of `n_tok` tokens, product by product.
    #[cfg(not(target_arch = "wasm32"))]
    fn outputs(&self, gpu: &Gpu, n_tok: u32) -> Result<Vec<Vec<f32>>, GpuError> {
        let stride: u32 = self.lw.qkv.iter().map(|w| w.n_rows).sum();
        let n_ff = self.up.size / 4 / PROMPT_TOKENS as u64;
        let split = matches!(self.gate_up, GateUp::Split { .. });
        let mut outs = vec![
            (&self.qkv, stride as u64),
            (&self.wo_out, self.lw.wo.n_rows as u64),
            (&self.down_out, self.down.n_rows as u64),
        ];
        if split {
            outs.push((&self.pairs, n_ff));
            outs.push((&self.up, n_ff));
        } else {
            outs.push((&self.ffn, n_ff));
        }
        outs.into_iter()
            .map(|(v, rows)| {
                let bytes = gpu.read_bytes(&v.buf, v.offset, rows * n_tok as u64 * 4)?;
                Ok(bytemuck::pod_collect_to_vec(&bytes))
            })
            .collect()
    }

    /// The outputs of `d` on the inputs of `seed`.
    #[cfg(not(target_arch = "wasm32"))]
    fn run_on_random(
        &self,
        gpu: &Gpu,
        d: &[Dispatch],
        n_tok: u32,
        seed: u64,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        self.fill(gpu, seed);
        run_repeated(gpu, d, 1)?;
        self.outputs(gpu, n_tok)
    }
}

/// The seed of the checks' random inputs.
#[cfg(not(target_arch = "wasm32"))]
const CHECK_SEED: u64 = 0x5eed_c4ec_0000_0001;

/// The portable kernels' outputs of the layer for one decoded token and for a prompt
/// ubatch, on the device under test: what every candidate is checked against. Where a
/// candidate could change the attention kernel too (the cooperative-matrix switch takes
/// the flash attention onto the matrices), the portable attention's output as well.
#[cfg(not(target_arch = "wasm32"))]
struct Reference {
    decode: Vec<Vec<f32>>,
    prompt: Vec<Vec<f32>>,
    attn: Option<(AttnRun, Vec<f32>)>,
}

#[cfg(not(target_arch = "wasm32"))]
impl Reference {
    fn new(gpu: &Gpu, layer: &LayerRun, hp: &Hparams) -> Result<Self, GpuError> {
        let plain = gpu.retuned(KernelShape::Cpu, KernelTuning::default());
        let run = |n_tok| {
            let d = layer.dispatches(&plain, n_tok)?;
            layer.run_on_random(&plain, &d, n_tok, CHECK_SEED)
        };
        let coop = KernelTuning {
            coop_matrix: Some(true),
            ..Default::default()
        };
        let coop_flash = flash_coop(&gpu.retuned(KernelShape::Gpu, coop));
        let heads = (hp.head_dim, hp.n_head, hp.n_head_kv);
        let attn = match AttnRun::new(gpu, heads, hp.attn_scale, CHECK_SEED)? {
            Some(a) if coop_flash => {
                let want = a.output(&plain, false, FlashKernel::Plain)?;
                Some((a, want))
            }
            _ => None,
        };
        Ok(Reference {
            decode: run(1)?,
            prompt: run(PROMPT_TOKENS)?,
            attn,
        })
    }
}

/// Runs candidate `name` (dispatches `d` on `gpu`) on the check's inputs and compares it
/// with the reference.
#[cfg(not(target_arch = "wasm32"))]
fn check_candidate(
    gpu: &Gpu,
    layer: &LayerRun,
    reference: &Reference,
    kernels: KernelShape,
    name: &str,
    decode: bool,
    d: &[Dispatch],
) -> Result<KernelCheck, GpuError> {
    let n_tok = if decode { 1 } else { PROMPT_TOKENS };
    let mut got = layer.run_on_random(gpu, d, n_tok, CHECK_SEED)?;
    let mut want = if decode {
        reference.decode.clone()
    } else {
        reference.prompt.clone()
    };
    // A prompt candidate that takes flash attention onto other kernels: that too.
    let fk = FlashKernel::for_gpu(gpu);
    if let (false, Some((run, attn_want)), FlashKernel::Coop { .. }) = (decode, &reference.attn, fk)
    {
        got.push(run.output(gpu, true, fk)?);
        want.push(attn_want.clone());
    }
    let name = format!("{kernels} {name}");
    Ok(KernelCheck::new(name, check::worst_nmse(&want, &got)))
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
    /// Time a spread of each kind's candidates, most promising first, not all (each
    /// costs shader compiles, which dominate a first use on a fresh machine).
    pub sparse: bool,
    /// Seconds of measuring after which no further candidate of a kind already timed
    /// starts (and the GPU draw is not timed): a first use waits about this long
    /// whatever the device, and leaves the rest to `wgllm tune`. Compiling the
    /// candidates' kernels counts: on a slow device with cold driver caches it is most of
    /// the time.
    pub budget_secs: Option<f64>,
    /// How many times the best time so far a candidate's first run may take and still
    /// be timed further (its other runs could not make it win).
    pub behind: f64,
}

impl Effort {
    pub const FULL: Effort = Effort {
        run_secs: 0.02,
        runs: 3,
        sparse: false,
        budget_secs: None,
        behind: 3.0,
    };
    pub const FIRST_USE: Effort = Effort {
        run_secs: 0.01,
        runs: 3,
        sparse: true,
        budget_secs: Some(2.0),
        behind: 1.5,
    };

    /// Whether the budget is spent `since` a measurement began, or would be by a
    /// further step of `next_secs`.
    pub fn spent(&self, since: Instant, next_secs: f64) -> bool {
        self.budget_secs
            .is_some_and(|b| since.elapsed().as_secs_f64() + next_secs > b)
    }
}

/// The time of one run of `d`: a warm-up (which compiles the pipelines), then runs of
/// enough repetitions to last `effort.run_secs`, the fastest of `effort.runs`. A
/// candidate `effort.behind` times slower than `best` (seconds per run) stops after one
/// run: it cannot win.
fn time_dispatches(gpu: &Gpu, d: &[Dispatch], best: f64, effort: Effort) -> Result<f64, GpuError> {
    run_secs(gpu, d, 1)?;
    let once = run_secs(gpu, d, 1)?.max(1e-7);
    if once > effort.behind * best {
        return Ok(once);
    }
    let reps = ((effort.run_secs / once).ceil() as u32).clamp(1, 200);
    let mut fastest = once;
    for _ in 0..effort.runs {
        fastest = fastest.min(run_secs(gpu, d, reps)? / reps as f64);
        if fastest > effort.behind * best || once > 0.5 {
            break;
        }
    }
    Ok(fastest)
}

/// The candidates of one shape: (decode?, name, tuning). `sparse` (a first use): the
/// built-in choice of each kind first, then the others most likely to beat it (on the
/// hosts measured so far: bigger register tiles on CPU adapters, more rows per workgroup
/// on GPUs), decode and prompt candidates taking turns, so that a time budget cuts
/// both kinds alike. `wgllm tune` times them all.
fn candidates(kernels: KernelShape, sparse: bool) -> Vec<(bool, String, KernelTuning)> {
    let t = KernelTuning::default;
    let gpu_rows: &[u32] = if sparse {
        &[4, 8, 16]
    } else {
        &[2, 4, 8, 16, 32]
    };
    let cpu_decode: &[u32] = if sparse { &[2, 8, 4] } else { &[1, 2, 4, 8] };
    let cpu_prompt: &[(u32, u32)] = if sparse {
        &[(4, 8), (4, 16), (8, 8), (2, 8)]
    } else {
        &[(2, 4), (2, 8), (4, 4), (4, 8), (8, 8), (4, 16)]
    };
    let (decode, prompt): (Vec<_>, Vec<_>) = match kernels {
        KernelShape::Gpu => (
            gpu_rows
                .iter()
                .map(|&rows| {
                    let tuning = KernelTuning {
                        gpu_vec_rows: Some(rows),
                        ..t()
                    };
                    (true, format!("decode rows {rows}"), tuning)
                })
                .collect(),
            // The prompt tile follows the matrix and batch sizes (`ops::matmul::gpu_tile`):
            // timing tiles on this 64-token ubatch would choose for that size alone (on an
            // H100 it chose 64x64, which ran 7B pp512 15 % slower than the sized choice).
            vec![(false, "prompt tiles by size".to_string(), t())],
        ),
        _ => (
            cpu_decode
                .iter()
                .map(|&r| {
                    let tuning = KernelTuning {
                        cpu_decode_tile: Some((r, 1)),
                        ..t()
                    };
                    (true, format!("decode {r}x1"), tuning)
                })
                .collect(),
            cpu_prompt
                .iter()
                .map(|&(r, tb)| {
                    let tuning = KernelTuning {
                        cpu_prompt_tile: Some((r, tb)),
                        ..t()
                    };
                    (false, format!("prompt {r}x{tb}"), tuning)
                })
                .collect(),
        ),
    };
    if !sparse {
        return decode.into_iter().chain(prompt).collect();
    }
    let mut v = Vec::new();
    let (mut d, mut p) = (decode.into_iter(), prompt.into_iter());
    loop {
        match (d.next(), p.next()) {
            (None, None) => return v,
            (a, b) => v.extend(a.into_iter().chain(b)),
        }
    }
}

/// Whether the integer-dot candidates are timed (after checking): where the layer has a
/// weight they multiply, and checks can run (not in a browser, which cannot wait for a
/// readback); then when the user forces them (`WGLLM_INT_DOT=1`: they are checked before
/// use), in `wgllm tune`, and at first use on GPUs (on CPU adapters they are GPU-shaped
/// kernels, several times slower: lavapipe decodes SmolLM2 7x slower with them).
fn offer_int_dot(gpu: &Gpu, layer: &LayerRun, user: Option<bool>, effort: Effort) -> bool {
    let can = layer.takes_int_dot() && cfg!(not(target_arch = "wasm32"));
    can && match user {
        Some(forced) => forced,
        None => !effort.sparse || !gpu.is_cpu,
    }
}

/// The candidates beside a shape's own tiles: the integer-dot matmuls for decoding and
/// prompts (where `int_dot`), and on GPU-shaped kernels the cooperative-matrix prompt
/// matmul where the device has the matrices it needs (it comes last, so that it wins
/// prompts only against the best of the others). Their tunings hold only the switch; the
/// tiles come from the shape's best when they are timed.
fn extra_candidates(
    gpu: &Gpu,
    kernels: KernelShape,
    int_dot: bool,
) -> Vec<(bool, String, KernelTuning)> {
    let mut v = Vec::new();
    if int_dot {
        let on = KernelTuning {
            int_dot: Some(true),
            ..Default::default()
        };
        v.push((true, format!("decode {}", check::INT_DOT), on.clone()));
        v.push((false, format!("prompt {}", check::INT_DOT), on));
    }
    let coop = kernels == KernelShape::Gpu && gpu.coop_size.is_some();
    if coop && cfg!(not(target_arch = "wasm32")) {
        let on = KernelTuning {
            coop_matrix: Some(true),
            ..Default::default()
        };
        v.push((false, format!("prompt {}", check::COOP), on));
    }
    v
}

/// Times the candidates of both kernel shapes (or of shape `only`) on `gpu` with
/// layer 0 of the model in `f`, each checked first against the portable kernels (see
/// [`super::check`]; a candidate that fails is dropped untimed); `report` sees each
/// candidate as it is checked and measured. `user_int_dot` is the user's
/// `WGLLM_INT_DOT`, which decides whether integer-dot candidates are offered (see
/// [`offer_int_dot`]). Returns the best of each shape measured.
///
/// With a time budget (`effort.budget_secs`, counted from `start`), once it is spent no
/// further candidate of a kind that has a time starts: the shape's first candidate of
/// each kind (the built-in choice) is always timed.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    gpu: &Arc<Gpu>,
    f: &GgufFile,
    hp: &Hparams,
    only: Option<KernelShape>,
    effort: Effort,
    start: Instant,
    user_int_dot: Option<bool>,
    report: &mut dyn FnMut(&CandidateTime),
) -> Result<Vec<ShapeChoice>, GpuError> {
    let layer = LayerRun::new(gpu, f, hp)?;
    // The portable kernels' first runs: mostly compiling, on a cold driver cache.
    #[cfg(not(target_arch = "wasm32"))]
    let reference = {
        let compiled = crate::gpu::compile_secs();
        let t = Instant::now();
        let r = Reference::new(gpu, &layer, hp)?;
        let counted = crate::gpu::compile_secs() - compiled;
        crate::gpu::add_compile_secs(t.elapsed().as_secs_f64() - counted);
        r
    };
    let int_dot = offer_int_dot(gpu, &layer, user_int_dot, effort);
    let mut out = Vec::new();
    // Wall time of the candidates timed so far (checks, compiles, runs), for the budget.
    let (mut candidates_secs, mut n_timed) = (0.0, 0u32);
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
            checks: Vec::new(),
            left: 0,
        };
        // A shape whose first candidate of a kind is PRUNE times slower than the best of
        // that kind so far skips its other candidates of that kind (each costs a shader
        // compile and runs): on lavapipe the GPU shape's first decode candidate is 4-5x
        // the CPU shape's best, and pruning there halves a first-use tune on 2 cores.
        let (mut first_decode, mut first_prompt) = (true, true);
        let (mut skip_decode, mut skip_prompt) = (false, false);
        let mut list = candidates(kernels, effort.sparse);
        let n_plain = list.len();
        list.extend(extra_candidates(gpu, kernels, int_dot));
        for (i, (decode, name, mut tuning)) in list.into_iter().enumerate() {
            // The integer-dot and cooperative-matrix kernels, after the shape's own.
            let is_extra = i >= n_plain;
            let is_int_dot = name.ends_with(check::INT_DOT);
            if is_extra {
                // On the shape's best tiles, for the products they do not take, with
                // only their own switch on.
                tuning = KernelTuning {
                    int_dot: tuning.int_dot,
                    coop_matrix: tuning.coop_matrix,
                    int_dot_decode: None,
                    int_dot_prompt: None,
                    ..best.tuning.clone()
                };
            } else if (decode && skip_decode) || (!decode && skip_prompt) {
                continue;
            }
            let timed = if decode {
                best.decode_us < f64::MAX
            } else {
                best.prompt_us < f64::MAX
            };
            // A candidate starts only where it should end within the budget, at the
            // mean of those so far (most of which is compiling, on a slow device).
            let mean = if n_timed > 0 {
                candidates_secs / n_timed as f64
            } else {
                0.0
            };
            // Integer-dot kernels the user asked for (WGLLM_INT_DOT=1) are checked
            // whatever the budget: they run unless their check on this device fails,
            // so an unchecked one would run unseen (a loaded machine's first use
            // spent the budget before them, and broken kernels answered).
            let asked = is_int_dot && user_int_dot == Some(true);
            if (timed || is_extra) && !asked && effort.spent(start, mean) {
                best.left += 1;
                continue;
            }
            let began = Instant::now();
            let g = gpu.retuned(kernels, tuning.clone());
            let n_tok = if decode { 1 } else { PROMPT_TOKENS };
            // A candidate whose kernels the device's compiler refuses (FXC's loop limits on
            // DX12, a driver's bug) is dropped, as one that fails its check is: the
            // portable kernels, and so the reference, compiled already.
            let dropped = |e: &GpuError| {
                log::warn!(
                    "tuning on {}: dropped the {kernels} {name} kernels, which this device does not compile: {}",
                    gpu.info.name,
                    e.to_string().lines().next().unwrap_or_default()
                );
            };
            let d = match layer.dispatches(&g, n_tok) {
                Err(e @ GpuError::Shader { .. }) => {
                    dropped(&e);
                    continue;
                }
                r => r?,
            };
            // The check is the candidate's first dispatch: where a driver that compiles at
            // first use (lavapipe's LLVM) compiles; beyond two runs, that counts as such.
            let checking = Instant::now();
            #[cfg(not(target_arch = "wasm32"))]
            let check = match check_candidate(&g, &layer, &reference, kernels, &name, decode, &d) {
                Err(e @ GpuError::Shader { .. }) => {
                    dropped(&e);
                    continue;
                }
                r => Some(r?),
            };
            let check_secs = checking.elapsed().as_secs_f64();
            #[cfg(target_arch = "wasm32")]
            let check: Option<KernelCheck> = None;
            if let Some(c) = &check {
                best.checks.push(c.clone());
                if !c.passed() {
                    log::warn!(
                        "tuning on {}: dropped the {} kernels, which differ from the portable ones on this device (normalized error {:.1e}, bound {:.0e})",
                        gpu.info.name,
                        c.name,
                        c.nmse,
                        c.bound
                    );
                    report(&CandidateTime {
                        kernels,
                        name,
                        us_per_token: None,
                        decode,
                        check,
                    });
                    continue;
                }
            }
            let so_far = if decode {
                fastest_decode
            } else {
                fastest_prompt
            };
            let secs = time_dispatches(&g, &d, so_far * 1e-6 * n_tok as f64, effort)?;
            crate::gpu::add_compile_secs(check_secs - 2.0 * secs);
            let us = secs * 1e6 / n_tok as f64;
            candidates_secs += began.elapsed().as_secs_f64();
            n_timed += 1;
            if !is_extra {
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
            }
            if decode {
                fastest_decode = fastest_decode.min(us);
            } else {
                fastest_prompt = fastest_prompt.min(us);
            }
            report(&CandidateTime {
                kernels,
                name,
                us_per_token: Some(us),
                decode,
                check,
            });
            if is_extra {
                let wins = if decode {
                    us < best.decode_us
                } else {
                    us < best.prompt_us
                };
                match (is_int_dot, decode) {
                    (true, true) => best.tuning.int_dot_decode = Some(wins),
                    (true, false) => best.tuning.int_dot_prompt = Some(wins),
                    (false, _) => best.tuning.coop_matrix = Some(wins),
                }
                // One prompt kernel wins: a later winner turns an earlier one off.
                if wins && !decode && !is_int_dot && best.tuning.int_dot_prompt.is_some() {
                    best.tuning.int_dot_prompt = Some(false);
                }
                if decode {
                    best.decode_us = best.decode_us.min(us);
                } else {
                    best.prompt_us = best.prompt_us.min(us);
                }
            } else if decode && us < best.decode_us {
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

/// Checks every candidate of both kernel shapes (the integer-dot ones too, where the
/// layer has weights they take) against the portable kernels on `gpu`, timing none:
/// `wgllm tune --check`. `report` sees each check.
#[cfg(not(target_arch = "wasm32"))]
pub fn check_all(
    gpu: &Arc<Gpu>,
    f: &GgufFile,
    hp: &Hparams,
    report: &mut dyn FnMut(&CandidateTime),
) -> Result<Vec<KernelCheck>, GpuError> {
    let layer = LayerRun::new(gpu, f, hp)?;
    let reference = Reference::new(gpu, &layer, hp)?;
    let mut checks = Vec::new();
    for kernels in [KernelShape::Cpu, KernelShape::Gpu] {
        let mut list = candidates(kernels, false);
        list.extend(extra_candidates(gpu, kernels, layer.takes_int_dot()));
        for (decode, name, tuning) in list {
            let g = gpu.retuned(kernels, tuning);
            let n_tok = if decode { 1 } else { PROMPT_TOKENS };
            let d = layer.dispatches(&g, n_tok)?;
            let c = check_candidate(&g, &layer, &reference, kernels, &name, decode, &d)?;
            report(&CandidateTime {
                kernels,
                name,
                us_per_token: None,
                decode,
                check: Some(c.clone()),
            });
            checks.push(c);
        }
    }
    gpu.check()?;
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first use times a spread of each kind on the suggested shape, the built-in
    /// choices first and the kinds taking turns (so a time budget cuts both alike);
    /// `wgllm tune` all.
    #[test]
    fn first_use_times_a_spread_of_the_candidates() {
        let names =
            |k, sparse| -> Vec<String> { candidates(k, sparse).into_iter().map(|c| c.1).collect() };
        assert_eq!(
            names(KernelShape::Cpu, true),
            [
                "decode 2x1",
                "prompt 4x8",
                "decode 8x1",
                "prompt 4x16",
                "decode 4x1",
                "prompt 8x8",
                "prompt 2x8"
            ]
        );
        // The built-in choices come first.
        let builtin = KernelTuning::default();
        assert_eq!(
            crate::ops::matmul::tile(&builtin, 1, false),
            (2, 1),
            "decode 2x1 is the default"
        );
        assert_eq!(crate::ops::matmul::tile(&builtin, 64, false), (4, 8));
        assert_eq!(
            crate::ops::matmul::gpu_vec_rows(&builtin),
            4,
            "decode rows 4 is the default"
        );
        assert_eq!(
            names(KernelShape::Gpu, true),
            [
                "decode rows 4",
                "prompt tiles by size",
                "decode rows 8",
                "decode rows 16"
            ]
        );
        assert_eq!(names(KernelShape::Cpu, false).len(), 10);
        assert_eq!(names(KernelShape::Gpu, false).len(), 6);
        for k in [KernelShape::Cpu, KernelShape::Gpu] {
            let all = names(k, false);
            assert!(names(k, true).iter().all(|n| all.contains(n)));
        }
    }

    /// A first use's budget: a further step starts only where it would end within it;
    /// `wgllm tune` has none.
    #[test]
    fn the_first_use_budget_counts_the_next_step() {
        let start = Instant::now();
        let b = Effort::FIRST_USE
            .budget_secs
            .expect("a first use has a budget");
        assert!(!Effort::FIRST_USE.spent(start, 0.0));
        assert!(!Effort::FIRST_USE.spent(start, b * 0.5));
        assert!(Effort::FIRST_USE.spent(start, b * 1.01));
        assert!(!Effort::FULL.spent(start, 1e9));
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
