use super::*;

fn params(temp: f32, top_k: i32, top_p: f32, min_p: f32) -> SamplerParams {
    SamplerParams {
        temp,
        top_k,
        top_p,
        min_p,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        seed: 1234,
        banned: Vec::new(),
    }
}

fn cands(logits: &[f32]) -> Vec<Cand> {
    let mut c: Vec<Cand> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| Cand {
            id: i as u32,
            logit: l,
        })
        .collect();
    sort_desc(&mut c);
    c
}

fn ids(c: &[Cand]) -> Vec<u32> {
    c.iter().map(|x| x.id).collect()
}

#[test]
fn defaults_are_llama_cpp_defaults() {
    let p = SamplerParams::default();
    assert_eq!((p.temp, p.top_k, p.top_p, p.min_p), (0.8, 40, 0.95, 0.05));
    assert_eq!((p.repeat_penalty, p.repeat_last_n), (1.0, 64));
}

#[test]
fn greedy_picks_argmax() {
    let mut s = Sampler::new(SamplerParams::greedy(), 5);
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9, 0.0]), 1);
    assert_eq!(s.sample(&[-5.0, -4.0, -3.0, -2.0, -1.0]), 4);
    // Ties go to the first maximum.
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
    // And the draws are actually spread out.
    let distinct: HashSet<u32> = run(7).into_iter().collect();
    assert!(distinct.len() > 5, "{distinct:?}");
}

#[test]
fn random_seed_is_drawn() {
    let a = Sampler::new(SamplerParams::default(), 10);
    assert_ne!(a.seed(), SamplerParams::RANDOM_SEED);
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
    // Probabilities proportional to e^logit: ratios to the top are 1, e^-1, e^-2, e^-3.
    let mut c = cands(&[0.0, -1.0, -2.0, -3.0]);
    min_p(&mut c, 0.2); // ln 0.2 = -1.61: keeps ratio 1 and e^-1 only
    assert_eq!(ids(&c), vec![0, 1]);
    let mut c = cands(&[0.0, -1.0, -2.0, -3.0]);
    min_p(&mut c, 0.0);
    assert_eq!(c.len(), 4);
    let mut c = cands(&[0.0, -10.0]);
    min_p(&mut c, 0.99);
    assert_eq!(ids(&c), vec![0]);
}

#[test]
fn top_p_keeps_smallest_prefix_reaching_p() {
    // Probabilities 0.5, 0.25, 0.125, 0.125.
    let l = [2f32.ln() * 2.0, 2f32.ln(), 0.0, 0.0];
    let mut c = cands(&l);
    top_p(&mut c, 0.7);
    assert_eq!(ids(&c), vec![0, 1]);
    let mut c = cands(&l);
    top_p(&mut c, 0.5);
    assert_eq!(ids(&c), vec![0]);
    let mut c = cands(&l);
    top_p(&mut c, 0.8);
    assert_eq!(ids(&c), vec![0, 1, 2]);
    let mut c = cands(&l);
    top_p(&mut c, 1.0);
    assert_eq!(c.len(), 4);
}

#[test]
fn top_k_keeps_k_best_sorted() {
    let mut c: Vec<Cand> = [0.5, 3.0, 1.0, 2.0, -1.0]
        .iter()
        .enumerate()
        .map(|(i, &l)| Cand {
            id: i as u32,
            logit: l,
        })
        .collect();
    top_k(&mut c, 3);
    assert_eq!(ids(&c), vec![1, 3, 2]);
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

fn p_with(pen: f32, last_n: usize) -> SamplerParams {
    SamplerParams {
        repeat_penalty: pen,
        repeat_last_n: last_n,
        ..SamplerParams::greedy()
    }
}

#[test]
fn pcg_is_deterministic_and_uniform() {
    let mut r = Pcg32::new(42);
    let xs: Vec<f64> = (0..10000).map(|_| r.next_f64()).collect();
    assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    assert!((mean - 0.5).abs() < 0.02, "{mean}");
    let mut r2 = Pcg32::new(42);
    assert_eq!(r2.next_f64(), xs[0]);
}

#[test]
fn banned_tokens_are_never_sampled() {
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
}
