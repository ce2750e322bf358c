//! Replays tests/data/sampler/*.txt, recorded from llama.cpp's own sampler chain by
//! scripts/record-sampler-ref.sh: the same logits, seed and settings must pick the same
//! token, and leave the same number of candidates for the draw, at every step.
//!
//! The logit rows are generated here exactly as scripts/sampler-ref.cpp generates them.

use super::*;
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
fn row(out: &mut Vec<f32>, n: usize, lseed: u64, step: u64, rows: &str) {
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

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sampler");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    files
}

/// Where the draw's running sum stood around a candidate: (before, after) as fractions
/// of the total.
fn span(pick: &Pick, id: u32) -> Option<(f64, f64)> {
    let mut run = 0.0f64;
    for c in &pick.cands {
        let next = run + c.p as f64;
        if c.id == id {
            return Some((run, next));
        }
        run = next;
    }
    None
}

#[test]
fn replays_llama_cpp_sampler_fixtures() {
    let files = fixtures();
    assert!(!files.is_empty(), "no fixtures in tests/data/sampler");
    let (mut steps, mut cases) = (0usize, 0usize);
    let mut failures = Vec::new();
    let mut logits = Vec::new();
    for file in &files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        let mut lines = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        let params = params_of(
            lines
                .next()
                .and_then(|l| l.strip_prefix("params"))
                .unwrap_or_else(|| panic!("{name}: no params line")),
        );
        params.validate().unwrap();
        while let Some(case) = lines.next() {
            let case = case.strip_prefix("case").expect("case line");
            let expect = lines
                .next()
                .and_then(|l| l.strip_prefix("expect"))
                .expect("expect line");
            let c: std::collections::HashMap<&str, &str> = kv(case).into_iter().collect();
            let vocab: usize = c["vocab"].parse().unwrap();
            let lseed: u64 = c["lseed"].parse().unwrap();
            let rows = c["rows"];
            let mut p = params.clone();
            p.seed = c["seed"].parse().unwrap();
            let mut s = Sampler::new(p, vocab);
            if c["prompt"] != "-" {
                for t in c["prompt"].split(',') {
                    s.accept(t.parse().unwrap());
                }
            }
            cases += 1;
            for (step, e) in expect.split_whitespace().enumerate() {
                let (tok, n) = e.split_once(':').unwrap();
                let (tok, n): (u32, usize) = (tok.parse().unwrap(), n.parse().unwrap());
                row(&mut logits, vocab, lseed, step as u64, rows);
                let pick = s.run(&logits, true);
                steps += 1;
                if pick.token != tok || pick.cands.len() != n {
                    let ours = span(&pick, pick.token);
                    let theirs = span(&pick, tok);
                    // How far the draw's number fell from llama.cpp's token's share.
                    let miss = theirs.map(|(a, b)| (a - pick.rnd).max(pick.rnd - b).max(0.0));
                    failures.push(format!(
                        "{name} {case}: step {step}: llama.cpp picked {tok} from {n} candidates, \
                         we picked {} (index {}) from {}; u = {:.17}, our cumulative share of \
                         ours {ours:?} and of theirs {theirs:?}; u misses theirs by {miss:?}",
                        pick.token,
                        pick.selected,
                        pick.cands.len(),
                        pick.rnd,
                    ));
                    break; // later steps depend on this one
                }
                s.accept(tok);
            }
        }
    }
    eprintln!(
        "sampler fixtures: {} files, {cases} cases, {steps} steps",
        files.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {cases} cases diverge from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
