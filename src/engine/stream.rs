//! Text and time bookkeeping of a session: token pieces turned into whole UTF-8
//! characters, and llama.cpp-style timing counters.

use std::time::Duration;

/// Counters printed at the end as llama.cpp prints them.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub load: Duration,
    pub prompt: Duration,
    pub prompt_tokens: usize,
    pub eval: Duration,
    pub eval_tokens: usize,
    /// Tokens a draft model proposed, and those of them kept (speculative decoding).
    pub draft_n: usize,
    pub draft_accepted: usize,
}

impl Timings {
    /// Adds another request's prompt and generation time (the chat CLI's turns).
    pub fn add(&mut self, other: &Timings) {
        self.prompt += other.prompt;
        self.prompt_tokens += other.prompt_tokens;
        self.eval += other.eval;
        self.eval_tokens += other.eval_tokens;
        self.draft_n += other.draft_n;
        self.draft_accepted += other.draft_accepted;
    }

    fn line(label: &str, d: Duration, n: usize, unit: &str) -> String {
        let ms = d.as_secs_f64() * 1e3;
        let per = if n > 0 { ms / n as f64 } else { 0.0 };
        let tps = if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        format!("{label} = {ms:10.2} ms / {n:5} {unit} ({per:8.2} ms per token, {tps:8.2} tokens per second)")
    }

    /// The summary block (for stderr).
    pub fn report(&self) -> String {
        let total = self.load + self.prompt + self.eval;
        [
            format!(
                "wgllm_perf:        load time = {:10.2} ms",
                self.load.as_secs_f64() * 1e3
            ),
            Self::line(
                "wgllm_perf: prompt eval time",
                self.prompt,
                self.prompt_tokens,
                "tokens",
            ),
            Self::line(
                "wgllm_perf:        eval time",
                self.eval,
                self.eval_tokens,
                "runs  ",
            ),
            format!(
                "wgllm_perf:       total time = {:10.2} ms / {:5} tokens",
                total.as_secs_f64() * 1e3,
                self.prompt_tokens + self.eval_tokens
            ),
        ]
        .into_iter()
        .chain((self.draft_n > 0).then(|| {
            let rate = self.draft_accepted as f64 / self.draft_n as f64;
            format!(
                "wgllm_perf: draft acceptance rate = {rate:.5} ({:5} accepted / {:5} generated) = {:.1} %",
                self.draft_accepted,
                self.draft_n,
                100.0 * rate
            )
        }))
        .collect::<Vec<_>>()
        .join("\n")
    }
}

/// Turns token pieces into text, holding back an incomplete UTF-8 sequence.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // An error with no length is an incomplete tail: keep it for the next piece.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        text
    }

    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// Stop strings over a stream of text (llama-server's `stop`): text that might be the
/// start of a stop string is held back until the next piece decides; a whole stop string
/// ends the generation and neither it nor anything after it is shown.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    words: Vec<String>,
    held: String,
    found: Option<String>,
}

impl StopStrings {
    pub fn new(words: Vec<String>) -> Self {
        StopStrings {
            words: words.into_iter().filter(|w| !w.is_empty()).collect(),
            ..Self::default()
        }
    }

    /// The stop string found, once one was.
    pub fn found(&self) -> Option<&str> {
        self.found.as_deref()
    }

    /// Takes the next piece of text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> String {
        if self.found.is_some() {
            return String::new();
        }
        self.held.push_str(text);
        // The earliest whole stop string ends the text.
        let hit = (self.words.iter())
            .filter_map(|w| self.held.find(w.as_str()).map(|at| (at, w)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, w)) = hit {
            self.found = Some(w.clone());
            let shown = self.held[..at].to_string();
            self.held.clear();
            return shown;
        }
        // Hold back the longest tail that begins some stop string.
        let keep = (self.words.iter())
            .map(|w| partial_tail(&self.held, w))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let shown = self.held[..cut].to_string();
        self.held.drain(..cut);
        shown
    }

    /// The end of the text: whatever was held back is shown.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest proper suffix of `text` that is a prefix of `word` (on
/// character boundaries).
fn partial_tail(text: &str, word: &str) -> usize {
    (1..word.len().min(text.len() + 1))
        .rev()
        .filter(|&n| text.is_char_boundary(text.len() - n) && word.is_char_boundary(n))
        .find(|&n| text.ends_with(&word[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod stop_tests {
    use super::StopStrings;

    #[test]
    fn stop_strings_hold_back_partial_matches() {
        let mut s = StopStrings::new(vec!["</s>".into(), "\n\n".into()]);
        assert_eq!(s.push("Hello <"), "Hello ");
        assert_eq!(s.push("/"), "");
        assert_eq!(s.push("b>"), "</b>");
        assert_eq!(s.push(" x\n"), " x");
        assert_eq!(s.push("\nmore"), "");
        assert_eq!(s.found(), Some("\n\n"));
        assert_eq!(s.push("ignored"), "");
        assert_eq!(s.finish(), "");
        let mut s = StopStrings::new(vec!["élan".into()]);
        assert_eq!(s.push("caf"), "caf");
        assert_eq!(s.push("é"), "");
        assert_eq!(s.push("!"), "é!");
        assert_eq!(s.push("él"), "");
        assert_eq!(s.finish(), "él");
        let mut none = StopStrings::new(vec![]);
        assert_eq!(none.push("abc"), "abc");
    }
}
