//! wgllm: a portable GPU runtime for LLM inference on wgpu.
//!
//! See ARCHITECTURE.md for how the modules fit together.

pub mod batch;
/// `wgllm bench`: llama-bench's tests, reports and plots over the engine (native: its
/// loops block on the GPU).
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
pub mod context;
pub mod engine;
/// The fuzz targets' bodies (scripts/fuzz.sh, tests/fuzz_corpus.rs).
#[doc(hidden)]
pub mod fuzz;
pub mod gguf;
pub mod gpu;
pub mod grammar;
pub mod graph;
/// `-hf`: models from the Hugging Face Hub into the cache llama.cpp shares (cargo
/// feature `hub`, native targets).
#[cfg(all(feature = "hub", not(target_arch = "wasm32")))]
pub mod hub;
pub mod kv;
pub mod memory;
pub mod model;
pub mod ops;
/// The formats kernels read: weight types (one implementation each: block layout, GPU
/// repack, WGSL readers, integer-dot loader, CPU references) and K/V cache types.
pub mod quant;
pub mod sample;
pub mod tokenizer;
pub mod tune;
pub mod vision;

/// The demo app (cargo feature `app`): egui on the model's own wgpu device, in a window
/// (native) or on a browser page's canvas (wasm32, WebGPU).
#[cfg(feature = "app")]
pub mod app;

/// `wgllm serve` (cargo feature `server`, native targets): llama-server's, OpenAI's and
/// Anthropic's HTTP APIs over the engine service.
#[cfg(all(feature = "server", not(target_arch = "wasm32")))]
pub mod server;
