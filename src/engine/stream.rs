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
}

impl Timings {
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
