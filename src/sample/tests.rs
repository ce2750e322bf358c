use super::chain::*;
use super::rng::Mt19937;
use super::*;
use std::collections::HashSet;

fn params(temp: f32, top_k: i32, top_p: f32, min_p: f32) -> SamplerParams {
    SamplerParams {
        temp,
        top_k,
        top_p,
        min_p,
        seed: 1234,
        ..SamplerParams::default()
    }
}

fn cands(logits: &[f32]) -> Cands {
    Cands {
        data: logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Cand {
                id: i as u32,
                logit: l,
                p: 0.0,
            })
            .collect(),
        sorted: false,
    }
}

fn ids(c: &Cands) -> Vec<u32> {
    c.data.iter().map(|x| x.id).collect()
}

#[test]
fn defaults_are_llama_cpp_defaults() {
    let p = SamplerParams::default();
    assert_eq!((p.temp, p.top_k, p.top_p, p.min_p), (0.8, 40, 0.95, 0.05));
    assert_eq!((p.repeat_penalty, p.repeat_last_n), (1.0, 64));
    assert_eq!((p.frequency_penalty, p.presence_penalty), (0.0, 0.0));
    assert_eq!((p.typical_p, p.top_n_sigma, p.min_keep), (1.0, -1.0, 0));
    assert_eq!((p.xtc_probability, p.xtc_threshold), (0.0, 0.1));
    assert_eq!((p.dynatemp_range, p.dynatemp_exponent), (0.0, 1.0));
    assert_eq!(p.dry_multiplier, 0.0);
    assert_eq!(p.seed, SamplerParams::RANDOM_SEED);
    assert!(p.validate().is_ok());
}

#[test]
fn validate_rejects_what_llama_cpp_rejects_and_dry() {
    let bad = |f: fn(&mut SamplerParams)| {
        let mut p = SamplerParams::default();
        f(&mut p);
        p.validate().unwrap_err()
    };
    assert!(bad(|p| p.dry_multiplier = 0.8).contains("DRY"));
    assert!(bad(|p| p.repeat_penalty = 0.0).contains("repeat_penalty"));
    assert!(bad(|p| p.repeat_penalty = f32::INFINITY).contains("repeat_penalty"));
    assert!(bad(|p| p.repeat_penalty = 1e-40).contains("repeat_penalty"));
    assert!(bad(|p| p.frequency_penalty = f32::NAN).contains("frequency_penalty"));
    assert!(bad(|p| p.presence_penalty = f32::INFINITY).contains("presence_penalty"));
    assert!(bad(|p| p.top_p = f32::NAN).contains("top_p"));
    assert!(bad(|p| p.logit_bias = vec![(3, f32::NAN)]).contains("logit_bias"));
    let mut ok = SamplerParams::greedy();
    ok.logit_bias = vec![(3, f32::NEG_INFINITY)];
    assert!(ok.validate().is_ok());
}

#[test]
fn mt19937_matches_the_standard() {
    // The C++ standard requires the 10000th output of a default-seeded mt19937.
    let mut r = Mt19937::new(5489);
    assert_eq!(r.next_u32(), 3499211612);
    assert_eq!(r.next_u32(), 581869302);
    assert_eq!(r.next_u32(), 3890346734);
    let mut r = Mt19937::new(5489);
    let x = (0..10000).map(|_| r.next_u32()).last().unwrap();
    assert_eq!(x, 4123659995);
}

#[test]
fn uniform_reals_match_libstdcpp() {
    // Printed by g++ 12 / libstdc++: uniform_real_distribution<double>(0, 1) and
    // <float> over std::mt19937(42).
    let mut r = Mt19937::new(42);
    assert_eq!(r.uniform_f64(), 0.796542984287846);
    assert_eq!(r.uniform_f64(), 0.18343478789336848);
    assert_eq!(r.uniform_f64(), 0.7796909976126613);
    let mut r = Mt19937::new(42);
    assert_eq!(r.uniform_f32(), 0.374_540_12);
    assert_eq!(r.uniform_f32(), 0.796_543);
    assert_eq!(r.uniform_f32(), 0.950_714_3);
}

