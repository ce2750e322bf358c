//! One benchmark result as llama-bench reports it — its field names where the meaning is
//! the same, plus wgllm's own (backend, adapter, driver, kernels, GPU memory, dispatches
//! per token, host record time) — and the four output formats. Front ends print what
//! these functions return; md rows can be printed as each test finishes.

use crate::graph::StepProfile;

/// How results are written (`-o`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// A markdown table, a row per test as it finishes (llama-bench's default).
    #[default]
    Md,
    Csv,
    /// One JSON array of row objects.
    Json,
    /// One JSON object per line.
    Jsonl,
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "md" => OutputFormat::Md,
            "csv" => OutputFormat::Csv,
            "json" => OutputFormat::Json,
            "jsonl" => OutputFormat::Jsonl,
            other => {
                return Err(format!(
                    "unknown output format `{other}` (choose md, csv, json or jsonl)"
                ))
            }
        })
    }
}

/// llama-bench's test name: `pp512`, `tg128`, `pp512+tg128`, with ` @ d4096` at depth.
pub fn test_name(n_prompt: u32, n_gen: u32, n_depth: u32) -> String {
    let base = match (n_prompt, n_gen) {
        (p, 0) => format!("pp{p}"),
        (0, n) => format!("tg{n}"),
        (p, n) => format!("pp{p}+tg{n}"),
    };
    match n_depth {
        0 => base,
        d => format!("{base} @ d{d}"),
    }
}

/// One test's result on one model and backend.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    pub build_commit: String,
    pub gpu_info: String,
    /// wgpu's name of the adapter's API (`Vulkan`, `Gl`, ...).
    pub backends: String,
    pub model_filename: String,
    /// `<arch> <parameters> <main weight type>`, as llama-bench's `llama 135M Q4_1`.
    pub model_type: String,
    /// Bytes of the tensors in the file.
    pub model_size: u64,
    pub model_n_params: u64,
    /// Parameters one token uses (fewer than `model_n_params` for a mixture of experts).
    pub model_n_params_active: u64,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub type_k: String,
    pub type_v: String,
    /// Whether flash attention was on (llama-bench's `flash_attn`, 0 or 1).
    pub flash_attn: bool,
    pub n_prompt: u32,
    pub n_gen: u32,
    pub n_depth: u32,
    /// When the test started, ISO 8601 UTC.
    pub test_time: String,
    /// Nanoseconds of each timed repetition.
    pub samples_ns: Vec<u64>,
    /// The backend asked for (`--backend`; for `auto`, `auto: ` and the one chosen), the
    /// adapter it reached and its driver.
    pub backend: String,
    pub adapter: String,
    pub driver: String,
    /// Kernel shapes the adapter got (`cpu` or `gpu`).
    pub kernels: String,
    /// Bytes of GPU buffers the model and its context created (on all its devices).
    pub gpu_mem_bytes: u64,
    /// llama-bench's `split_mode` (`none`, `layer`), `main_gpu` and `tensor_split`
    /// (`3/1`; `0`: equal shares).
    pub split_mode: String,
    pub main_gpu: u32,
    pub tensor_split: String,
    /// The bytes of `gpu_mem_bytes` on each device of a split, main first.
    pub device_mem_bytes: Vec<u64>,
    /// Dispatches of the graph of one decoded token.
    pub dispatches_per_token: usize,
    /// Of a decoded token's dispatches, those wgpu records a barrier before
    /// ([`crate::ops::barriers`]).
    pub barriers_per_token: usize,
    /// Host microseconds to record one decode step's dispatches into a command buffer
    /// (the submit is left out: on GL it runs the commands on the host).
    pub record_us: f64,
    /// Where generated tokens were sampled (`cpu` or `gpu`).
    pub sampling: String,
    /// For tests that generate: the host's cost of one decoded token.
    pub decode: Option<super::DecodeCost>,
    /// With `-md`, a tg test's draft model and its proposals.
    pub draft: Option<super::DraftCounts>,
    /// With `--profile`: a step of this test's kind timed per op.
    pub profile: Option<StepProfile>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (m, var.sqrt())
}

