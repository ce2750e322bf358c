//! llama-bench on the engine: every combination of models, backends, batch sizes and
//! tests (pp: a prompt of n tokens; tg: n tokens generated one at a time; pg: both, in
//! that order), each at a depth of tokens already cached, timed over repetitions after
//! one untimed warm-up. A model, backend and batch combination is loaded once for all
//! its tests. Front ends (`wgllm bench`, the desktop app) get [`BenchEvent`]s and print
//! or draw them; the formats ([`report`]) and the plot ([`plot`]) live here too.

pub mod image;
pub mod list;
pub mod plot;
pub mod report;

pub use crate::graph::{OpProfile, StepProfile, TimingSource};
pub use report::{BenchRow, MdColumns, OutputFormat, Writer};

use crate::context::{Batch, Context};
use crate::engine::{Engine, EngineError, EngineOptions};
use crate::gguf::GgufFile;
use crate::gpu::Backend;
use crate::kv::KvConfig;
use std::path::PathBuf;
use web_time::Instant;

/// One test of an instance: its sizes and repetitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestSpec {
    pub n_prompt: u32,
    pub n_gen: u32,
    pub n_depth: u32,
    pub reps: u32,
}

impl TestSpec {
    /// Cells the test fills: depth, prompt and generated tokens.
    pub fn n_ctx(&self) -> u32 {
        self.n_depth + self.n_prompt + self.n_gen
    }
    /// `pp512`, `tg128 @ d4096`, ...
    pub fn name(&self) -> String {
        report::test_name(self.n_prompt, self.n_gen, self.n_depth)
    }
}

/// What to benchmark: every value of every list is combined with every other
/// (llama-bench's comma lists and ranges; see [`list`]).
#[derive(Clone, Debug)]
pub struct BenchPlan {
    pub models: Vec<PathBuf>,
    pub backends: Vec<Backend>,
    pub n_batch: Vec<u32>,
    pub n_ubatch: Vec<u32>,
    /// Cache types and flash attention (`-ctk`, `-ctv`, `-fa`): one load each.
    pub cache: Vec<KvConfig>,
    /// pp tests (0 skips), tg tests (0 skips), pg pairs.
    pub n_prompt: Vec<u32>,
    pub n_gen: Vec<u32>,
    pub pg: Vec<(u32, u32)>,
    pub n_depth: Vec<u32>,
    pub reps: Vec<u32>,
    /// Profile a pp and a tg step per model and backend.
    pub profile: bool,
    /// Speculative decoding in the tg tests (`-md`): a draft model proposes, and each
    /// tg test generates from a text prompt instead of feeding random tokens.
    pub draft: Option<DraftPlan>,
    /// Adapters of the backend's list to split the models over (`--device A,B`): with
    /// two or more, each of `splits` is one load.
    pub devices: Vec<usize>,
    /// Which of `devices` holds the embeddings, the head and sampling (`-mg`), and with
    /// `-sm none` the whole model.
    pub main_gpu: usize,
    /// `-sm` × `-ts`: how each load splits the model over `devices`.
    pub splits: Vec<BenchSplit>,
    /// Everything else about loading: `n_ctx` is a floor (the tests' own need decides
    /// otherwise), `gpu.backend` is replaced by each of `backends`.
    pub base: EngineOptions,
}

/// One split of a benchmark: by layers with these shares (empty: equal), or none (the
/// main device alone).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BenchSplit {
    pub layer: bool,
    pub shares: Vec<f32>,
}

impl BenchSplit {
    /// llama-bench's `split_mode` field.
    pub fn mode(&self) -> &'static str {
        match self.layer {
            true => "layer",
            false => "none",
        }
    }

    /// llama-bench's `tensor_split` field: `3/1`, or `0` for even.
    pub fn shares_label(&self) -> String {
        match self.shares.is_empty() {
            true => "0".into(),
            false => (self.shares.iter().map(|s| format!("{s}")))
                .collect::<Vec<_>>()
                .join("/"),
        }
    }
}

