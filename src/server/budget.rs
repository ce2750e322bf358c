//! The memory one request may take (`--request-budget-mib`): what parsing its body,
//! tokenizing its texts and building its reply would cost is worked out (or bounded)
//! from the request before the work, and a request over the budget gets a 400 that
//! names the budget and the request's cost, instead of taking the server's memory from
//! every other client.
//!
//! The costs are estimates of the memory the work holds at its peak, in bytes:
//! - a body's JSON parsed into values: [`json_cost`], read off the bytes without
//!   parsing them (each value, string, array slot and object member at what serde_json
//!   keeps for it, vectors' growth included);
//! - tokenizing a text: [`TOKENIZE_BYTES_PER_BYTE`] per byte (the pre-tokenizer's pieces
//!   of one-byte words, the tokens; the merge itself is bounded per word);
//! - a reply: its serialized size ([`json_size`]) or a bound from counts (tokens x
//!   pieces, prompts x tokens x `n_probs`, inputs x tokens x width).

use super::error::{ApiError, ApiResult};
use crate::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default budget (MiB): a small part of what a server process may take, and room
/// for a prompt of over a million tokens (5 MiB of text), a reply (not streamed) of
/// 40 000 tokens with 5 probabilities each, and unpooled embeddings of 2 700 tokens of
/// a 4096-wide model; a request beyond it is told to ask for less (or to stream).
pub const DEFAULT_MIB: u64 = 256;

static LIMIT: AtomicU64 = AtomicU64::new(DEFAULT_MIB << 20);

/// Worst-case memory per byte of text while it is tokenized: a one-byte word's place in
/// the pre-tokenizer's list (two 16-byte entries while one regex's pieces become the
/// next's), its token, and the copies made for spaces and Unicode stand-ins.
pub const TOKENIZE_BYTES_PER_BYTE: u64 = 48;

/// Memory per entry of `completion_probabilities` as a reply holds it before writing it:
/// an object of four fields whose `bytes` is a list of numbers.
pub const PROB_ENTRY_BYTES: u64 = 1024;

/// Sets the budget for this process's server.
pub fn set_limit(bytes: u64) {
    LIMIT.store(bytes.max(1 << 20), Ordering::Relaxed);
}

/// The budget in bytes.
pub fn limit() -> u64 {
    LIMIT.load(Ordering::Relaxed)
}

fn mib(b: u64) -> String {
    let m = b as f64 / (1u64 << 20) as f64;
    if m >= 10.0 {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}

/// A 400 when `what` would take `bytes`, more than the budget; `hint` says what to ask
/// for instead.
pub fn check(what: &str, bytes: u64, hint: &str) -> ApiResult<()> {
    let limit = limit();
    if bytes <= limit {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "{what} would take {} of memory, over this server's budget of {} per request (--request-budget-mib); {hint}",
        mib(bytes),
        mib(limit)
    )))
}

/// Memory a JSON text takes once parsed into `serde_json::Value`s, read off its bytes in
/// one pass (no allocation beyond a stack of open containers, which stops counting past
/// serde_json's own depth limit). Malformed text gets an estimate too; the parse
/// refuses it afterwards.
pub fn json_cost(text: &[u8]) -> u64 {
    let v = std::mem::size_of::<serde_json::Value>() as u64;
    // A list slot (and the growth of the list it is in); an object member: its bucket
    // (hash, key string, value), grown likewise, and its index entry.
    let slot = 2 * v;
    let member = 2 * (8 + 24 + v) + 16;
    let mut cost = v;
    // Open containers (b'[' or b'{'), and whether the next string in an object is a key.
    let mut stack: Vec<u8> = Vec::new();
    let mut depth_over = 0usize;
    let mut key_next = false;
    let mut in_string = false;
    let mut escaped = false;
    // The last byte outside strings and whitespace: a scalar starts after `[`, `,`, `:`.
    let mut prev = b'[';
    let top = |stack: &Vec<u8>, over: usize| {
        if over > 0 {
            b'x'
        } else {
            *stack.last().unwrap_or(&b' ')
        }
    };
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                prev = b'"';
                continue;
            }
            cost += 1;
            continue;
        }
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => continue,
            b'"' => {
                in_string = true;
                match top(&stack, depth_over) {
                    b'{' if key_next => {
                        cost += member;
                        key_next = false;
                    }
                    b'[' => cost += slot,
                    _ => {}
                }
            }
            b'[' | b'{' => {
                if top(&stack, depth_over) == b'[' {
                    cost += slot;
                }
                if stack.len() < 128 {
                    stack.push(b);
                } else {
                    depth_over += 1;
                }
                key_next = b == b'{';
            }
            b']' | b'}' => {
                if depth_over > 0 {
                    depth_over -= 1;
                } else {
                    stack.pop();
                }
                key_next = false;
            }
            b',' => key_next = top(&stack, depth_over) == b'{',
            _ if matches!(prev, b'[' | b',' | b':') && top(&stack, depth_over) == b'[' => {
                cost += slot;
            }
            _ => {}
        }
        prev = b;
    }
    cost
}