impl BenchRow {
    /// llama-bench's test name: `pp512`, `tg128`, `pp512+tg128`, with ` @ d4096` at depth.
    pub fn test_name(&self) -> String {
        test_name(self.n_prompt, self.n_gen, self.n_depth)
    }

    /// Tokens per second of each repetition (prompt and generated tokens together).
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = (self.n_prompt + self.n_gen) as f64;
        self.samples_ns
            .iter()
            .map(|&ns| n * 1e9 / ns.max(1) as f64)
            .collect()
    }
    /// Mean and sample standard deviation of the repetitions' nanoseconds.
    pub fn ns_stats(&self) -> (f64, f64) {
        let v: Vec<f64> = self.samples_ns.iter().map(|&n| n as f64).collect();
        mean_sd(&v)
    }
    /// Mean and sample standard deviation of the tokens per second (llama-bench averages
    /// the per-repetition rates, not the times).
    pub fn ts_stats(&self) -> (f64, f64) {
        mean_sd(&self.samples_ts())
    }

    /// The fields in llama-bench's order, ours after them.
    fn fields(&self) -> Vec<(&'static str, Field)> {
        use Field::*;
        let (avg_ns, sd_ns) = self.ns_stats();
        let (avg_ts, sd_ts) = self.ts_stats();
        let d = self.decode.unwrap_or_default();
        let dr = self.draft.clone().unwrap_or_default();
        vec![
            ("build_commit", Str(self.build_commit.clone())),
            ("gpu_info", Str(self.gpu_info.clone())),
            ("backends", Str(self.backends.clone())),
            ("model_filename", Str(self.model_filename.clone())),
            ("model_type", Str(self.model_type.clone())),
            ("model_size", Int(self.model_size)),
            ("model_n_params", Int(self.model_n_params)),
            ("model_n_params_active", Int(self.model_n_params_active)),
            ("n_batch", Int(self.n_batch as u64)),
            ("n_ubatch", Int(self.n_ubatch as u64)),
            ("type_k", Str(self.type_k.clone())),
            ("type_v", Str(self.type_v.clone())),
            ("split_mode", Str(self.split_mode.clone())),
            ("main_gpu", Int(self.main_gpu as u64)),
            ("flash_attn", Int(self.flash_attn as u64)),
            ("tensor_split", Str(self.tensor_split.clone())),
            ("n_prompt", Int(self.n_prompt as u64)),
            ("n_gen", Int(self.n_gen as u64)),
            ("n_depth", Int(self.n_depth as u64)),
            ("test_time", Str(self.test_time.clone())),
            ("avg_ns", Int(avg_ns.round() as u64)),
            ("stddev_ns", Int(sd_ns.round() as u64)),
            ("avg_ts", Float(avg_ts)),
            ("stddev_ts", Float(sd_ts)),
            ("samples_ns", Ints(self.samples_ns.clone())),
            ("samples_ts", Floats(self.samples_ts())),
            ("test", Str(self.test_name())),
            ("backend", Str(self.backend.clone())),
            ("adapter", Str(self.adapter.clone())),
            ("driver", Str(self.driver.clone())),
            ("kernels", Str(self.kernels.clone())),
            ("gpu_mem_bytes", Int(self.gpu_mem_bytes)),
            ("device_mem_bytes", Ints(self.device_mem_bytes.clone())),
            (
                "dispatches_per_token",
                Int(self.dispatches_per_token as u64),
            ),
            ("barriers_per_token", Int(self.barriers_per_token as u64)),
            ("record_us", Float(self.record_us)),
            ("sampling", Str(self.sampling.clone())),
            ("submit_us", Float(d.submit_us)),
            ("wait_us", Float(d.wait_us)),
            ("sample_us", Float(d.sample_us)),
            ("read_bytes_per_token", Int(d.read_bytes)),
            ("steps_in_flight", Int(d.in_flight as u64)),
            ("draft_model", Str(dr.model.clone())),
            ("n_drafted", Int(dr.drafted)),
            ("n_accepted", Int(dr.accepted)),
            ("draft_acceptance", Float(dr.acceptance_percent() / 100.0)),
        ]
    }

    /// The row as one JSON object (fields in llama-bench's order; `profile` last, with
    /// `--profile`).
    pub fn to_json(&self) -> String {
        let mut parts: Vec<String> = (self.fields().into_iter())
            .map(|(k, v)| format!("\"{k}\": {}", v.json()))
            .collect();
        if let Some(p) = &self.profile {
            parts.push(format!("\"profile\": {}", profile_json(p)));
        }
        format!("{{{}}}", parts.join(", "))
    }
}

