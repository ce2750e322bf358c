//! Replays tests/data/sampler/*.txt ([`super::fixture`]): the same logits, seed and
//! settings must pick llama.cpp's token, and leave the same number of candidates for the
//! draw, at every step.

use super::fixture::{fixtures, parse, row};
use super::*;

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
        let (params, recorded) = parse(&text);
        params.validate().unwrap();
        for c in recorded {
            let case = &c.line;
            let mut p = params.clone();
            p.seed = c.seed;
            let mut s = Sampler::new(p, c.vocab);
            for &t in &c.prompt {
                s.accept(t);
            }
            cases += 1;
            for (step, &(tok, n)) in c.expect.iter().enumerate() {
                row(&mut logits, c.vocab, c.lseed, step as u64, &c.rows);
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
