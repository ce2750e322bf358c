//! A chat reply's thinking, split from its answer as llama-server splits it: the reply is
//! read after the generation prompt (the part of the prompt a template adds to open the
//! assistant's turn), so a template that opens the turn inside `<think>` (DeepSeek-R1)
//! is read the same way as a model that writes the tag itself (Qwen 3).
//!
//! Two ways of writing thinking are known: tags (`<think>`…`</think>`, Magistral's
//! `[THINK]`…`[/THINK]`, Seed-OSS's `<seed:think>`…`</seed:think>`, Gemma 4's
//! `<|channel>thought`…`<channel|>`; the exact whitespace is read from how the template
//! renders an earlier turn's `reasoning_content`), and gpt-oss's channels (the `analysis` channel is thinking, the
//! `final` channel and commentary without a recipient are the answer). A template that
//! shows neither has no thinking: its replies are answer only, as they always were.
//!
//! No server types here: the server streams the differences of successive splits.

use super::template::ChatMessage;

/// How a chat template writes an assistant's thinking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Thinking {
    /// The template has no thinking: replies are answer only.
    None,
    /// Thinking between tags, with the whitespace the template puts around them (e.g.
    /// Qwen 3's `<think>\n` and `\n</think>\n\n`); whitespace at either end of a tag is
    /// optional when reading.
    Tags { start: String, end: String },
    /// gpt-oss's channels: `<|start|>assistant<|channel|>analysis<|message|>…<|end|>`.
    Channels,
}

/// A reply read as thinking and answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// What a reply added to its thinking and to its answer since the last split.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub reasoning: String,
    pub content: String,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

/// The thinking tags a template may use, found by the closing one (DeepSeek-R1's template
/// only ever writes `</think>`); the others' templates hold both. Third: the opening as
/// the model writes it, where a template's render shows no earlier thinking (Gemma 4's
/// drops it) — its whitespace is optional when reading.
const TAG_PAIRS: [(&str, &str, &str); 4] = [
    ("<think>", "</think>", "<think>"),
    ("[THINK]", "[/THINK]", "[THINK]"),
    ("<seed:think>", "</seed:think>", "<seed:think>"),
    ("<|channel>thought", "<channel|>", "<|channel>thought\n"),
];

const REASONING_PROBE: &str = "WGLLM_PROBE_REASONING";
const CONTENT_PROBE: &str = "WGLLM_PROBE_CONTENT";

impl Thinking {
    /// How `template` writes thinking. `render(messages)` renders a conversation
    /// without a generation prompt (None where the template fails on it): an earlier
    /// assistant turn with `reasoning_content` shows the tags and their whitespace.
    pub fn of_template(
        template: &str,
        render: impl Fn(&[ChatMessage]) -> Option<String>,
    ) -> Thinking {
        if template.contains("<|channel|>") {
            return Thinking::Channels;
        }
        let pair = TAG_PAIRS.iter().find(|(open, close, _)| {
            template.contains(close) && (*open == "<think>" || template.contains(open))
        });
        let Some(&(open_tag, close_tag, written)) = pair else {
            return Thinking::None;
        };
        let mut assistant = ChatMessage::new("assistant", CONTENT_PROBE);
        assistant
            .extra
            .insert("reasoning_content".into(), REASONING_PROBE.into());
        let probe = [ChatMessage::new("user", "Hi"), assistant];
        let shown = render(&probe).and_then(|text| {
            let r = text.find(REASONING_PROBE)?;
            let after = r + REASONING_PROBE.len();
            let c = after + text[after..].find(CONTENT_PROBE)?;
            let open = text[..r].rfind(open_tag)?;
            let (start, end) = (&text[open..r], &text[after..c]);
            end.contains(close_tag)
                .then(|| (start.to_string(), end.to_string()))
        });
        // Templates that only cut earlier replies at the closing tag (DeepSeek-R1's) show
        // no whitespace: the bare tags.
        let (start, end) = shown.unwrap_or_else(|| (written.into(), close_tag.into()));
        Thinking::Tags { start, end }
    }

    /// Whether the template has thinking at all.
    pub fn supported(&self) -> bool {
        *self != Thinking::None
    }