/// Refuses a body whose parsed JSON would exceed the budget.
pub fn check_body(body: &[u8]) -> ApiResult<()> {
    check(
        &format!("the request body's JSON ({} bytes) parsed", body.len()),
        json_cost(body),
        "send fewer or shorter values (a prompt as one string rather than many small values)",
    )
}

/// Refuses a text whose tokenizing would exceed the budget (for texts a tokenizer's own
/// layout tokenizes: rerank prompts, infill files).
pub fn check_text(text: &str) -> ApiResult<()> {
    check(
        &format!("tokenizing a text of {} bytes", text.len()),
        text.len() as u64 * TOKENIZE_BYTES_PER_BYTE,
        "send a shorter text",
    )
}

/// Tokenizes `text` where the budget allows it.
pub fn encode(
    tok: &Tokenizer,
    text: &str,
    add_special: bool,
    parse_special: bool,
) -> ApiResult<Vec<u32>> {
    check_text(text)?;
    Ok(tok.encode(text, add_special, parse_special))
}

/// Bytes `v` takes written out as JSON (what a reply of it costs at least, and a
/// bound on the copies a field selection makes of it).
pub fn json_size(v: &serde_json::Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Refuses generation whose replies (`n_prompts` of them, each up to `n_predict`
/// tokens, or where that is -1 what the slot's context holds after the shortest
/// prompt, `n_prompt_min` tokens, with `n_probs` alternatives per token) could not be
/// held within the budget.
pub fn check_generation(
    n_prompts: usize,
    n_predict: i32,
    n_probs: usize,
    n_ctx_slot: u32,
    n_prompt_min: usize,
) -> ApiResult<()> {
    let room = (n_ctx_slot as u64).saturating_sub(n_prompt_min as u64);
    let n_tokens = match n_predict {
        n if n >= 0 => (n as u64).min(room),
        _ => room,
    };
    // A token's text and its place in the reply; its probabilities where asked for.
    let per_token = 64
        + if n_probs > 0 {
            (n_probs as u64 + 1) * PROB_ENTRY_BYTES
        } else {
            0
        };
    check(
        &format!(
            "{n_prompts} repl{} of up to {n_tokens} tokens{}",
            if n_prompts == 1 { "y" } else { "ies" },
            if n_probs > 0 {
                format!(" with {n_probs} probabilities each")
            } else {
                String::new()
            }
        ),
        (n_prompts as u64).saturating_mul(n_tokens.saturating_mul(per_token)),
        "ask for fewer tokens (n_predict / max_tokens), fewer probabilities (n_probs / top_logprobs) or fewer prompts",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate is never far below what the parse holds: for every shape of body,
    /// at least the values' own size, and about a string's length for strings.
    #[test]
    fn json_costs_follow_the_shape_not_the_length() {
        let v = std::mem::size_of::<serde_json::Value>() as u64;
        let n = 10_000u64;
        let zeros = format!("[{}0]", "0,".repeat(n as usize - 1));
        assert!(
            json_cost(zeros.as_bytes()) >= n * v,
            "{}",
            json_cost(zeros.as_bytes())
        );
        let empties = format!("[{}{{}}]", "{},".repeat(n as usize - 1));
        assert!(json_cost(empties.as_bytes()) >= n * v);
        let members = format!(
            "{{{}\"k\":1}}",
            (0..n - 1)
                .map(|i| format!("\"k{i}\":1,"))
                .collect::<String>()
        );
        assert!(json_cost(members.as_bytes()) >= n * (v + 24));
        let text = format!("{{\"prompt\": \"{}\"}}", "a".repeat(1 << 20));
        let c = json_cost(text.as_bytes());
        assert!((1 << 20..2 << 20).contains(&c), "{c}");
        // A string's escapes and brackets inside it are text, not structure.
        let quoted = r#"{"a": "[[[\"{{,,,", "b": [1, 2]}"#;
        let plain = r#"{"a": "abcdefghij", "b": [1, 2]}"#;
        assert_eq!(json_cost(quoted.as_bytes()), json_cost(plain.as_bytes()));
        // Deeper than serde_json parses (it refuses past 128): read without growing the
        // stack, the levels it would parse counted.
        let deep = "[".repeat(100_000);
        let c = json_cost(deep.as_bytes());
        assert!((127 * v..200 * 2 * v).contains(&c), "{c}");
    }

    #[test]
    fn a_cost_over_the_budget_names_both() {
        assert!(check("x", limit(), "y").is_ok());
        let e = check("a reply of 9 tokens", limit() + (5 << 20), "ask for fewer")
            .unwrap_err()
            .message;
        assert!(
            e.contains("a reply of 9 tokens") && e.contains("--request-budget-mib"),
            "{e}"
        );
        assert!(e.contains(&format!("{} MiB", DEFAULT_MIB)), "{e}");
        assert!(e.contains("ask for fewer"), "{e}");
    }
}
