//! The chain's steps, each working on the candidate list in place as the llama.cpp
//! sampler of the same name does (the order they run in is [`super::Sampler`]'s).

use super::rng::Mt19937;
use super::stdsort;
use super::{by_logit, Cand, Cands, SamplerParams};
use std::collections::VecDeque;

/// `std::max(a, b)`: `b` only if `a < b` (so NaN never replaces a value, nor is replaced).
pub(super) fn cpp_max(a: f32, b: f32) -> f32 {
    if a < b {
        b
    } else {
        a
    }
}

pub(super) fn logit_bias(cur: &mut Cands, p: &SamplerParams) {
    let bias = p
        .logit_bias
        .iter()
        .copied()
        .chain(p.banned.iter().map(|&t| (t, f32::NEG_INFINITY)));
    for (t, b) in bias {
        // A token past the candidates matches none of them.
        if let Some(c) = cur.data.get_mut(t as usize) {
            c.logit += b;
        }
    }
}

/// Repetition, frequency and presence penalties over the tokens in `history` (the last
/// `repeat_last_n` accepted): a token seen `count` times has a positive logit divided by
/// (a non-positive one multiplied by) `repeat_penalty` once, then
/// `count·frequency + presence` subtracted.
pub(super) fn penalize(cur: &mut Cands, history: &VecDeque<u32>, p: &SamplerParams) {
    let mut seen: Vec<u32> = history.iter().copied().collect();
    seen.sort_unstable();
    for run in seen.chunk_by(|a, b| a == b) {
        // Candidates are in id order here (nothing has sorted them yet).
        let Some(c) = cur.data.get_mut(run[0] as usize) else {
            continue;
        };
        let count = run.len();
        if c.logit <= 0.0 {
            c.logit *= p.repeat_penalty;
        } else {
            c.logit /= p.repeat_penalty;
        }
        c.logit -= count as f32 * p.frequency_penalty + 1.0 * p.presence_penalty;
    }
    cur.sorted = false;
}

/// Masks (to -inf) logits more than `n` standard deviations below the largest.
pub(super) fn top_n_sigma(cur: &mut Cands, n: f32) {
    if cur.data.len() <= 1 {
        return;
    }
    let mut max = cur.data[0].logit;
    let mut sum = 0.0f32;
    let mut valid = 0usize;
    for c in &cur.data {
        if c.logit != f32::NEG_INFINITY {
            max = cpp_max(max, c.logit);
            sum += c.logit;
            valid += 1;
        }
    }
    let mean = if valid > 0 { sum / valid as f32 } else { 0.0 };
    // The squares are taken (and summed) in double, the sum rounded back to float each step.
    let mut acc = 0.0f32;
    for c in &cur.data {
        if c.logit != f32::NEG_INFINITY {
            let d = (c.logit - mean) as f64;
            acc = (acc as f64 + d * d) as f32;
        }
    }
    let std = if valid > 0 {
        (acc / valid as f32).sqrt()
    } else {
        0.0
    };
    let cut = max - n * std;
    for c in &mut cur.data {
        if c.logit < cut {
            c.logit = f32::NEG_INFINITY;
        }
    }
}

/// llama.cpp's bucketed partial sort for large arrays: candidates go into 128 logit
/// buckets over [-10, 10) (outside: the end buckets), in their current order; the top
/// buckets that together hold at least `npartial` are `std::sort`ed, the last of them
/// only `std::partial_sort`ed as far as needed. `out` gets those buckets' candidates
/// (at least `npartial`, the first `npartial` in order).
pub(super) fn bucket_partial_sort(cur: &[Cand], npartial: usize, out: &mut Vec<Cand>) {
    const NB: usize = 128;
    const LOW: f32 = -10.0;
    const HIGH: f32 = 10.0;
    let scale: f32 = NB as f32 / (HIGH - LOW);
    let inter: f32 = -LOW * scale;
    let bucket = |l: f32| -> usize {
        let x = scale * l + inter;
        // C++ `int(x)` as x86 computes it: out of range (or NaN) gives INT_MIN.
        let i = if !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
            i32::MIN
        } else {
            x as i32
        };
        i.clamp(0, NB as i32 - 1) as usize
    };
    let mut histo = [0usize; NB];
    let idx: Vec<u8> = cur
        .iter()
        .map(|c| {
            let b = bucket(c.logit);
            histo[b] += 1;
            b as u8
        })
        .collect();
    let mut nhave = 0;
    let mut ib = NB - 1;
    loop {
        nhave += histo[ib];
        if nhave >= npartial || ib == 0 {
            break;
        }
        ib -= 1;
    }
    // Start of each kept bucket in `out`, highest bucket first.
    let mut start = [0usize; NB];
    let mut at = 0;
    for j in (ib..NB).rev() {
        start[j] = at;
        at += histo[j];
    }
    out.clear();
    out.resize(
        nhave,
        Cand {
            id: 0,
            logit: 0.0,
            p: 0.0,
        },
    );
    for (c, &b) in cur.iter().zip(&idx) {
        let b = b as usize;
        if b >= ib {
            out[start[b]] = *c;
            start[b] += 1;
        }
    }
    let mut at = 0;
    let mut done = 0;
    for j in (ib + 1..NB).rev() {
        stdsort::sort(&mut out[at..at + histo[j]], &by_logit);
        at += histo[j];
        done += histo[j];
    }
    stdsort::partial_sort(&mut out[at..at + histo[ib]], npartial - done, &by_logit);
}

