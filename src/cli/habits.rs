//! Flags llama.cpp users type by habit. Those that make sense here are accepted (some
//! with nothing to do: every layer is always on the GPU, there are no CPU threads);
//! those that have no meaning here are refused before parsing with one sentence saying
//! why, rather than clap's generic "unexpected argument".

use clap::Args;

/// llama.cpp spells some flags with one dash and several letters (`-np 4`, `-ngl 99`);
/// clap would read `-np` as `-n p`. Those spellings become their `--` forms. llama.cpp
/// also reads `_` as `-` in a `--` flag's name (`--n_predict`, `--backend_sampling`),
/// and so does this (the value after `=` is left as it is).
pub fn llama_style_flag(arg: std::ffi::OsString) -> std::ffi::OsString {
    const MULTI_LETTER: [&str; 40] = [
        "-np", "-ub", "-dt", "-dkvc", "-gan", "-gaw", "-sys", "-ngl", "-fa", "-tb", "-cnv",
        "-no-cnv", "-ngld", "-ctk", "-ctv", "-sm", "-ts", "-mg", "-md", "-hf", "-mu", "-ot",
        "-nkvo", "-lv", "-pg", "-mmp", "-to", "-cb", "-nocb", "-kvu", "-jf", "-hff", "-hfr",
        "-hft", "-cram", "-bs", "-devd", "-dev", "-ag", "-no-ag",
    ];
    match arg.to_str() {
        Some(a) if MULTI_LETTER.contains(&a) => format!("-{a}").into(),
        Some(a) if a.starts_with("--") && a.contains('_') => {
            let (name, value) = a.split_at(a.find('=').unwrap_or(a.len()));
            format!("{}{value}", name.replace('_', "-")).into()
        }
        _ => arg,
    }
}

/// llama.cpp flags with no meaning in wgllm, and why.
const REFUSED: &[(&[&str], &str)] = &[
    (&["--mlock", "--no-mmap", "--mmap", "--numa"], "it places the model in host memory, and wgllm keeps every weight on the GPU"),
    (&["--no-kv-offload", "--nkvo", "--cpu-moe", "--n-cpu-moe", "--override-tensor", "--ot"], "it keeps tensors (or the KV cache) in host memory, and wgllm keeps the cache and every weight on the GPU; to fit a longer context, quantize the cache (-ctk q8_0 -ctv q8_0)"),
    (&["--draft", "--draft-n", "--draft-max"], "today's llama.cpp removed it: use --spec-draft-n-max"),
    (&["--draft-min", "--draft-n-min"], "today's llama.cpp removed it: use --spec-draft-n-min"),
    (&["--spec-draft-device", "--devd", "--device-draft"], "the draft model runs on the target's GPU"),
    (&["--spec-synth-len"], "a synthetic acceptance length is not built: give the per-position rates with --spec-synth-rates"),
    (&["--control-vector", "--control-vector-scaled"], "control vectors are not supported (LoRA adapters are: --lora, --lora-scaled)"),
    (&["--mmproj", "--image"], "images are read by `wgllm run`, `wgllm chat`, `wgllm serve`, `wgllm app`, `wgllm bench` and `wgllm image-embed`; this command reads text only"),
    (&["--model-url", "--mu"], "wgllm takes local GGUF files (-m) and Hugging Face repositories (-hf ORG/NAME[:QUANT]); download the file and pass it with -m"),
    (&["--conversation", "--cnv", "--interactive", "-i", "--interactive-first", "-if"], "conversations are the `wgllm chat` command"),
    (&["--tools-runtime"], "tool runtimes (docker or podman containers, ssh hosts) are not built: the built-in tools run on the server's own host; to keep them inside one directory, give --tools-root DIR"),
    (&["--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast"], "RoPE overrides are not supported: the model's own RoPE settings are used"),
];

/// llama-server's agent flags, which only `serve` takes.
const SERVER_TOOLS: &[&str] = &[
    "--tools",
    "--tools-root",
    "--mcp-servers-config",
    "--mcp-servers-json",
    "--agent",
    "--ag",
    "--no-agent",
    "--no-ag",
];

/// The error for an argument llama.cpp accepts but wgllm cannot honour, if `args` holds
/// one (after the `--` forms of [`llama_style_flag`]).
pub fn refused(args: &[std::ffi::OsString]) -> Option<String> {
    // The commands that take llama.cpp's image flags.
    let images_taken = matches!(
        args.get(1).and_then(|a| a.to_str()),
        Some("image-embed" | "run" | "chat" | "serve" | "bench" | "app")
    );
    let serving = args.get(1).and_then(|a| a.to_str()) == Some("serve");
    for a in args.iter().skip(1) {
        let Some(a) = a.to_str() else { continue };
        if a == "--" {
            break;
        }
        let flag = a.split('=').next().unwrap_or(a);
        if !serving && SERVER_TOOLS.contains(&flag) {
            return Some(format!(
                "`{flag}` is a llama-server flag: the built-in agent tools and MCP servers run in `wgllm serve` (GET/POST /tools)"
            ));
        }
        for (names, why) in REFUSED {
            if names.contains(&flag) && !(images_taken && names.contains(&"--mmproj")) {
                return Some(format!(
                    "`{flag}` is a llama.cpp flag wgllm does not take: {why}"
                ));
            }
        }
    }
    None
}

/// Accepted for habit's sake; each is logged at debug level (or info, where the user
/// may expect an effect) and otherwise changes nothing.
#[derive(Args, Clone, Debug, Default)]
pub struct LlamaHabits {
    /// Accepted for compatibility: every layer always runs on the GPU.
    #[arg(long = "n-gpu-layers", visible_aliases = ["ngl", "gpu-layers"], allow_hyphen_values = true, hide_short_help = true)]
    pub n_gpu_layers: Option<String>,
    /// Accepted for compatibility: the CPU only feeds the GPU, there are no threads to set.
    #[arg(
        short = 't',
        long = "threads",
        allow_hyphen_values = true,
        hide_short_help = true
    )]
    pub threads: Option<i64>,
    /// Accepted for compatibility (llama.cpp's prompt-processing threads).
    #[arg(
        long = "threads-batch",
        visible_alias = "tb",
        allow_hyphen_values = true,
        hide_short_help = true
    )]
    pub threads_batch: Option<i64>,
    /// Accepted for compatibility: escapes in -p (\n, \t, ...) are processed by default
    /// (--no-escape turns that off).
    #[arg(short = 'e', long = "escape", hide_short_help = true)]
    pub escape: bool,
    /// Accepted for compatibility: output is not coloured.
    #[arg(long = "color", hide_short_help = true)]
    pub color: bool,
    /// Accepted for compatibility: chat templates always render with a Jinja engine.
    #[arg(long = "jinja", hide_short_help = true)]
    pub jinja: bool,
}

impl LlamaHabits {
    /// Says what each given habit flag does here.
    pub fn log(&self) {
        if let Some(n) = &self.n_gpu_layers {
            log::debug!("-ngl {n}: every layer runs on the GPU in wgllm; the value is ignored");
        }
        if let Some(t) = self.threads.or(self.threads_batch) {
            log::debug!("-t {t}: wgllm has no CPU compute threads; ignored");
        }
        if self.escape {
            log::debug!("-e: escapes are processed by default");
        }
        if self.color {
            log::debug!("--color: output is not coloured; ignored");
        }
        if self.jinja {
            log::debug!("--jinja: chat templates always render with minijinja");
        }
    }
}