enum Field {
    Str(String),
    Int(u64),
    Float(f64),
    Ints(Vec<u64>),
    Floats(Vec<f64>),
}

fn json_f64(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.6}")
    } else {
        "null".into()
    }
}

impl Field {
    fn json(&self) -> String {
        match self {
            Field::Str(s) => serde_json::Value::from(s.as_str()).to_string(),
            Field::Int(i) => i.to_string(),
            Field::Float(x) => json_f64(*x),
            Field::Ints(v) => {
                let s: Vec<String> = v.iter().map(|i| i.to_string()).collect();
                format!("[{}]", s.join(", "))
            }
            Field::Floats(v) => {
                let s: Vec<String> = v.iter().map(|&x| json_f64(x)).collect();
                format!("[{}]", s.join(", "))
            }
        }
    }

    /// A CSV cell: quoted, quotes doubled; lists space-separated inside one cell.
    fn csv(&self) -> String {
        let raw = match self {
            Field::Str(s) => s.clone(),
            Field::Int(i) => i.to_string(),
            Field::Float(x) => format!("{x:.6}"),
            Field::Ints(v) => v
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            Field::Floats(v) => (v.iter().map(|x| format!("{x:.6}")))
                .collect::<Vec<_>>()
                .join(" "),
        };
        format!("\"{}\"", raw.replace('"', "\"\""))
    }
}

/// A step profile as a JSON object.
pub fn profile_json(p: &StepProfile) -> String {
    let ops: Vec<String> = (p.ops.iter())
        .map(|o| {
            format!(
                "{{\"op\": {}, \"nodes\": {}, \"dispatches\": {}, \"time_ns\": {}, \"share\": {}, \"bytes\": {}, \"flops\": {}, \"gb_per_s\": {}, \"gflop_per_s\": {}}}",
                serde_json::Value::from(o.kind.as_str()),
                o.nodes,
                o.dispatches,
                o.ns.round() as u64,
                json_f64(p.share(o)),
                o.bytes,
                o.flops,
                json_f64(o.gb_per_s()),
                json_f64(o.gflop_per_s())
            )
        })
        .collect();
    let kernels: Vec<String> = (p.kernels.iter())
        .map(|k| {
            format!(
                "{{\"kernel\": {}, \"dispatches\": {}, \"time_ns\": {}}}",
                serde_json::Value::from(k.label),
                k.dispatches,
                k.ns.round() as u64
            )
        })
        .collect();
    format!(
        "{{\"timing\": {}, \"n_tokens\": {}, \"n_kv\": {}, \"total_ns\": {}, \"dispatches\": {}, \"barriers\": {}, \"ops\": [{}], \"kernels\": [{}]}}",
        serde_json::Value::from(p.source.note()),
        p.n_tok,
        p.n_kv,
        p.total_ns().round() as u64,
        p.dispatches,
        p.barriers,
        ops.join(", "),
        kernels.join(", ")
    )
}