/// llama.cpp's in-place partial sort: keeps only the first `npartial`, in order.
pub(super) fn partial_sort_inplace(cur: &mut Cands, npartial: usize, scratch: &mut Vec<Cand>) {
    if npartial <= 128 {
        stdsort::partial_sort(&mut cur.data, npartial, &by_logit);
    } else {
        bucket_partial_sort(&cur.data, npartial, scratch);
        cur.data[..npartial].copy_from_slice(&scratch[..npartial]);
    }
    cur.data.truncate(npartial);
    cur.sorted = true;
}

/// Softmax into `p` (float, max-subtracted), sorting first if `sort` is set.
pub(super) fn softmax(cur: &mut Cands, sort: bool, scratch: &mut Vec<Cand>) {
    assert!(!cur.data.is_empty());
    if sort && !cur.sorted {
        let n = cur.data.len();
        partial_sort_inplace(cur, n, scratch);
    }
    let mut max = cur.data[0].logit;
    if !cur.sorted {
        for c in &cur.data[1..] {
            max = cpp_max(max, c.logit);
        }
    }
    let mut sum = 0.0f32;
    for c in &mut cur.data {
        c.p = (c.logit - max).exp();
        sum += c.p;
    }
    for c in &mut cur.data {
        c.p /= sum;
    }
}

pub(super) fn top_k(cur: &mut Cands, k: i32, scratch: &mut Vec<Cand>) {
    let k = (k as usize).min(cur.data.len());
    if !cur.sorted {
        partial_sort_inplace(cur, k, scratch);
    }
    cur.data.truncate(k);
}

/// Locally typical sampling: keeps the tokens whose surprise is closest to the entropy,
/// until their probability exceeds `p`. Leaves the candidates in that order (unsorted).
pub(super) fn typical(cur: &mut Cands, p: f32, min_keep: usize, scratch: &mut Vec<Cand>) {
    softmax(cur, true, scratch);
    let mut entropy = 0.0f32;
    for c in &cur.data {
        entropy += -c.p * c.p.ln();
    }
    let shifted: Vec<f32> = cur
        .data
        .iter()
        .map(|c| (-c.p.ln() - entropy).abs())
        .collect();
    let mut order: Vec<usize> = (0..cur.data.len()).collect();
    stdsort::sort(&mut order, &|&a: &usize, &b: &usize| {
        shifted[a] < shifted[b]
    });
    let mut cum = 0.0f32;
    let mut last = order.len();
    for (i, &k) in order.iter().enumerate() {
        cum += cur.data[k].p;
        if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
            last = i + 1;
            break;
        }
    }
    scratch.clear();
    scratch.extend(order[..last].iter().map(|&k| cur.data[k]));
    cur.data.clear();
    cur.data.extend_from_slice(scratch);
    cur.sorted = false;
}

/// Nucleus sampling: keeps the most likely tokens until their probability reaches `p`.
pub(super) fn top_p(cur: &mut Cands, p: f32, min_keep: usize, buf: &mut Vec<Cand>) {
    softmax(cur, false, buf);
    let size = cur.data.len();
    let mut k = size;
    // When unsorted and large, sort only the top 256 first, and everything only if the
    // nucleus turns out bigger than that.
    let mut in_buf = false;
    if !cur.sorted && size > 1024 {
        k = size.min(256);
        bucket_partial_sort(&cur.data, k, buf);
        in_buf = true;
    } else if !cur.sorted {
        partial_sort_inplace(cur, k, buf);
    }
    let mut cum = 0.0f32;
    let mut last = size;
    for i in 0..size {
        cum += if in_buf { buf[i].p } else { cur.data[i].p };
        if cum >= p && i + 1 >= min_keep {
            last = i + 1;
            break;
        }
        if !cur.sorted && i == k - 1 {
            k = size;
            bucket_partial_sort(&cur.data, k, buf);
        }
    }
    if !cur.sorted {
        cur.data.clear();
        cur.data.extend_from_slice(&buf[..last]);
        cur.sorted = true;
    }
    cur.data.truncate(last);
}