/// 40 (key, id) pairs with many equal keys, as the C++ check generated them.
fn tied_pairs(n: usize, modulo: u32, state: &mut u32) -> Vec<(u32, u32)> {
    (0..n as u32)
        .map(|i| {
            *state = state.wrapping_mul(1103515245).wrapping_add(12345);
            ((*state >> 16) % modulo, i)
        })
        .collect()
}

#[test]
fn sorts_order_ties_like_libstdcpp() {
    let desc = |a: &(u32, u32), b: &(u32, u32)| a.0 > b.0;
    let mut s = 7u32;
    let v = tied_pairs(40, 5, &mut s);
    let order = |w: &[(u32, u32)]| w.iter().map(|e| e.1).collect::<Vec<_>>();

    let mut w = v.clone();
    stdsort::sort(&mut w, &desc);
    assert_eq!(
        order(&w),
        [
            26, 17, 3, 25, 6, 22, 18, 19, 29, 32, 33, 10, 34, 36, 5, 2, 21, 28, 13, 15, 14, 38, 0,
            30, 1, 27, 39, 24, 23, 11, 9, 4, 20, 16, 31, 12, 35, 8, 37, 7
        ]
    );
    let mut w = v.clone();
    stdsort::partial_sort(&mut w, 7, &desc);
    assert_eq!(order(&w[..7]), [3, 17, 26, 25, 22, 6, 10]);
    let mut w = v.clone();
    stdsort::partial_sort(&mut w, 40, &desc);
    assert_eq!(
        order(&w),
        [
            3, 6, 17, 25, 26, 22, 34, 36, 18, 33, 10, 32, 2, 5, 19, 29, 15, 38, 0, 21, 13, 28, 14,
            39, 1, 4, 9, 23, 11, 24, 27, 30, 31, 7, 16, 35, 8, 37, 20, 12
        ]
    );
    // A larger introsort (partitions, recursion, the unguarded insertion pass).
    let mut big = tied_pairs(3000, 37, &mut s);
    stdsort::sort(&mut big, &desc);
    let h = big.iter().fold(0u64, |h, e| {
        h.wrapping_mul(1_000_003).wrapping_add(e.1 as u64)
    });
    assert_eq!(h, 674281450134020600);
}

#[test]
fn sorts_sort() {
    let mut s = 99u32;
    for n in [0usize, 1, 2, 3, 16, 17, 100, 1000, 5000] {
        let v = tied_pairs(n, 1000, &mut s);
        let mut w = v.clone();
        stdsort::sort(&mut w, &|a, b| a.0 < b.0);
        assert!(w.windows(2).all(|p| p[0].0 <= p[1].0), "n={n}");
        let mut ids: Vec<u32> = w.iter().map(|e| e.1).collect();
        ids.sort();
        assert_eq!(ids, (0..n as u32).collect::<Vec<_>>());
        for k in [0, 1, n / 3, n].into_iter().filter(|&k| k <= n) {
            let mut w = v.clone();
            stdsort::partial_sort(&mut w, k, &|a, b| a.0 < b.0);
            let mut all: Vec<u32> = v.iter().map(|e| e.0).collect();
            all.sort();
            assert_eq!(
                w[..k].iter().map(|e| e.0).collect::<Vec<_>>(),
                all[..k],
                "n={n} k={k}"
            );
        }
    }
}

#[test]
fn bucket_sort_keeps_the_top() {
    let mut s = 5u32;
    let c: Vec<Cand> = tied_pairs(5000, 4000, &mut s)
        .into_iter()
        .map(|(k, i)| Cand {
            id: i,
            logit: k as f32 * 0.01 - 20.0, // spans and overflows the bucket range
            p: 0.0,
        })
        .collect();
    let mut best: Vec<f32> = c.iter().map(|x| x.logit).collect();
    best.sort_by(|a, b| b.total_cmp(a));
    for k in [129, 256, 1000, 5000] {
        let mut out = Vec::new();
        bucket_partial_sort(&c, k, &mut out);
        assert!(out.len() >= k);
        let got: Vec<f32> = out[..k].iter().map(|x| x.logit).collect();
        assert_eq!(got, best[..k], "k={k}");
    }
}