/// Optional md columns, shown when a list gave them several values.
#[derive(Clone, Copy, Debug, Default)]
pub struct MdColumns {
    pub n_batch: bool,
    pub n_ubatch: bool,
    /// Cache types and flash attention (`-ctk`, `-ctv`, `-fa` lists).
    pub cache: bool,
    /// The draft's acceptance (`-md`).
    pub draft: bool,
    /// The split (`-sm`, `-ts` with several --device adapters).
    pub split: bool,
}

/// Writes rows in one format: `begin` before the first row, `row` for each (as it
/// finishes), `end` after the last. Each returns the text to print (possibly empty).
pub struct Writer {
    format: OutputFormat,
    md: MdColumns,
    rows: usize,
}

impl Writer {
    pub fn new(format: OutputFormat, md: MdColumns) -> Writer {
        Writer {
            format,
            md,
            rows: 0,
        }
    }

    pub fn begin(&self) -> String {
        match self.format {
            OutputFormat::Md => {
                let mut h = vec!["model", "size", "params", "backend", "adapter"];
                let mut a = vec!["---", "---:", "---:", "---", "---"];
                if self.md.n_batch {
                    h.push("n_batch");
                    a.push("---:");
                }
                if self.md.n_ubatch {
                    h.push("n_ubatch");
                    a.push("---:");
                }
                if self.md.cache {
                    h.extend(["type_k", "type_v", "fa"]);
                    a.extend(["---", "---", "---:"]);
                }
                if self.md.split {
                    h.extend(["sm", "ts", "MiB per device"]);
                    a.extend(["---", "---", "---:"]);
                }
                h.extend(["test", "t/s"]);
                a.extend(["---:", "---:"]);
                if self.md.draft {
                    h.push("accepted");
                    a.push("---:");
                }
                format!("| {} |\n| {} |\n", h.join(" | "), a.join(" | "))
            }
            OutputFormat::Csv => {
                let probe = BenchRow::empty();
                let names: Vec<&str> = probe.fields().iter().map(|f| f.0).collect();
                format!("{}\n", names.join(","))
            }
            OutputFormat::Json => "[\n".into(),
            OutputFormat::Jsonl => String::new(),
        }
    }

    pub fn row(&mut self, r: &BenchRow) -> String {
        self.rows += 1;
        match self.format {
            OutputFormat::Md => {
                let (ts, sd) = r.ts_stats();
                let mut cells = vec![
                    r.model_type.clone(),
                    format!("{:.2} MiB", r.model_size as f64 / (1u64 << 20) as f64),
                    format!("{:.2} M", r.model_n_params as f64 / 1e6),
                    r.backend.clone(),
                    r.adapter.clone(),
                ];
                if self.md.n_batch {
                    cells.push(r.n_batch.to_string());
                }
                if self.md.n_ubatch {
                    cells.push(r.n_ubatch.to_string());
                }
                if self.md.cache {
                    cells.extend([r.type_k.clone(), r.type_v.clone()]);
                    cells.push((r.flash_attn as u8).to_string());
                }
                if self.md.split {
                    cells.extend([r.split_mode.clone(), r.tensor_split.clone()]);
                    let mib: Vec<String> = (r.device_mem_bytes.iter())
                        .map(|b| format!("{:.0}", *b as f64 / (1u64 << 20) as f64))
                        .collect();
                    cells.push(mib.join(" + "));
                }
                cells.push(r.test_name());
                cells.push(format!("{ts:.2} ± {sd:.2}"));
                if self.md.draft {
                    cells.push(match &r.draft {
                        Some(d) => format!("{:.1} % of {}", d.acceptance_percent(), d.drafted),
                        None => String::new(),
                    });
                }
                format!("| {} |\n", cells.join(" | "))
            }
            OutputFormat::Csv => {
                let cells: Vec<String> = r.fields().iter().map(|f| f.1.csv()).collect();
                format!("{}\n", cells.join(","))
            }
            OutputFormat::Json => {
                let sep = if self.rows > 1 { ",\n" } else { "" };
                format!("{sep}  {}", r.to_json())
            }
            OutputFormat::Jsonl => format!("{}\n", r.to_json()),
        }
    }

