#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| wgllm::fuzz::image(data));