    /// The tag that opens thinking and the one that closes it, without whitespace.
    pub fn tags(&self) -> Option<(&str, &str)> {
        match self {
            Thinking::None => None,
            Thinking::Tags { start, end } => Some((start.trim(), end.trim())),
            Thinking::Channels => Some(("<|channel|>analysis<|message|>", "<|end|>")),
        }
    }

    /// `output` (the model's text after `gen_prompt`) as thinking and answer. Without
    /// `extract` nothing is thinking, but what the generation prompt opened (a
    /// prefilled `<think>\n`) is part of the answer, as llama-server gives it. `partial`:
    /// more text may follow, so the start of a closing tag at the end is held back.
    pub fn split(&self, gen_prompt: &str, output: &str, extract: bool, partial: bool) -> Split {
        let mut s = match self {
            Thinking::None => Split {
                reasoning: String::new(),
                content: output.to_string(),
            },
            Thinking::Tags { start, end } => {
                split_tags(start, end, gen_prompt, output, extract, partial)
            }
            Thinking::Channels => split_channels(gen_prompt, output, extract, partial),
        };
        // Whitespace-only thinking (an empty `<think>\n\n</think>`) is none.
        if s.reasoning.trim_matches([' ', '\n', '\r', '\t']).is_empty() {
            s.reasoning.clear();
        }
        s
    }
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// `text` without the longest end that starts `tag` (a tag being written).
fn hold_back<'a>(text: &'a str, tag: &str) -> &'a str {
    for n in (1..tag.len().min(text.len() + 1)).rev() {
        if tag.is_char_boundary(n) && text.ends_with(&tag[..n]) {
            return &text[..text.len() - n];
        }
    }
    text
}

/// Matches `tag` at `at` with each whitespace character at its ends optional; the
/// position after it, or None when its core is not there.
fn optspace(input: &str, at: usize, tag: &str) -> Option<usize> {
    let core = tag.trim_matches(is_space);
    let lead = tag.len() - tag.trim_start_matches(is_space).len();
    let mut pos = at;
    for c in tag[..lead].chars() {
        if input[pos..].starts_with(c) {
            pos += c.len_utf8();
        }
    }
    if !input[pos..].starts_with(core) {
        return None;
    }
    pos += core.len();
    for c in tag[lead + core.len()..].chars() {
        if input[pos..].starts_with(c) {
            pos += c.len_utf8();
        }
    }
    Some(pos)
}

fn split_tags(
    start: &str,
    end: &str,
    gen_prompt: &str,
    output: &str,
    extract: bool,
    partial: bool,
) -> Split {
    let (open, close) = (start.trim_matches(is_space), end.trim_matches(is_space));
    let input = format!("{gen_prompt}{output}");
    // What the generation prompt holds before a prefilled opening tag is not the reply's.
    let prefix = gen_prompt.find(open).unwrap_or(gen_prompt.len());
    let mut pos = prefix;
    pos += input[pos..].len() - input[pos..].trim_start_matches(is_space).len();
    let mut split = Split::default();
    if !extract {
        split.content = input[pos..].to_string();
        return split;
    }
    match optspace(&input, pos, start) {
        Some(r) => match input[r..].find(close) {
            Some(e) => {
                split.reasoning = input[r..r + e].to_string();
                pos = optspace(&input, r + e, end).unwrap_or(r + e + close.len());
            }
            None => {
                let rest = &input[r..];
                split.reasoning = if partial {
                    hold_back(rest, close)
                } else {
                    rest
                }
                .to_string();
                return split;
            }
        },
        // An opening tag being written: nothing is known yet.
        None if partial && open.starts_with(input[pos..].trim_start_matches(is_space)) => {
            return split;
        }
        None => {}
    }
    split.content = input[pos..].to_string();
    split
}

