//! The `wgllm` binary: parses flags, runs a command, turns errors into a message and a
//! non-zero exit. Built for wasm32, the same binary is the browser page: `main` starts
//! the app on the page's canvas (see `wgllm::app::web` and scripts/web.sh).

#[cfg(not(target_arch = "wasm32"))]
mod cli;

#[cfg(target_arch = "wasm32")]
fn main() {
    wgllm::app::web::start();
}

#[cfg(not(target_arch = "wasm32"))]
use clap::Parser;
#[cfg(not(target_arch = "wasm32"))]
use cli::{Cli, Command};

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    cli::runtime_dir::ensure();
    let args: Vec<_> = std::env::args_os()
        .map(cli::habits::llama_style_flag)
        .collect();
    // `serve --verbose` logs debug lines, as llama-server's does (RUST_LOG still wins).
    let verbose = args.get(1).is_some_and(|a| a == "serve")
        && args
            .iter()
            .any(|a| a == "--verbose" || a == "--v" || a == "-v");
    // wgpu-hal logs every failed DXGI call at error level, also the optional ones it goes
    // on without (IDXGIFactoryMedia, which Wine lacks); the failures that matter come back
    // as errors and are reported with what they stopped.
    let filter = if verbose {
        "warn,wgllm=debug,wgpu_hal::auxil::dxgi::result=off"
    } else {
        "warn,wgllm=info,wgpu_hal::auxil::dxgi::result=off"
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(filter))
        .format_timestamp(None)
        .init();
    if let Some(msg) = cli::habits::refused(&args) {
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
    let cli = Cli::parse_from(args);
    let result = match &cli.cmd {
        #[cfg(feature = "app")]
        Command::App(a) => cli::app::app(a),
        Command::Run(a) => cli::run::run(a),
        #[cfg(feature = "server")]
        Command::Serve(a) if a.routed() => cli::router::serve(a),
        #[cfg(feature = "server")]
        Command::Serve(a) => cli::serve::serve(a),
        Command::Chat(a) => cli::chat::chat(a),
        Command::Perplexity(a) => cli::perplexity::perplexity(a),
        Command::Embed(a) => cli::embed::embed(a),
        Command::ImageEmbed(a) => cli::image_embed::image_embed(a),
        Command::Bench(a) => cli::bench::bench(a),
        Command::Inspect(a) => cli::info::inspect(a),
        Command::Devices(a) => cli::info::devices(a),
        Command::Synth(a) => cli::synth::synth(a),
        Command::Tune(a) => cli::tune::tune(a),
        Command::Kernels(a) => cli::kernels::kernels(a),
        Command::Tokenize(a) => cli::tokenize::tokenize(a),
        Command::Completions(a) => cli::completions(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