impl Default for BenchPlan {
    /// llama-bench's defaults: pp512 and tg128, five repetitions, -b 2048, -ub 512.
    fn default() -> Self {
        BenchPlan {
            models: Vec::new(),
            backends: vec![Backend::Auto],
            n_batch: vec![2048],
            n_ubatch: vec![512],
            cache: vec![KvConfig::default()],
            n_prompt: vec![512],
            n_gen: vec![128],
            pg: Vec::new(),
            n_depth: vec![0],
            reps: vec![5],
            profile: false,
            draft: None,
            devices: Vec::new(),
            main_gpu: 0,
            splits: vec![BenchSplit {
                layer: true,
                shares: Vec::new(),
            }],
            base: EngineOptions {
                n_ctx: 0,
                ..EngineOptions::default()
            },
        }
    }
}

/// The draft model of the tg tests, how much it proposes, and the text they continue:
/// a speculative tg test generates `n_gen` tokens greedily (end-of-generation tokens
/// banned, so each repetition generates them all) after the prompt, timed from its first
/// generated token to its last, drafting included. Random tokens, as llama-bench feeds,
/// would leave the draft nothing to predict.
#[derive(Clone, Debug)]
pub struct DraftPlan {
    pub model: PathBuf,
    pub params: crate::engine::SpecParams,
    pub prompt: String,
}

/// A prompt for speculative tg tests that has something to predict.
pub const DRAFT_PROMPT: &str = "Write a Python function that returns the n-th Fibonacci number, with a docstring and three examples of its use.";

/// The tests sharing one loaded engine.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub model: PathBuf,
    pub backend: Backend,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub cache: KvConfig,
    /// How the model is split over the plan's devices (unused with fewer than two).
    pub split: BenchSplit,
    pub tests: Vec<TestSpec>,
}

impl BenchPlan {
    /// The tests of one load, in llama-bench's order: per depth and repetition count,
    /// the pp tests, then tg, then pg.
    fn tests(&self) -> Vec<TestSpec> {
        let mut out = Vec::new();
        for &n_depth in &self.n_depth {
            for &reps in &self.reps {
                let t = |n_prompt, n_gen| TestSpec {
                    n_prompt,
                    n_gen,
                    n_depth,
                    reps,
                };
                out.extend(self.n_prompt.iter().filter(|&&p| p > 0).map(|&p| t(p, 0)));
                out.extend(self.n_gen.iter().filter(|&&n| n > 0).map(|&n| t(0, n)));
                out.extend(
                    self.pg
                        .iter()
                        .filter(|pg| pg.0 + pg.1 > 0)
                        .map(|&(p, n)| t(p, n)),
                );
            }
        }
        out
    }

