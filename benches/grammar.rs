//! Grammar matching on the engine thread, per generated token: the check of every
//! candidate (the mask) and the accept of the one sampled. A well-behaved grammar (a
//! JSON object of optional properties, over a 20 000-piece vocabulary) beside hostile
//! ones a request could send: a dozen repetitions stacked on one character, and an
//! ambiguous grammar whose check runs out of the work a step may do
//! (`grammar::stacks::MAX_WORK`), after which the generation ends. What each costs is
//! the most one request's grammar can take from every other session's tokens.
//! `cargo bench --bench grammar`.

use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::Arc;
use wgllm::grammar::{json_schema, Grammar, GrammarState, TokenPieces};

/// A vocabulary of `n` pieces of 1-6 characters from JSON's alphabet, and an
/// end-of-generation token last.
fn json_vocab(n: usize) -> Arc<TokenPieces> {
    let alphabet: Vec<char> = "{}[]\",: 0123456789abtruefalsnp\n-.".chars().collect();
    let mut x: u64 = 7;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    let mut pieces: Vec<Vec<u8>> = alphabet
        .iter()
        .map(|c| c.to_string().into_bytes())
        .collect();
    while pieces.len() < n {
        let len = 1 + next() % 6;
        let s: String = (0..len)
            .map(|_| alphabet[next() % alphabet.len()])
            .collect();
        pieces.push(s.into_bytes());
    }
    pieces.push(b"</s>".to_vec());
    let mut eog = vec![false; pieces.len()];
    *eog.last_mut().unwrap() = true;
    Arc::new(TokenPieces::from_pieces(pieces, eog))
}

/// The state after accepting `tokens`.
fn state_after(g: &str, vocab: &Arc<TokenPieces>, tokens: &[u32]) -> GrammarState {
    let g = Grammar::parse(g, None).expect("the grammar parses");
    let mut s = GrammarState::new(Arc::new(g), vocab.clone());
    for &t in tokens {
        s.accept(t).expect("the text fits the grammar");
    }
    s
}

/// One token's work: the check of every candidate, then the accept of `token`.
fn step(s: &GrammarState, ids: &[u32], allowed: &mut Vec<bool>, token: u32) -> bool {
    let mut s = s.clone();
    allowed.clear();
    allowed.resize(ids.len(), true);
    s.check(ids, allowed);
    s.accept(token).is_ok()
}

fn grammar(c: &mut Criterion) {
    let mut group = c.benchmark_group("grammar_token");
    group.sample_size(10);
    let mut allowed = Vec::new();

    // A JSON object of 50 optional integer properties, after `{"p3": 1`.
    let props: serde_json::Map<String, serde_json::Value> = (0..50)
        .map(|i| (format!("p{i}"), serde_json::json!({"type": "integer"})))
        .collect();
    let schema = serde_json::json!({"type": "object", "properties": props});
    let gbnf = json_schema::to_grammar(&schema).expect("the schema converts");
    let vocab = json_vocab(20_000);
    let ids: Vec<u32> = (0..vocab.n_vocab() as u32).collect();
    // The first 31 pieces are the alphabet's single characters, in its order.
    let alphabet = "{}[]\",: 0123456789abtruefalsnp\n-.";
    let tok = |ch: char| alphabet.chars().position(|a| a == ch).unwrap() as u32;
    let prefix: Vec<u32> = "{\"p3\": 1".chars().map(tok).collect();
    let s = state_after(&gbnf, &vocab, &prefix);
    group.bench_function("json_50_optional_properties", |b| {
        b.iter(|| assert!(step(&s, &ids, &mut allowed, tok(','))))
    });

    // Twelve repetitions stacked on one any-character (a fuzzer's find), after 40
    // characters; byte vocabulary.
    let bytes = Arc::new(TokenPieces::bytes());
    let byte_ids: Vec<u32> = (0..257).collect();
    let s = state_after(
        "root ::=(......*..++++++++++++)",
        &bytes,
        &[b'a' as u32; 40],
    );
    group.bench_function("stacked_repetitions", |b| {
        b.iter(|| step(&s, &byte_ids, &mut allowed, b'a' as u32))
    });

    // 12 288 stacks against 10 000 pieces that 8192 of them take a character of and
    // none takes whole: the check runs out of work.
    let mut pieces: Vec<Vec<u8>> = vec![b"a".to_vec()];
    pieces.extend((0..10_000).map(|i| format!("ay{i}").into_bytes()));
    pieces.push(b"</s>".to_vec());
    let mut eog = vec![false; pieces.len()];
    *eog.last_mut().unwrap() = true;
    let many = Arc::new(TokenPieces::from_pieces(pieces, eog));
    let many_ids: Vec<u32> = (0..many.n_vocab() as u32).collect();
    let s = state_after(
        r#"root ::= "a" root "b" | "a" root "c" | "z""#,
        &many,
        &[0; 12],
    );
    group.bench_function("ambiguous_past_the_work_of_a_step", |b| {
        b.iter(|| assert!(!step(&s, &many_ids, &mut allowed, 0)))
    });
    group.finish();
}

criterion_group!(benches, grammar);
criterion_main!(benches);
