//! The fixtures of tests/data/sampler, recorded from llama.cpp's own sampler chain by
//! scripts/record-sampler-ref.sh: settings, then cases of (vocabulary, logit rows made by
//! the harness's generator, seed, prompt tokens) with llama.cpp's token and candidate
//! count at every step. Shared by the CPU sampler's replay (`reference_tests.rs`) and
//! the GPU chain's (tests/sample_gpu.rs, which includes this file by path).
//!
//! The logit rows are generated here exactly as scripts/sampler-ref.cpp generates them.

use super::SamplerParams;
use std::path::{Path, PathBuf};

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn mix(a: u64, b: u64) -> u64 {
    splitmix(a ^ splitmix(b))
}

fn centred(u: u64, step: f32) -> f32 {
    ((u >> 40) as i64 - 8_388_608) as f32 * step
}

/// The harness's row generator (see `row()` in scripts/sampler-ref.cpp).
pub fn row(out: &mut Vec<f32>, n: usize, lseed: u64, step: u64, rows: &str) {
    let key = mix(lseed, step);
    let kind = match rows {
        "sticky" => 4,
        "ties" => 3,
        _ => mix(key, 0xFFFF_FFFF) % 6,
    };
    out.clear();
    out.extend((0..n as u64).map(|i| {
        let u = mix(key, i);
        match kind {
            0 => centred(u, 1.0 / 4_194_304.0),
            1 => centred(u, 1.0 / 1_048_576.0),
            2 => -((u >> 41) as f32) * (1.0 / 524_288.0),
            3 => (u >> 60) as f32 * 0.5 - 4.0,
            4 => centred(mix(lseed, i), 1.0 / 1_048_576.0) + (u >> 56) as f32 * (1.0 / 1024.0),
            _ => centred(u, 1.0 / 4_194_304.0),
        }
    }));
    if kind == 2 {
        for (j, peak) in [10.0f32, 9.0, 8.5].into_iter().enumerate() {
            out[(mix(key, 1_000_000 + j as u64) % n as u64) as usize] += peak;
        }
    } else if kind == 5 {
        out[(mix(key, 2_000_000) % n as u64) as usize] += 30.0;
    }
}

fn kv(s: &str) -> Vec<(&str, &str)> {
    s.split_whitespace()
        .map(|t| {
            t.split_once('=')
                .unwrap_or_else(|| panic!("bad key=value {t}"))
        })
        .collect()
}

fn params_of(line: &str) -> SamplerParams {
    let mut p = SamplerParams::default();
    for (k, v) in kv(line) {
        let f = || v.parse::<f32>().unwrap_or_else(|_| panic!("{k}={v}"));
        match k {
            "temp" => p.temp = f(),
            "top_k" => p.top_k = v.parse().unwrap(),
            "top_p" => p.top_p = f(),
            "min_p" => p.min_p = f(),
            "typical_p" => p.typical_p = f(),
            "top_n_sigma" => p.top_n_sigma = f(),
            "xtc_probability" => p.xtc_probability = f(),
            "xtc_threshold" => p.xtc_threshold = f(),
            "dynatemp_range" => p.dynatemp_range = f(),
            "dynatemp_exponent" => p.dynatemp_exponent = f(),
            "repeat_penalty" => p.repeat_penalty = f(),
            "repeat_last_n" => p.repeat_last_n = v.parse().unwrap(),
            "frequency_penalty" => p.frequency_penalty = f(),
            "presence_penalty" => p.presence_penalty = f(),
            "min_keep" => p.min_keep = v.parse().unwrap(),
            "logit_bias" => {
                p.logit_bias = v
                    .split(',')
                    .map(|e| {
                        let (t, b) = e.split_once(':').unwrap();
                        (t.parse().unwrap(), b.parse().unwrap())
                    })
                    .collect()
            }
            "banned" => p.banned = v.split(',').map(|t| t.parse().unwrap()).collect(),
            _ => panic!("unknown key {k}"),
        }
    }
    p
}

/// The fixture files, in name order.
pub fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sampler");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    files
}

/// One recorded case.
pub struct Case {
    /// The `case` line, for messages.
    pub line: String,
    pub vocab: usize,
    pub lseed: u64,
    pub rows: String,
    pub seed: u64,
    /// Tokens accepted before the first step.
    pub prompt: Vec<u32>,
    /// llama.cpp's (token, candidates left for the draw) at each step.
    pub expect: Vec<(u32, usize)>,
}

/// A fixture file's settings and cases.
pub fn parse(text: &str) -> (SamplerParams, Vec<Case>) {
    let mut lines = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let params = params_of(
        lines
            .next()
            .and_then(|l| l.strip_prefix("params"))
            .expect("no params line"),
    );
    let mut cases = Vec::new();
    while let Some(case) = lines.next() {
        let case = case.strip_prefix("case").expect("case line");
        let expect = lines
            .next()
            .and_then(|l| l.strip_prefix("expect"))
            .expect("expect line");
        let c: std::collections::HashMap<&str, &str> = kv(case).into_iter().collect();
        cases.push(Case {
            line: case.trim().to_string(),
            vocab: c["vocab"].parse().unwrap(),
            lseed: c["lseed"].parse().unwrap(),
            rows: c["rows"].to_string(),
            seed: c["seed"].parse().unwrap(),
            prompt: if c["prompt"] == "-" {
                Vec::new()
            } else {
                c["prompt"].split(',').map(|t| t.parse().unwrap()).collect()
            },
            expect: expect
                .split_whitespace()
                .map(|e| {
                    let (t, n) = e.split_once(':').unwrap();
                    (t.parse().unwrap(), n.parse().unwrap())
                })
                .collect(),
        });
    }
    (params, cases)
}
