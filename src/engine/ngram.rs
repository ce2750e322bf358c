//! Self-speculation by n-gram lookup (llama.cpp's `ngram-simple`): the last n tokens
//! (the sampled one included) are looked for earlier in the sequence, latest match first,
//! and the tokens that followed that match are proposed. No model runs: text that
//! repeats itself (code, lists, quoted input) gets long proposals for free.

/// llama.cpp's sizes for `ngram-simple`: n-grams of 12 looked up, up to 48 tokens
/// proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramParams {
    /// Tokens matched (`--spec-ngram-simple-size-n`).
    pub size_n: usize,
    /// Most tokens proposed (`--spec-ngram-simple-size-m`).
    pub size_m: usize,
}

impl Default for NgramParams {
    fn default() -> Self {
        NgramParams {
            size_n: 12,
            size_m: 48,
        }
    }
}

/// The proposal after `tokens` (what the sequence holds) and `sampled` (the token about
/// to be decoded): empty where the last n-gram does not occur earlier, where too few
/// tokens follow its occurrence, or where the sequence is too short to look in.
pub fn ngram_draft(p: NgramParams, tokens: &[u32], sampled: u32) -> Vec<u32> {
    let (n, m, len) = (p.size_n, p.size_m, tokens.len());
    if n == 0 || len <= n.saturating_add(m).saturating_add(1) {
        return Vec::new();
    }
    let mut pattern: Vec<u32> = tokens[len - n + 1..].to_vec();
    pattern.push(sampled);
    // Latest occurrence first; position 0 is never a match, as in llama.cpp.
    let Some(at) = (1..len - n)
        .rev()
        .find(|&j| tokens[j..j + n] == pattern[..])
    else {
        return Vec::new();
    };
    let take = m.min(len - (at + n));
    if take < n {
        return Vec::new();
    }
    tokens[at + n..at + n + take].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: NgramParams = NgramParams {
        size_n: 3,
        size_m: 4,
    };

    #[test]
    fn the_tokens_after_the_latest_match_are_proposed() {
        // ... 7 8 9 [1 2 3 4 5] ... 7 8 | 9: "7 8 9" occurs at 1 and 8; the latest wins.
        let t = [0, 7, 8, 9, 1, 2, 3, 0, 7, 8, 9, 4, 5, 6, 0, 0, 7, 8];
        assert_eq!(ngram_draft(P, &t, 9), vec![4, 5, 6, 0]);
        // No earlier "7 8 2".
        assert!(ngram_draft(P, &t, 2).is_empty());
    }

    #[test]
    fn short_sequences_and_short_tails_propose_nothing() {
        assert!(ngram_draft(P, &[7, 8, 9, 7, 8], 9).is_empty());
        // The match is found but only 2 tokens follow it (fewer than n).
        let t = [5, 5, 5, 5, 5, 5, 5, 1, 2, 3, 1, 2];
        assert!(ngram_draft(P, &t, 3).is_empty());
        // A match at position 0 does not count.
        let t = [1, 2, 3, 9, 9, 9, 9, 9, 9, 1, 2];
        assert!(ngram_draft(P, &t, 3).is_empty());
    }

    /// The same lookup written out plainly, on random sequences of few symbols.
    #[test]
    fn matches_a_plain_search() {
        let mut x = 12345u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 3) as u32
        };
        for len in 0..60 {
            let t: Vec<u32> = (0..len).map(|_| next()).collect();
            let s = next();
            let got = ngram_draft(P, &t, s);
            let mut want = Vec::new();
            if len > P.size_n + P.size_m + 1 {
                let mut pat = t[len - 2..].to_vec();
                pat.push(s);
                let mut j = len - P.size_n - 1;
                while j > 0 {
                    if t[j..j + 3] == pat[..] {
                        let take = P.size_m.min(len - j - 3);
                        if take >= P.size_n {
                            want = t[j + 3..j + 3 + take].to_vec();
                        }
                        break;
                    }
                    j -= 1;
                }
            }
            assert_eq!(got, want, "{t:?} then {s}");
        }
    }
}