fn split_channels(gen_prompt: &str, output: &str, extract: bool, partial: bool) -> Split {
    const START: &str = "<|start|>assistant";
    const END: &str = "<|end|>";
    const ANALYSIS: &str = "<|channel|>analysis<|message|>";
    const PREAMBLE: &str = "<|channel|>commentary<|message|>";
    const FINAL: &str = "<|channel|>final<|message|>";
    let input = format!("{gen_prompt}{output}");
    let mut split = Split::default();
    let mut pos = 0;
    // gpt-oss sometimes writes a stray commentary channel before the real one.
    let stray = |at: usize| -> usize {
        let mut p = at;
        if input[p..].starts_with("<|channel|>commentary") && !input[p..].starts_with(PREAMBLE) {
            p += "<|channel|>commentary".len();
            if input[p..].starts_with(" to=assistant") {
                p += " to=assistant".len();
            }
        }
        p
    };
    loop {
        if !input[pos..].starts_with(START) {
            break;
        }
        pos += START.len();
        let at = stray(pos);
        let (body_at, reasoning, head) = if input[at..].starts_with(ANALYSIS) {
            (at + ANALYSIS.len(), true, &input[pos..at + ANALYSIS.len()])
        } else if input[pos..].starts_with(PREAMBLE) {
            (pos + PREAMBLE.len(), false, "")
        } else if input[at..].starts_with(FINAL) {
            // The answer: to the end (or to an `<|end|>`).
            let body = &input[at + FINAL.len()..];
            let body = match body.find(END) {
                Some(e) => &body[..e],
                None if partial => hold_back(body, END),
                None => body,
            };
            split.content.push_str(body);
            return split;
        } else {
            break;
        };
        let rest = &input[body_at..];
        let (body, closed) = match rest.find(END) {
            Some(e) => (&rest[..e], true),
            None if partial => (hold_back(rest, END), false),
            None => (rest, false),
        };
        match (reasoning, extract) {
            (true, true) => split.reasoning.push_str(body),
            (true, false) => {
                split.content.push_str(head);
                split.content.push_str(body);
                if closed {
                    split.content.push_str(END);
                }
            }
            (false, _) => split.content.push_str(body),
        }
        if !closed {
            return split;
        }
        pos = body_at + body.len() + END.len();
    }
    // A header being written: nothing more is known yet. A whole reply that follows no
    // channel is kept as the answer rather than lost (llama-server fails the request).
    if !partial && pos < input.len() {
        split.content.push_str(&input[pos.max(gen_prompt.len())..]);
    }
    split
}

/// A streamed reply read again at each piece, as llama-server reads it: what each split
/// adds to the last is sent.
pub struct Splitter {
    thinking: Thinking,
    gen_prompt: String,
    extract: bool,
    text: String,
    last: Split,
}

impl Splitter {
    pub fn new(thinking: Thinking, gen_prompt: String, extract: bool) -> Splitter {
        Splitter {
            thinking,
            gen_prompt,
            extract,
            text: String::new(),
            last: Split::default(),
        }
    }

    /// The reply so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Adds a piece of the reply; what it added to the thinking and the answer.
    pub fn push(&mut self, piece: &str) -> Delta {
        self.text.push_str(piece);
        self.advance(true)
    }

    /// The reply is whole: what was held back.
    pub fn finish(&mut self) -> Delta {
        self.advance(false)
    }

    fn advance(&mut self, partial: bool) -> Delta {
        let next = (self.thinking).split(&self.gen_prompt, &self.text, self.extract, partial);
        let d = Delta {
            reasoning: added(&self.last.reasoning, &next.reasoning),
            content: added(&self.last.content, &next.content),
        };
        self.last = next;
        d
    }
}