    pub fn end(&self) -> String {
        match self.format {
            OutputFormat::Json if self.rows > 0 => "\n]\n".into(),
            OutputFormat::Json => "]\n".into(),
            _ => String::new(),
        }
    }
}

impl BenchRow {
    pub(super) fn empty() -> BenchRow {
        BenchRow {
            build_commit: String::new(),
            gpu_info: String::new(),
            backends: String::new(),
            model_filename: String::new(),
            model_type: String::new(),
            model_size: 0,
            model_n_params: 0,
            model_n_params_active: 0,
            n_batch: 0,
            n_ubatch: 0,
            type_k: String::new(),
            flash_attn: false,
            type_v: String::new(),
            n_prompt: 0,
            n_gen: 0,
            n_depth: 0,
            test_time: String::new(),
            samples_ns: Vec::new(),
            backend: String::new(),
            adapter: String::new(),
            driver: String::new(),
            kernels: String::new(),
            gpu_mem_bytes: 0,
            split_mode: String::new(),
            main_gpu: 0,
            tensor_split: String::new(),
            device_mem_bytes: Vec::new(),
            dispatches_per_token: 0,
            barriers_per_token: 0,
            record_us: 0.0,
            sampling: String::new(),
            decode: None,
            draft: None,
            profile: None,
        }
    }
}

/// A step profile as a markdown table, op kinds slowest first, with a heading naming the
/// model, backend, step and how it was timed.
pub fn profile_md(title: &str, p: &StepProfile) -> String {
    let mut s = format!(
        "\n### {title}: {} token{} over {} cells, {:.3} ms\n\ntiming: {}; {} dispatches, {} of them after a barrier (wgpu's rule, counted from the bindings)\n\n",
        p.n_tok,
        if p.n_tok == 1 { "" } else { "s" },
        p.n_kv,
        p.total_ns() / 1e6,
        p.source.note(),
        p.dispatches,
        p.barriers
    );
    s.push_str("| op | nodes | dispatches | time ms | share | GB/s | GFLOP/s |\n");
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for o in &p.ops {
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.1} % | {:.2} | {:.2} |\n",
            o.kind,
            o.nodes,
            o.dispatches,
            o.ns / 1e6,
            100.0 * p.share(o),
            o.gb_per_s(),
            o.gflop_per_s()
        ));
    }
    s.push_str("\n| kernel | dispatches | time ms | share |\n| --- | ---: | ---: | ---: |\n");
    let total = p.total_ns().max(1.0);
    for k in &p.kernels {
        s.push_str(&format!(
            "| {} | {} | {:.3} | {:.1} % |\n",
            k.label,
            k.dispatches,
            k.ns / 1e6,
            100.0 * k.ns / total
        ));
    }
    s
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (llama-bench's `test_time`).
pub fn iso8601(unix_secs: u64) -> String {
    let days = (unix_secs / 86400) as i64;
    let rem = unix_secs % 86400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn formats_agree() {
        let mut r = BenchRow::empty();
        (r.n_prompt, r.samples_ns) = (16, vec![1_000_000_000, 500_000_000]);
        r.model_type = "llama \"x\", y".into();
        assert_eq!(r.samples_ts(), [16.0, 32.0]);
        assert_eq!(r.test_name(), "pp16");
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["avg_ts"].as_f64().unwrap(), 24.0);
        assert_eq!(v["model_type"], "llama \"x\", y");
        let mut w = Writer::new(OutputFormat::Json, MdColumns::default());
        let text = w.begin() + &w.row(&r) + &w.row(&r) + &w.end();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 2);
        let w = Writer::new(OutputFormat::Csv, MdColumns::default());
        assert!(w.begin().starts_with("build_commit,gpu_info,"));
    }
}
