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

/// llama-server's `n_indent` (editors' fill-in-the-middle): once the text has a new
/// line, every further line must start with at least `n_indent` spaces or tabs; the
/// first that does not ends the generation (as `n_predict` would) and is cut after its
/// indentation. Checked as llama-server checks it: per token, on the line begun by the
/// newline found one token earlier (a newline is looked for once per token). Text from
/// that line on is held back until it passed.
#[derive(Clone, Debug, Default)]
pub struct IndentLimit {
    n_indent: usize,
    text: String,
    shown: usize,
    has_new_line: bool,
    /// Where the line checked next begins (0: none yet).
    line: usize,
    stopped: bool,
}

impl IndentLimit {
    /// `n_indent` 0: no limit, text passes at once.
    pub fn new(n_indent: usize) -> Self {
        IndentLimit {
            n_indent,
            ..Self::default()
        }
    }

    /// Whether a line fell short of the indentation (the generation should end).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Takes the next token's text; returns what can be shown now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.n_indent == 0 {
            return piece.to_string();
        }
        if self.stopped {
            return String::new();
        }
        self.text.push_str(piece);
        if self.has_new_line {
            if self.line > 0 {
                let rest = &self.text[self.line..];
                let ws = rest
                    .bytes()
                    .take_while(|&b| b == b' ' || b == b'\t')
                    .count();
                if ws < rest.len() && ws < self.n_indent {
                    self.stopped = true;
                    self.text.truncate(self.line + ws);
                    return self.release(self.text.len());
                }
            }
            if let Some(p) = self.text[self.line..].find('\n') {
                self.line += p + 1;
            }
        }
        if piece.contains('\n') {
            self.has_new_line = true;
        }
        // What no later check can cut: the first line (never checked), and every line
        // before the one checked next.
        let upto = if self.has_new_line && self.line == 0 {
            self.text.find('\n').map_or(self.text.len(), |p| p + 1)
        } else if self.has_new_line {
            self.line
        } else {
            self.text.len()
        };
        self.release(upto)
    }

    /// The end of the text: whatever was held back (nothing after a stop).
    pub fn finish(&mut self) -> String {
        self.release(self.text.len())
    }

    fn release(&mut self, upto: usize) -> String {
        let upto = upto.max(self.shown);
        let s = self.text[self.shown..upto].to_string();
        self.shown = upto;
        s
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
mod indent_tests {
    use super::IndentLimit;

    fn run(n: usize, pieces: &[&str]) -> (String, usize, bool) {
        let mut l = IndentLimit::new(n);
        let mut out = String::new();
        for (i, p) in pieces.iter().enumerate() {
            out.push_str(&l.push(p));
            if l.stopped() {
                return (out, i + 1, true);
            }
        }
        out.push_str(&l.finish());
        (out, pieces.len(), false)
    }

    #[test]
    fn a_line_short_of_the_indentation_ends_the_text() {
        // The line after "body\n" starts "}" (0 < 4): cut after its (empty) indentation.
        let p = ["if x {", "\n", "    body", "\n", "}", " else", " {"];
        assert_eq!(run(4, &p), ("if x {\n    body\n".into(), 5, true));
        // llama-server marks the first newline after its token, finds where its line
        // begins at the next token and checks that line from the one after: "}" in the
        // newline's own token ends the text two tokens later.
        let p = ["{", "\n}", " x", " y", " z"];
        assert_eq!(run(4, &p), ("{\n".into(), 4, true));
        // Indented enough: everything.
        let p = ["a", "\n", "    b", "\n", "    c"];
        assert_eq!(run(4, &p), ("a\n    b\n    c".into(), 5, false));
        // No limit.
        assert_eq!(run(0, &["a\n", "b"]), ("a\nb".into(), 2, false));
        // Partial indentation stays, as llama-server keeps it.
        let p = ["x", "\n", "  y", "z", "w"];
        assert_eq!(run(4, &p), ("x\n  ".into(), 4, true));
    }
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
