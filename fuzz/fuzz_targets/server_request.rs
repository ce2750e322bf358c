#![no_main]
//! Request bodies read with a real model's tokenizer and chat template: SmolLM2's from
//! scripts/fetch-models.sh, or the GGUF named by WGLLM_FUZZ_MODEL.
use std::sync::OnceLock;
use wgllm::tokenizer::Tokenizer;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = std::env::var("WGLLM_FUZZ_MODEL").unwrap_or_else(|_| {
            let home = std::env::var("HOME").unwrap_or_default();
            format!("{home}/.cache/wgllm-models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
        let f = wgllm::gguf::GgufFile::open(&path)
            .unwrap_or_else(|e| panic!("{path}: {e} (run scripts/fetch-models.sh)"));
        Tokenizer::from_gguf(&f).expect("the model's tokenizer")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| wgllm::fuzz::server_request(data, tokenizer()));