#[test]
fn greedy_picks_argmax() {
    let mut s = Sampler::new(SamplerParams::greedy(), 5);
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9, 0.0]), 1);
    assert_eq!(s.sample(&[-5.0, -4.0, -3.0, -2.0, -1.0]), 4);
    // Ties: the first of them in the order top-k's (heap-based) sort leaves, as in
    // llama.cpp; with nothing sorting (no top-k, no top-p) the candidates stay in id
    // order and the lowest id wins.
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 0.0, 0.0]), 2);
    let mut s = Sampler::new(
        SamplerParams {
            top_k: 0,
            top_p: 1.0,
            ..SamplerParams::greedy()
        },
        5,
    );
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 0.0, 0.0]), 1);
}

#[test]
fn top_k_one_is_greedy_at_any_temperature() {
    let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 * 0.1).collect();
    let argmax = logits
        .iter()
        .enumerate()
        .fold(0, |b, (i, &l)| if l > logits[b] { i } else { b }) as u32;
    for temp in [0.1, 0.8, 1.5, 10.0] {
        let mut s = Sampler::new(params(temp, 1, 1.0, 0.0), logits.len());
        for _ in 0..20 {
            assert_eq!(s.sample(&logits), argmax, "temp {temp}");
        }
    }
}

#[test]
fn same_seed_same_sequence() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.7).sin()).collect();
    let run = |seed| {
        let mut s = Sampler::new(
            SamplerParams {
                seed,
                ..params(1.0, 0, 1.0, 0.0)
            },
            logits.len(),
        );
        (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
    // Only the low 32 bits count, as in llama.cpp's uint32_t seed.
    assert_eq!(run(7), run(7 + (1 << 32)));
    let distinct: HashSet<u32> = run(7).into_iter().collect();
    assert!(distinct.len() > 5, "{distinct:?}");
}

#[test]
fn random_seed_is_drawn_and_reproducible() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.3).cos()).collect();
    let p = params(1.0, 0, 1.0, 0.0);
    let mut a = Sampler::new(
        SamplerParams {
            seed: SamplerParams::RANDOM_SEED,
            ..p.clone()
        },
        50,
    );
    assert_ne!(a.seed(), SamplerParams::RANDOM_SEED);
    assert!(a.seed() <= u32::MAX as u64);
    let mut b = Sampler::new(
        SamplerParams {
            seed: a.seed(),
            ..p
        },
        50,
    );
    for _ in 0..32 {
        assert_eq!(a.sample(&logits), b.sample(&logits));
    }
}

#[test]
fn draws_one_double_per_token_and_none_on_accept() {
    // Rounds with a single candidate (top-k 1) still advance the generator once, and
    // accept never does: the picks after them equal picks from a generator advanced by
    // two outputs per sample.
    let logits: Vec<f32> = (0..30).map(|i| (i as f32 * 1.3).sin() * 2.0).collect();
    let mut s = Sampler::new(params(1.0, 1, 1.0, 0.0), 30);
    for t in 0..5 {
        s.sample(&logits);
        s.accept(t);
    }
    s.params.top_k = 0;
    let mut reference = Mt19937::new(1234);
    for _ in 0..5 {
        reference.uniform_f64();
    }
    let pick = s.run(&logits, true);
    assert_eq!(pick.rnd, reference.uniform_f64());
}

#[test]
fn sampling_follows_the_distribution() {
    // Two tokens with probabilities ~0.731 and ~0.269 (logit gap 1).
    let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0), 2);
    let n = 20000;
    let zeros = (0..n).filter(|_| s.sample(&[1.0, 0.0]) == 0).count();
    let frac = zeros as f64 / n as f64;
    assert!((frac - 0.7311).abs() < 0.02, "{frac}");
}

