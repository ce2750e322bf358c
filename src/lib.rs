//! wgllm: a portable GPU runtime for LLM inference on wgpu.
//!
//! See ARCHITECTURE.md for how the modules fit together.

pub mod gguf;
pub mod gpu;
pub mod ops;
