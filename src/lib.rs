//! wgllm: a portable GPU runtime for LLM inference on wgpu.
//!
//! See ARCHITECTURE.md for how the modules fit together.

pub mod context;
pub mod engine;
pub mod gguf;
pub mod gpu;
pub mod graph;
pub mod kv;
pub mod model;
pub mod ops;
pub mod sample;
pub mod tokenizer;
pub mod tune;

/// The desktop demo app (cargo feature `app`): egui on the model's own wgpu device.
#[cfg(all(feature = "app", not(target_arch = "wasm32")))]
pub mod app;