/// What `now` adds to `before` (nothing when it does not extend it: a reading can only
/// grow, except where text held back turns out to be something else).
fn added(before: &str, now: &str) -> String {
    now.strip_prefix(before).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3() -> Thinking {
        Thinking::Tags {
            start: "<think>\n".into(),
            end: "\n</think>\n\n".into(),
        }
    }

    fn bare() -> Thinking {
        Thinking::Tags {
            start: "<think>".into(),
            end: "</think>".into(),
        }
    }

    fn split(t: &Thinking, gp: &str, out: &str) -> (String, String) {
        let s = t.split(gp, out, true, false);
        (s.reasoning, s.content)
    }

    const QWEN_GP: &str = "<|im_start|>assistant\n";

    #[test]
    fn qwen3_tags_keep_the_newline_before_the_closing_tag() {
        let t = qwen3();
        let r = split(&t, QWEN_GP, "<think>\nI think.\n</think>\n\nHello!");
        assert_eq!(r, ("I think.\n".into(), "Hello!".into()));
        assert_eq!(
            split(&t, QWEN_GP, "<think>\nI think."),
            ("I think.".into(), "".into())
        );
        assert_eq!(split(&t, QWEN_GP, "\n Hello"), ("".into(), "Hello".into()));
        // Thinking turned off: the template's empty block is no thinking.
        let off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert_eq!(split(&t, off, "Hello!"), ("".into(), "Hello!".into()));
        let raw = t.split(off, "Hello!", false, false);
        assert_eq!(raw.content, "<think>\n\n</think>\n\nHello!");
    }

    #[test]
    fn a_prefilled_opening_tag_makes_the_reply_thinking() {
        let t = bare();
        let gp = "<｜Assistant｜><think>\n";
        let r = split(&t, gp, "I think.\n</think>\n\nHello!");
        assert_eq!(r, ("\nI think.\n".into(), "\n\nHello!".into()));
        assert_eq!(split(&t, gp, "I think."), ("\nI think.".into(), "".into()));
    }

    #[test]
    fn streaming_holds_back_a_closing_tag_being_written() {
        let mut s = Splitter::new(qwen3(), QWEN_GP.into(), true);
        let mut reasoning = String::new();
        let mut content = String::new();
        for piece in ["<thi", "nk>\nI", " think.\n</th", "ink>", "\n\nHel", "lo!"] {
            let d = s.push(piece);
            assert!(!d.reasoning.contains('<'), "{d:?}");
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
        }
        let d = s.finish();
        reasoning.push_str(&d.reasoning);
        content.push_str(&d.content);
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("I think.\n", "Hello!")
        );
    }

    #[test]
    fn gpt_oss_channels() {
        let t = Thinking::Channels;
        let gp = "<|start|>assistant";
        let out =
            "<|channel|>analysis<|message|>R1<|end|><|start|>assistant<|channel|>final<|message|>C";
        assert_eq!(split(&t, gp, out), ("R1".into(), "C".into()));
        let raw = t.split(gp, out, false, false);
        assert_eq!(raw.content, "<|channel|>analysis<|message|>R1<|end|>C");
        let part = t.split(gp, "<|channel|>analysis<|message|>R<|e", true, true);
        assert_eq!((part.reasoning.as_str(), part.content.as_str()), ("R", ""));
        // Streamed: no header leaks into either part.
        let mut s = Splitter::new(Thinking::Channels, gp.into(), true);
        let (mut r, mut c) = (String::new(), String::new());
        for piece in out.split_inclusive(['|', '>']) {
            let d = s.push(piece);
            r.push_str(&d.reasoning);
            c.push_str(&d.content);
        }
        let d = s.finish();
        r.push_str(&d.reasoning);
        c.push_str(&d.content);
        assert_eq!((r.as_str(), c.as_str()), ("R1", "C"));
    }

    #[test]
    fn other_tag_pairs_are_found_by_their_closing_tag() {
        let none = |_: &[ChatMessage]| None;
        let magistral = Thinking::of_template("{{ '[THINK]' + t + '[/THINK]' }}", none);
        let s = magistral.split("", "[THINK]hm[/THINK]Hi", true, false);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("hm", "Hi"));
        // Gemma 4 writes a newline after its opening, not part of the thinking.
        let gemma4 = Thinking::of_template("{{ '<|channel>thought\\n' + t + '<channel|>' }}", none);
        let s = gemma4.split("", "<|channel>thought\nhm<channel|>Hi", true, false);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("hm", "Hi"));
        // An opening without its closing tag is no thinking template.
        assert_eq!(
            Thinking::of_template("{{ '[THINK]' }}", none),
            Thinking::None
        );
    }

    #[test]
    fn templates_without_tags_have_no_thinking() {
        let t = Thinking::of_template("{{ messages }}", |_| Some(String::new()));
        assert_eq!(t, Thinking::None);
        assert_eq!(
            split(&t, "x", " a <think>b</think>"),
            ("".into(), " a <think>b</think>".into())
        );
    }
}