/// Drops tokens whose probability is below `p` × the largest, i.e. whose logit is below
/// `max + ln p`.
pub(super) fn min_p(cur: &mut Cands, p: f32, min_keep: usize, scratch: &mut Vec<Cand>) {
    if cur.data.is_empty() {
        return;
    }
    if !cur.sorted {
        let mut max = -f32::MAX;
        for c in &cur.data {
            max = cpp_max(max, c.logit);
        }
        let min_logit = max + p.ln();
        scratch.clear();
        scratch.extend(cur.data.iter().filter(|c| c.logit >= min_logit).copied());
        if !scratch.is_empty() && scratch.len() >= min_keep {
            cur.data.clear();
            cur.data.extend_from_slice(scratch);
            return;
        }
        let n = cur.data.len();
        partial_sort_inplace(cur, n, scratch);
    }
    let min_logit = cur.data[0].logit + p.ln();
    let mut i = 1;
    while i < cur.data.len() {
        if cur.data[i].logit < min_logit && i >= min_keep {
            break;
        }
        i += 1;
    }
    cur.data.truncate(i);
}

/// Exclude Top Choices: with chance `prob`, drops every token at or above `threshold`
/// probability except the least likely of them.
pub(super) fn xtc(
    cur: &mut Cands,
    prob: f32,
    threshold: f32,
    min_keep: usize,
    rng: &mut Mt19937,
    scratch: &mut Vec<Cand>,
) {
    if cur.data.len() < 2 {
        return;
    }
    let chance = rng.uniform_f32();
    if chance > prob {
        return;
    }
    softmax(cur, true, scratch);
    let mut pos_last = 0;
    for (i, c) in cur.data.iter().enumerate() {
        if c.p >= threshold {
            pos_last = i;
        } else {
            break;
        }
    }
    if cur.data.len() - pos_last >= min_keep && pos_last > 0 {
        cur.data.drain(..pos_last);
    }
}

/// Divides the logits by `temp`; `temp <= 0` keeps only the first largest logit (all
/// others become -inf).
pub(super) fn scale_by_temp(cur: &mut Cands, temp: f32) {
    if cur.data.is_empty() {
        return;
    }
    if temp <= 0.0 {
        let mut max_i = 0;
        let mut max_l = cur.data[0].logit;
        for i in 1..cur.data.len() {
            if cur.data[i].logit > max_l {
                cur.data[max_i].logit = f32::NEG_INFINITY;
                max_i = i;
                max_l = cur.data[i].logit;
            } else {
                cur.data[i].logit = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for c in &mut cur.data {
        c.logit /= temp;
    }
}

/// Dynamic temperature: maps the candidates' normalised entropy to a temperature in
/// `[max(0, temp - range), temp + range]`.
pub(super) fn dynatemp(
    cur: &mut Cands,
    temp: f32,
    range: f32,
    exponent: f32,
    scratch: &mut Vec<Cand>,
) {
    let min_temp = 0.0f32.max(temp - range);
    let max_temp = temp + range;
    if cur.data.len() <= 1 {
        return;
    }
    let max_entropy = -(1.0f32 / cur.data.len() as f32).ln();
    softmax(cur, true, scratch);
    let mut entropy = 0.0f32;
    for c in &cur.data {
        if c.p > 0.0 {
            entropy -= c.p * c.p.ln();
        }
    }
    let normalized = entropy / max_entropy;
    let dyn_temp = min_temp + (max_temp - min_temp) * normalized.powf(exponent);
    scale_by_temp(cur, dyn_temp);
    // Probabilities for the scaled logits, in double (the draw recomputes its own).
    let max = cur.data[0].logit as f64;
    let mut sum = 0.0f64;
    for c in &mut cur.data {
        let p = (c.logit as f64 - max).exp();
        c.p = p as f32;
        sum += p;
    }
    for c in &mut cur.data {
        c.p = (c.p as f64 / sum) as f32;
    }
}

/// The final draw: softmax (float exponentials, double sums), one uniform double `u`,
/// and the first candidate where the running sum reaches `u` × the total. Returns the
/// chosen index and `u`. Draws even for a single candidate.
pub(super) fn draw(cur: &mut Cands, mut uniform: impl FnMut() -> f64) -> (usize, f64) {
    if cur.data.len() == 1 {
        let u = uniform();
        cur.data[0].p = 1.0;
        return (0, u);
    }
    let mut max = cur.data[0].logit;
    if !cur.sorted {
        for c in &cur.data[1..] {
            max = cpp_max(max, c.logit);
        }
    }
    let mut total = 0.0f64;
    for c in &mut cur.data {
        c.p = (c.logit - max).exp();
        total += c.p as f64;
    }
    let u = uniform();
    let target = total * u;
    let mut run = 0.0f64;
    let mut selected = None;
    for (i, c) in cur.data.iter_mut().enumerate() {
        if selected.is_none() {
            run += c.p as f64;
            if run >= target {
                selected = Some(i);
            }
        }
        c.p = (c.p as f64 / total) as f32;
    }
    (selected.unwrap_or(cur.data.len() - 1), u)
}