    /// Every load with its tests: models × backends × splits × batch × ubatch × cache.
    pub fn instances(&self) -> Vec<Instance> {
        let tests = self.tests();
        let splits = match self.devices.len() >= 2 {
            true => self.splits.clone(),
            false => vec![BenchSplit::default()],
        };
        let mut out = Vec::new();
        for m in &self.models {
            for &backend in &self.backends {
                for split in &splits {
                    for &n_batch in &self.n_batch {
                        for &n_ubatch in &self.n_ubatch {
                            for &cache in &self.cache {
                                out.push(Instance {
                                    model: m.clone(),
                                    backend,
                                    n_batch,
                                    n_ubatch,
                                    cache,
                                    split: split.clone(),
                                    tests: tests.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Whether the loads split models over several devices.
    pub fn splits_devices(&self) -> bool {
        self.devices.len() >= 2
    }

    /// Checks the plan before anything loads.
    pub fn validate(&self) -> Result<(), String> {
        let empty = |name: &str, len: usize| {
            if len == 0 {
                Err(format!("{name} has no values"))
            } else {
                Ok(())
            }
        };
        empty("-m", self.models.len())?;
        empty("--backend", self.backends.len())?;
        empty("-b", self.n_batch.len())?;
        empty("-ub", self.n_ubatch.len())?;
        empty("-ctk/-ctv/-fa", self.cache.len())?;
        empty("-d", self.n_depth.len())?;
        empty("-r", self.reps.len())?;
        if self.n_batch.contains(&0) || self.n_ubatch.contains(&0) {
            return Err("batch sizes (-b, -ub) must be positive".into());
        }
        if self.reps.contains(&0) {
            return Err("-r must be at least 1 (a warm-up run precedes the timed ones)".into());
        }
        if self.tests().is_empty() {
            return Err("no tests: every -p, -n and -pg value is 0".into());
        }
        if !self.devices.is_empty() {
            if self.backends.len() != 1 {
                return Err(
                    "--device indexes one backend's adapter list: give one --backend with it"
                        .into(),
                );
            }
            if self.main_gpu >= self.devices.len() {
                return Err(format!(
                    "-mg {}: the main GPU indexes the {} --device adapter(s)",
                    self.main_gpu,
                    self.devices.len()
                ));
            }
            empty("-sm", self.splits.len())?;
            for s in &self.splits {
                if !s.shares.is_empty() && s.shares.len() != self.devices.len() {
                    return Err(format!(
                        "-ts {}: give one share per --device adapter ({}), as 3/1",
                        s.shares_label(),
                        self.devices.len()
                    ));
                }
            }
        }
        if self.draft.is_some() {
            if self.n_depth.iter().any(|&d| d > 0) {
                return Err("-md: a speculative tg test generates from a text prompt on an empty cache, so -d takes 0 only".into());
            }
            if !self.pg.is_empty() {
                return Err(
                    "-md: a speculative test is a tg test; -pg is not taken with it".into(),
                );
            }
        }
        Ok(())
    }
}

/// Where a benchmark is, for progress lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Warmup,
    /// Timed repetition `i` (1-based) of `n`.
    Rep(u32, u32),
}

/// A model and backend's profile (`--profile`): a pp and a tg step timed per op.
#[derive(Clone, Debug)]
pub struct ModelProfile {
    pub model_type: String,
    pub backend: String,
    pub adapter: String,
    /// The pp step (the first pp or pg test's prompt, at most one ubatch) and one
    /// decoded token, both on an empty cache.
    pub pp: Option<StepProfile>,
    pub tg: Option<StepProfile>,
}

/// What a benchmark reports as it goes.
pub enum BenchEvent<'a> {
    /// A model is being loaded on a backend: bytes uploaded of total.
    Loading {
        model: &'a std::path::Path,
        backend: Backend,
        done: u64,
        total: u64,
    },
    /// Test `index` (1-based) of `total` is at `stage`.
    Progress {
        index: usize,
        total: usize,
        test: &'a str,
        stage: Stage,
    },
    /// A model and backend was profiled (before its tests run).
    Profile(&'a ModelProfile),
    /// A test finished.
    Row(&'a BenchRow),
}

/// What the file says about a model, for every row of it.
struct ModelFacts {
    filename: String,
    model_type: String,
    size: u64,
    n_params: u64,
    /// Parameters a token uses: all but the unchosen experts' (a mixture of experts).
    n_params_active: u64,
}

fn model_facts(path: &std::path::Path) -> Result<ModelFacts, EngineError> {
    if !path.exists() {
        return Err(EngineError::MissingFile(path.display().to_string()));
    }
    let f = GgufFile::open(path)?;
    let size = (f.tensors.iter()).fold(0u64, |a, t| a.saturating_add(t.n_bytes));
    let (n_params, n_params_active) = crate::model::param_counts(&f);
    // The weight type holding most parameters names the model's quantization.
    let mut by_type: Vec<(String, u64)> = Vec::new();
    for t in f.tensors.iter().filter(|t| t.dims.len() >= 2) {
        let ty = t.ty.to_string();
        match by_type.iter_mut().find(|e| e.0 == ty) {
            Some(e) => e.1 = e.1.saturating_add(t.n_elements()),
            None => by_type.push((ty, t.n_elements())),
        }
    }
    let ty = (by_type.iter().max_by_key(|e| e.1))
        .map(|e| e.0.clone())
        .unwrap_or_default();
    let arch = f.get_str("general.architecture").unwrap_or("?").to_string();
    let short = crate::model::short_count;
    // llama-bench's style for experts: `30B.A3B`.
    let params = match n_params_active == n_params {
        true => short(n_params),
        false => format!("{}.A{}", short(n_params), short(n_params_active)),
    };
    Ok(ModelFacts {
        filename: path.display().to_string(),
        model_type: format!("{arch} {params} {ty}"),
        size,
        n_params,
        n_params_active,
    })
}

/// Runs every test of the plan, reporting each as it finishes; returns all rows.
pub fn run_plan(
    plan: &BenchPlan,
    on: &mut dyn FnMut(BenchEvent),
) -> Result<Vec<BenchRow>, EngineError> {
    plan.validate().map_err(EngineError::Options)?;
    let instances = plan.instances();
    let total: usize = instances.iter().map(|i| i.tests.len()).sum();
    let mut rows = Vec::new();
    let mut index = 0;
    let mut profiled: Vec<(PathBuf, Backend, BenchSplit)> = Vec::new();
    let mut facts: Vec<(PathBuf, std::rc::Rc<ModelFacts>)> = Vec::new();
    for inst in &instances {
        let mf = match facts.iter().find(|f| f.0 == inst.model) {
            Some(f) => f.1.clone(),
            None => {
                let f = std::rc::Rc::new(model_facts(&inst.model)?);
                facts.push((inst.model.clone(), f.clone()));
                f
            }
        };
        let mut opts = plan.base.clone();
        opts.gpu.backend = inst.backend;
        if let Some(&main) = plan.devices.get(plan.main_gpu) {
            opts.gpu.adapter_index = Some(main);
        }
        if plan.splits_devices() && inst.split.layer {
            opts.split = Some(crate::engine::SplitSpec {
                devices: plan.devices.clone(),
                shares: inst.split.shares.clone(),
                main: plan.main_gpu,
            });
        }
        opts.n_batch = inst.n_batch;
        opts.n_ubatch = inst.n_ubatch;
        opts.kv = inst.cache;
        let mut need = inst.tests.iter().map(|t| t.n_ctx()).max().unwrap_or(1);
        if let Some(d) = &plan.draft {
            // The prompt's tokens are at most its bytes (and a BOS).
            need += d.prompt.len() as u32 + 1;
        }
        opts.n_ctx = opts.n_ctx.max(need).max(1);
        let mut engine = Engine::load(&inst.model, &opts, &mut |done, total| {
            on(BenchEvent::Loading {
                model: &inst.model,
                backend: inst.backend,
                done,
                total,
            })
        })?;
        if let Some(d) = &plan.draft {
            engine.load_draft(&d.model, d.params)?;
        }
        let mut bench = Bench::new(&mut engine);
        // One decoded token, untimed: the decode graph's dispatches and record time.
        let (dispatches_per_token, barriers_per_token, record_us) = bench.probe_decode()?;
        let gpu = bench.engine.model.gpu.clone();
        let devices = bench.engine.model.placement.gpus().to_vec();
        // A split names every adapter, main first.
        let adapter = match devices.len() {
            1 => gpu.info.name.clone(),
            _ => (devices.iter())
                .map(|g| format!("{} ({})", g.info.name, g.info.backend))
                .collect::<Vec<_>>()
                .join(" + "),
        };
        // The cache holds f16 where the device has shader-f16 (see `Context::new`).
        let kv = bench.ctx().kv_choice();
        // `auto` is decided by the tuner: name what it chose.
        let backend = match inst.backend {
            Backend::Auto => format!("auto: {}", gpu.info.backend.to_lowercase()),
            b => b.to_string(),
        };
        let mut model_profile = None;
        let key = (inst.model.clone(), inst.backend, inst.split.clone());
        if plan.profile && !profiled.contains(&key) {
            profiled.push(key);
            // The first pp and tg tests' shapes, at their depths.
            let pp = (inst.tests.iter().find(|t| t.n_prompt > 0)).map(|t| (t.n_prompt, t.n_depth));
            let tg = (inst.tests.iter().find(|t| t.n_gen > 0)).map(|t| t.n_depth);
            let p = ModelProfile {
                model_type: mf.model_type.clone(),
                backend: backend.clone(),
                adapter: adapter.clone(),
                pp: match pp {
                    Some((n, depth)) => Some(bench.profile_step(n, depth)?),
                    None => None,
                },
                tg: match tg {
                    Some(depth) => Some(bench.profile_step(1, depth)?),
                    None => None,
                },
            };
            on(BenchEvent::Profile(&p));
            model_profile = Some(p);
        }
        for t in &inst.tests {
            index += 1;
            let name = t.name();
            let test_time = report::iso8601(
                web_time::SystemTime::now()
                    .duration_since(web_time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            );
            let mut stage = |stage| {
                on(BenchEvent::Progress {
                    index,
                    total,
                    test: &name,
                    stage,
                })
            };
            let m = match &plan.draft {
                Some(d) if t.n_gen > 0 => bench.run_draft_test(t, d, &mut stage)?,
                _ => bench.run_test(t, &mut stage)?,
            };
            let profile = model_profile
                .as_ref()
                .and_then(|p| match (t.n_prompt, t.n_gen) {
                    (_, 0) => p.pp.clone(),
                    (0, _) => p.tg.clone(),
                    _ => None,
                });
            let row = BenchRow {
                build_commit: env!("WGLLM_BUILD_COMMIT").to_string(),
                gpu_info: gpu.info.name.clone(),
                backends: gpu.info.backend.clone(),
                model_filename: mf.filename.clone(),
                model_type: mf.model_type.clone(),
                model_size: mf.size,
                model_n_params: mf.n_params,
                model_n_params_active: mf.n_params_active,
                n_batch: inst.n_batch,
                n_ubatch: inst.n_ubatch,
                type_k: kv.type_k.to_string(),
                type_v: kv.type_v.to_string(),
                flash_attn: kv.flash,
                n_prompt: t.n_prompt,
                n_gen: t.n_gen,
                n_depth: t.n_depth,
                test_time,
                samples_ns: m.samples_ns,
                backend: backend.clone(),
                adapter: adapter.clone(),
                driver: gpu.info.driver.clone(),
                kernels: gpu.kernels.to_string(),
                gpu_mem_bytes: devices.iter().map(|g| g.allocated_bytes()).sum(),
                split_mode: match devices.len() {
                    1 => "none".into(),
                    _ => inst.split.mode().into(),
                },
                main_gpu: plan.main_gpu as u32,
                tensor_split: inst.split.shares_label(),
                device_mem_bytes: devices.iter().map(|g| g.allocated_bytes()).collect(),
                dispatches_per_token: m.decode.map_or(dispatches_per_token, |d| d.dispatches),
                barriers_per_token: m.decode.map_or(barriers_per_token, |d| d.barriers),
                record_us: m.decode.map_or(record_us, |d| d.record_us),
                sampling: if bench.engine.samples_on_gpu() {
                    "gpu"
                } else {
                    "cpu"
                }
                .to_string(),
                decode: m.decode,
                draft: m.draft,
                profile,
            };
            on(BenchEvent::Row(&row));
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One test's measurements.
struct Measured {
    samples_ns: Vec<u64>,
    /// For tests that decode single tokens: what one cost the host, on average.
    decode: Option<DecodeCost>,
    /// For a speculative tg test: what the draft proposed and the target kept.
    draft: Option<DraftCounts>,
}

/// A speculative tg test's proposals over its timed repetitions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftCounts {
    /// The draft model's file.
    pub model: String,
    pub drafted: u64,
    pub accepted: u64,
}

impl DraftCounts {
    /// Kept proposals, in percent of all proposals.
    pub fn acceptance_percent(&self) -> f64 {
        crate::engine::DraftStats {
            drafted: self.drafted,
            accepted: self.accepted,
        }
        .acceptance_percent()
    }
}

/// The host's side of one decoded token, averaged over a test's generated tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeCost {
    /// Dispatches of the step (the graph's, and sampling's on the GPU), and those wgpu
    /// records a barrier before.
    pub dispatches: usize,
    pub barriers: usize,
    /// Microseconds recording the dispatches, in submits, waiting for the GPU and the
    /// readback, and sampling on the host.
    pub record_us: f64,
    pub submit_us: f64,
    pub wait_us: f64,
    pub sample_us: f64,
    /// Bytes read back per token: a logits row, or the drawn token and its probability.
    pub read_bytes: u64,
    /// Steps submitted before the last one's token was read (1: none overlap).
    pub in_flight: u32,
}

/// The loops on one engine. Tokens are deterministic pseudo-random ids, as llama-bench
/// feeds random ones. The engine's sessions must be idle: the benchmark uses the whole
/// cache.
struct Bench<'e> {
    engine: &'e mut Engine,
    seed: u64,
}

impl<'e> Bench<'e> {
    fn new(engine: &'e mut Engine) -> Self {
        Bench {
            engine,
            seed: 12345,
        }
    }

    fn tokens(&mut self, n: u32) -> Vec<u32> {
        let n_vocab = self.engine.model.hp.n_vocab as u64;
        (0..n)
            .map(|_| {
                self.seed =
                    (self.seed.wrapping_mul(6364136223846793005)).wrapping_add(1442695040888963407);
                ((self.seed >> 33) % n_vocab) as u32
            })
            .collect()
    }

    fn ctx(&mut self) -> &mut Context {
        self.engine.context_mut()
    }

    /// Decodes one token on an empty cache (twice: the first run builds the graph).
    fn probe_decode(&mut self) -> Result<(usize, usize, f64), EngineError> {
        self.ctx().clear();
        for pos in 0..2 {
            let t = self.tokens(1);
            self.ctx().decode(&Batch::simple(&t, pos, true))?;
        }
        let s = self.ctx().last_step;
        self.ctx().clear();
        Ok((s.dispatches, s.barriers, s.record_ns as f64 / 1e3))
    }

    /// Profiles the last ubatch of an `n`-token step over `depth` cells already in the
    /// cache (attention's share grows with the depth). A decoded token (`n` 1) is drawn
    /// as the tg tests draw it: on the GPU, the draw's dispatches are timed too.
    fn profile_step(&mut self, n: u32, depth: u32) -> Result<StepProfile, EngineError> {
        self.ctx().clear();
        let n = n.min(self.ctx().params.n_ubatch).max(1);
        let toks = self.tokens(n);
        let depth_toks = self.tokens(depth);
        decode_chunks(self.ctx(), &depth_toks, 0)?;
        let row = match n {
            1 => Generator::new(self.engine, toks[0]).row,
            _ => None,
        };
        // Once to build the graph and compile its pipelines, once profiled.
        for profiled in [false, true] {
            self.ctx().seq_rm(None, depth as i32, -1)?;
            if profiled {
                self.ctx().profile_next_ubatch();
            }
            let batch = Batch::simple(&toks, depth as i32, false);
            match row {
                Some(row) => {
                    let draw = crate::context::GpuDraw {
                        index: 0,
                        row: row.with_uniform(0.5),
                    };
                    self.ctx().decode_drawing(&batch, &[draw])?;
                }
                None => {
                    self.ctx().decode(&batch)?;
                }
            }
        }
        let p = self.ctx().last_profile.take();
        self.ctx().clear();
        p.ok_or_else(|| EngineError::Options("the profiled step ran no graph".into()))
    }

    fn run_test(
        &mut self,
        t: &TestSpec,
        stage: &mut dyn FnMut(Stage),
    ) -> Result<Measured, EngineError> {
        let depth = t.n_depth as i32;
        // The depth is filled once (untimed); each repetition then removes its own tokens.
        self.ctx().clear();
        let depth_toks = self.tokens(t.n_depth);
        decode_chunks(self.ctx(), &depth_toks, 0)?;
        let mut samples_ns = Vec::new();
        let mut decode = None;
        for rep in 0..=t.reps {
            stage(if rep == 0 {
                Stage::Warmup
            } else {
                Stage::Rep(rep, t.reps)
            });
            let prompt = self.tokens(t.n_prompt);
            let first = self.tokens(1)[0];
            self.ctx().seq_rm(None, depth, -1)?;
            let mut gen = Generator::new(self.engine, first);
            let mut cost = DecodeCost::default();
            let t0 = Instant::now();
            decode_chunks(self.ctx(), &prompt, depth)?;
            let pos = depth + t.n_prompt as i32;
            gen.run(self.engine, pos, t.n_gen, &mut cost)?;
            let ns = t0.elapsed().as_nanos() as u64;
            // Repetition 0 warms up (pipelines, graphs).
            if rep > 0 {
                samples_ns.push(ns);
                if t.n_gen > 0 {
                    let per = (t.n_gen * t.reps) as f64;
                    let d = decode.get_or_insert(DecodeCost {
                        in_flight: cost.in_flight,
                        ..Default::default()
                    });
                    d.record_us += cost.record_us / per;
                    d.submit_us += cost.submit_us / per;
                    d.wait_us += cost.wait_us / per;
                    d.sample_us += cost.sample_us / per;
                    d.read_bytes = cost.read_bytes / t.n_gen as u64;
                }
            }
        }
        if let Some(d) = decode.as_mut() {
            d.dispatches = self.ctx().last_step.dispatches;
            d.barriers = self.ctx().last_step.barriers;
        }
        self.ctx().clear();
        Ok(Measured {
            samples_ns,
            decode,
            draft: None,
        })
    }

    /// A tg test with the engine's draft model: a greedy session continues `d.prompt`
    /// for `t.n_gen` tokens, each repetition on an empty cache; the time runs from the
    /// step that samples the first token to the end, drafting and checking included.
    fn run_draft_test(
        &mut self,
        t: &TestSpec,
        d: &DraftPlan,
        stage: &mut dyn FnMut(Stage),
    ) -> Result<Measured, EngineError> {
        let mut sampling = crate::sample::SamplerParams::greedy();
        sampling.banned = self.engine.tokenizer.eog_tokens().collect();
        let params = crate::engine::SessionParams {
            sampling,
            n_predict: t.n_gen as i32,
            ..Default::default()
        };
        let mut samples_ns = Vec::new();
        let mut counts = DraftCounts {
            model: d.model.display().to_string(),
            ..Default::default()
        };
        for rep in 0..=t.reps {
            stage(if rep == 0 {
                Stage::Warmup
            } else {
                Stage::Rep(rep, t.reps)
            });
            self.ctx().clear();
            let e = &mut *self.engine;
            let before = e.draft_stats().unwrap_or_default();
            let id = e.open_session(params.clone())?;
            let n_prompt = e.prompt_text(id, &d.prompt)?;
            if n_prompt + t.n_gen as usize > e.n_ctx_seq() as usize {
                e.close_session(id)?;
                return Err(EngineError::Options(format!(
                    "-md: the prompt ({n_prompt} tokens) and {} generated tokens do not fit the context; raise -c",
                    t.n_gen
                )));
            }
            while e.session(id)?.phase() == crate::engine::Phase::Prompt {
                step_checked(e, id)?;
            }
            let t0 = Instant::now();
            while e.session(id)?.is_busy() {
                step_checked(e, id)?;
            }
            let ns = t0.elapsed().as_nanos() as u64;
            let n = e.session(id)?.generated().len();
            e.close_session(id)?;
            if n != t.n_gen as usize {
                return Err(EngineError::Options(format!(
                    "-md: the session generated {n} of {} tokens (the context filled?)",
                    t.n_gen
                )));
            }
            let after = e.draft_stats().unwrap_or_default();
            if rep > 0 {
                samples_ns.push(ns);
                counts.drafted += after.drafted - before.drafted;
                counts.accepted += after.accepted - before.accepted;
            }
        }
        self.ctx().clear();
        Ok(Measured {
            samples_ns,
            decode: None,
            draft: Some(counts),
        })
    }
}

/// One engine step, its error for session `id` returned as the step's.
fn step_checked(e: &mut Engine, id: crate::engine::SessionId) -> Result<(), EngineError> {
    for ev in e.step()? {
        if let crate::engine::Event::Error { session, error } = ev {
            if session == id {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// The generated tokens of a tg test: each one sampled from the last one's logits with
/// llama.cpp's default chain (fixed seed), on the engine's sampling path — drawn on the
/// GPU, or the logits read back and sampled on the host — and fed to the next step.
struct Generator {
    sampler: crate::sample::Sampler,
    /// The GPU chain's settings, when the engine draws on the GPU.
    row: Option<crate::ops::uniforms::SampleRow>,
    next: u32,
}

impl Generator {
    fn new(engine: &mut Engine, first: u32) -> Self {
        let n_vocab = engine.model.hp.n_vocab as usize;
        let params = crate::sample::SamplerParams {
            seed: 42,
            ..Default::default()
        };
        let sampler = crate::sample::Sampler::new(params, n_vocab);
        let mut row = None;
        if engine.samples_on_gpu() {
            if let Ok(mut r) = crate::sample::gpu_row(sampler.params(), n_vocab) {
                r.slot = 0;
                let stamp = sampler.history_stamp();
                row = (engine.context_mut().sync_sampler(0, stamp, &r, &[], None))
                    .is_ok()
                    .then_some(r);
            }
        }
        Generator {
            sampler,
            row,
            next: first,
        }
    }

    /// Decodes `n` tokens from `pos`, each the one picked after the last. Drawn on the
    /// GPU, each step is submitted before the token it decodes is read (the step before
    /// draws it into the step's token input), so two steps are in flight; the step
    /// submitted past the end is cut back. Otherwise one step at a time.
    fn run(
        &mut self,
        engine: &mut Engine,
        pos: i32,
        n: u32,
        cost: &mut DecodeCost,
    ) -> Result<(), EngineError> {
        // A pp test generates nothing: no step may be submitted (it would take a cell
        // past the test's context, and its recording would be timed with the prompt).
        if n == 0 {
            return Ok(());
        }
        let Some(row) = self.row else {
            cost.in_flight = 1;
            for i in 0..n {
                self.step(engine, pos + i as i32, cost)?;
            }
            return Ok(());
        };
        cost.in_flight = 2;
        let ctx = engine.context_mut();
        let mut flight = std::collections::VecDeque::new();
        let submit = |ctx: &mut Context,
                      sampler: &crate::sample::Sampler,
                      at: i32,
                      token: Option<u32>,
                      ahead: usize,
                      cost: &mut DecodeCost| {
            let batch = Batch::simple(&[token.unwrap_or(0)], at, true);
            let draw = crate::context::GpuDraw {
                index: 0,
                row: row.with_uniform(sampler.peek_uniform_at(ahead)),
            };
            let feed: &[(usize, usize)] = if token.is_none() { &[(0, 0)] } else { &[] };
            let f = ctx.submit_step(&batch, &[draw], feed)?;
            let s = ctx.last_step;
            cost.record_us += s.record_ns as f64 / 1e3;
            cost.submit_us += s.submit_ns as f64 / 1e3;
            Ok::<_, EngineError>(f)
        };
        flight.push_back(submit(ctx, &self.sampler, pos, Some(self.next), 0, cost)?);
        for i in 1..=n {
            if i < n {
                flight.push_back(submit(
                    ctx,
                    &self.sampler,
                    pos + i as i32,
                    None,
                    flight.len(),
                    cost,
                )?);
            }
            let out =
                pollster::block_on(ctx.finish_step(flight.pop_front().expect("a step in flight")))?;
            self.next = out.picks[0].token;
            let _ = self.sampler.accept_gpu_pick(self.next);
            cost.wait_us += ctx.last_step.wait_ns as f64 / 1e3;
            cost.read_bytes += 8;
        }
        Ok(())
    }

    /// Decodes the next token at `pos` and picks the one after it.
    fn step(
        &mut self,
        engine: &mut Engine,
        pos: i32,
        cost: &mut DecodeCost,
    ) -> Result<(), EngineError> {
        let batch = Batch::simple(&[self.next], pos, true);
        let ctx = engine.context_mut();
        let mut sample_ns = 0;
        match self.row {
            Some(row) => {
                let draw = crate::context::GpuDraw {
                    index: 0,
                    row: row.with_uniform(self.sampler.peek_uniform()),
                };
                let out = ctx.decode_drawing(&batch, &[draw])?;
                self.next = out.picks[0].token;
                let _ = self.sampler.accept_gpu_pick(self.next);
            }
            None => {
                let logits = ctx.decode(&batch)?;
                let t = Instant::now();
                self.next = self.sampler.sample(&logits);
                let _ = self.sampler.accept_generated(self.next);
                sample_ns = t.elapsed().as_nanos() as u64;
            }
        }
        let s = engine.context().last_step;
        cost.record_us += s.record_ns as f64 / 1e3;
        cost.submit_us += s.submit_ns as f64 / 1e3;
        cost.wait_us += s.wait_ns as f64 / 1e3;
        cost.sample_us += sample_ns as f64 / 1e3;
        cost.read_bytes += s.read_bytes;
        Ok(())
    }
}

/// Decodes `toks` from position `start` in batches of at most n_batch (as llama-bench
/// feeds a prompt longer than -b), the last token of each with logits.
fn decode_chunks(ctx: &mut Context, toks: &[u32], start: i32) -> Result<(), EngineError> {
    let nb = ctx.params.n_batch as usize;
    for (i, c) in toks.chunks(nb).enumerate() {
        ctx.decode(&Batch::simple(c, start + (i * nb) as i32, false))?;
    }
    Ok(())
}