#[test]
fn min_p_filters_relative_to_top() {
    let mut scratch = Vec::new();
    // Probabilities proportional to e^logit: ratios to the top are 1, e^-1, e^-2, e^-3.
    let mut c = cands(&[0.0, -1.0, -2.0, -3.0]);
    min_p(&mut c, 0.2, 0, &mut scratch); // ln 0.2 = -1.61: keeps ratio 1 and e^-1 only
    assert_eq!(ids(&c), vec![0, 1]);
    let mut c = cands(&[-3.0, 0.0, -10.0, -1.0]);
    min_p(&mut c, 0.2, 0, &mut scratch); // unsorted: kept in place
    assert_eq!(ids(&c), vec![1, 3]);
    let mut c = cands(&[0.0, -10.0, -11.0]);
    min_p(&mut c, 0.99, 2, &mut scratch); // min_keep falls back to the sorted path
    assert_eq!(ids(&c), vec![0, 1]);
    assert!(c.sorted);
}

#[test]
fn top_p_keeps_smallest_prefix_reaching_p() {
    let mut buf = Vec::new();
    // Probabilities 0.5, 0.25, 0.125, 0.125.
    let l = [2f32.ln() * 2.0, 2f32.ln(), 0.0, 0.0];
    let mut c = cands(&l);
    top_p(&mut c, 0.7, 0, &mut buf);
    assert_eq!(ids(&c), vec![0, 1]);
    let mut c = cands(&l);
    top_p(&mut c, 0.5, 0, &mut buf);
    assert_eq!(ids(&c), vec![0]);
    let mut c = cands(&l);
    top_p(&mut c, 0.5, 3, &mut buf);
    assert_eq!(c.data.len(), 3);
    // A large unsorted array goes through the bucketed top-256 path and beyond.
    let big: Vec<f32> = (0..5000)
        .map(|i| ((i * 7919) % 5000) as f32 * -0.001)
        .collect();
    for p in [0.01f32, 0.5, 0.99] {
        let mut c = cands(&big);
        top_p(&mut c, p, 0, &mut buf);
        assert!(c.sorted);
        assert!(c.data.windows(2).all(|w| w[0].logit >= w[1].logit));
        let kept: f32 = c.data.iter().map(|x| x.p).sum();
        assert!(kept >= p * 0.999, "p={p}: {kept}");
        assert!(kept - c.data.last().unwrap().p < p, "p={p}");
    }
}

#[test]
fn top_k_keeps_k_best_sorted() {
    let mut c = cands(&[0.5, 3.0, 1.0, 2.0, -1.0]);
    top_k(&mut c, 3, &mut Vec::new());
    assert_eq!(ids(&c), vec![1, 3, 2]);
    assert!(c.sorted);
}

#[test]
fn typical_keeps_tokens_near_the_entropy() {
    let mut c = cands(&[3.0, 2.0, 1.0, 0.0, -5.0]);
    typical(&mut c, 0.5, 0, &mut Vec::new());
    assert!(!c.sorted);
    assert!(!ids(&c).contains(&4), "{:?}", ids(&c));
    assert!(!c.data.is_empty());
}

#[test]
fn filters_bound_what_can_be_drawn() {
    let logits = [5.0, 4.9, 0.0, -1.0, -2.0, 4.8];
    let mut s = Sampler::new(params(5.0, 2, 1.0, 0.0), logits.len());
    for _ in 0..200 {
        let t = s.sample(&logits);
        assert!(t == 0 || t == 1, "{t}");
    }
    let mut s = Sampler::new(params(5.0, 0, 1.0, 0.5), logits.len());
    for _ in 0..200 {
        let t = s.sample(&logits);
        assert!([0, 1, 5].contains(&t), "{t}");
    }
}

#[test]
fn xtc_removes_the_top_choices() {
    // Always fires: of the tokens above 10%, only the least likely stays.
    let p = SamplerParams {
        xtc_probability: 1.0,
        xtc_threshold: 0.1,
        ..params(1.0, 0, 1.0, 0.0)
    };
    let mut s = Sampler::new(p, 4);
    for _ in 0..50 {
        let t = s.sample(&[3.0, 2.5, 2.0, -9.0]);
        assert!(t == 2 || t == 3, "{t}");
    }
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative() {
    let p = SamplerParams {
        repeat_penalty: 2.0,
        repeat_last_n: 3,
        ..SamplerParams::greedy()
    };
    let mut s = Sampler::new(p, 4);
    // Token 0 leads; once seen, 3.0 / 2 = 1.5 loses to token 1's 2.0.
    assert_eq!(s.sample(&[3.0, 2.0, 0.0, -1.0]), 0);
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 2.0, 0.0, -1.0]), 1);
    // Negative logits get more negative: -0.5 * 2 = -1.0 loses to -0.8.
    let mut s = Sampler::new(p_with(2.0, 3), 3);
    s.accept(0);
    assert_eq!(s.sample(&[-0.5, -0.8, -3.0]), 1);
    // Repeats within the window are penalised once, not per occurrence.
    let mut s = Sampler::new(p_with(2.0, 8), 2);
    for _ in 0..4 {
        s.accept(0);
    }
    assert_eq!(s.sample(&[3.0, 1.4]), 0);
    // Only the last `repeat_last_n` tokens count.
    let mut s = Sampler::new(p_with(2.0, 3), 4);
    for t in [0, 2, 2, 2] {
        s.accept(t);
    }
    assert_eq!(s.sample(&[3.0, 2.0, 0.0, -1.0]), 0);
}

#[test]
fn frequency_counts_occurrences_presence_counts_once() {
    let base = SamplerParams {
        repeat_last_n: 8,
        ..SamplerParams::greedy()
    };
    // Token 0 seen three times: frequency 0.4 subtracts 1.2 (3.0 -> 1.8 < 2.0).
    let mut s = Sampler::new(
        SamplerParams {
            frequency_penalty: 0.4,
            ..base.clone()
        },
        2,
    );
    for _ in 0..3 {
        s.accept(0);
    }
    assert_eq!(s.sample(&[3.0, 2.0]), 1);
    // Presence 0.9 subtracts 0.9 however often (3.0 -> 2.1 > 2.0).
    let mut s = Sampler::new(
        SamplerParams {
            presence_penalty: 0.9,
            ..base
        },
        2,
    );
    for _ in 0..3 {
        s.accept(0);
    }
    assert_eq!(s.sample(&[3.0, 2.0]), 0);
}

fn p_with(pen: f32, last_n: usize) -> SamplerParams {
    SamplerParams {
        repeat_penalty: pen,
        repeat_last_n: last_n,
        ..SamplerParams::greedy()
    }
}

#[test]
fn banned_and_biased_tokens() {
    let mut p = params(1.5, 0, 1.0, 0.0);
    p.banned = vec![2];
    let mut s = Sampler::new(p, 4);
    for _ in 0..200 {
        assert_ne!(s.sample(&[0.0, 0.1, 9.0, 0.2]), 2);
    }
    let mut g = Sampler::new(
        SamplerParams {
            banned: vec![2],
            ..SamplerParams::greedy()
        },
        4,
    );
    assert_eq!(g.sample(&[0.0, 0.1, 9.0, 0.2]), 3);
    // A bias adds to the logit; ids past the vocabulary are ignored.
    let mut g = Sampler::new(
        SamplerParams {
            logit_bias: vec![(0, 10.0), (99, 50.0)],
            ..SamplerParams::greedy()
        },
        4,
    );
    assert_eq!(g.sample(&[0.0, 0.1, 9.0, 0.2]), 0);
}

#[test]
fn reset_keeps_the_stream_reseed_restarts_it() {
    let logits: Vec<f32> = (0..40).map(|i| (i as f32 * 0.9).sin()).collect();
    let p = params(1.0, 0, 1.0, 0.0);
    let mut a = Sampler::new(p.clone(), 40);
    let first: Vec<u32> = (0..16).map(|_| a.sample(&logits)).collect();
    a.reset();
    let second: Vec<u32> = (0..16).map(|_| a.sample(&logits)).collect();
    assert_ne!(first, second);
    a.reseed();
    let third: Vec<u32> = (0..16).map(|_| a.sample(&logits)).collect();
    assert_eq!(first, third);
}
