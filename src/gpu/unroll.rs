//! Loop unrolling in WGSL source, for compilers that do not unroll themselves.
//!
//! SwiftShader's JIT (Chromium's WebGPU without a GPU, and its own Vulkan driver) keeps a
//! kernel's loops as written. An index into a local array is then a per-lane runtime
//! value: the access costs an address computation and, on a browser's WebGPU, the bounds
//! clamp Tint puts on every dynamic index (Chromium applies it; wgpu's trusted modules do
//! not). Written out with the counter as a `const`, the indices fold to constants and the
//! clamps go. Mesa's LLVM and GPU drivers unroll such loops anyway.
//!
//! [`unroll`] rewrites every `for (var i = 0u; i < N; i++) { ... }` whose bound `N` folds
//! to at most `max_trips` (literals and the source's `const NAME: u32 = ...;` values,
//! with `+ - * /` and parentheses), and whose body neither leaves the loop (`break`,
//! `continue`) nor assigns the counter, into `N` blocks `{ const i = 0u; ... }`, inner
//! loops first.

use std::collections::HashMap;

/// Most trips of a loop [`crate::gpu::Gpu::pipeline`] writes out: the CPU-shaped matmul's
/// (8 loads of x, rows and tokens per invocation up to 8 and 16), and the flash kernel's
/// head loop for heads up to 64 (16 vec4s).
pub const MAX_TRIPS: u32 = 16;

/// `src` with its short constant-bounded loops written out (see the module docs).
pub fn unroll(src: &str, max_trips: u32) -> String {
    let consts = constants(src);
    expand(src, &consts, max_trips)
}

/// The `const NAME: u32 = EXPR;` values of `src` that fold (in order, so later ones may
/// use earlier ones).
fn constants(src: &str) -> HashMap<String, u64> {
    let mut consts = HashMap::new();
    for line in src.lines() {
        let Some(rest) = line.trim().strip_prefix("const ") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once(':') else {
            continue;
        };
        let Some(expr) = rest
            .trim()
            .strip_prefix("u32")
            .and_then(|r| r.trim().strip_prefix('='))
            .and_then(|r| r.trim().strip_suffix(';'))
        else {
            continue;
        };
        if let Some(v) = eval(expr, &consts) {
            consts.insert(name.trim().to_string(), v);
        }
    }
    consts
}

fn expand(src: &str, consts: &HashMap<String, u64>, max_trips: u32) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find("for (var ") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let Some(head_end) = tail.find('{') else {
            out.push_str(tail);
            return out;
        };
        let Some(body_end) = matching(tail, head_end, ('{', '}')) else {
            out.push_str(tail);
            return out;
        };
        let head = &tail[..head_end];
        let body = expand(&tail[head_end + 1..body_end], consts, max_trips);
        match counted(head, consts) {
            Some((var, n)) if n <= max_trips as u64 && unrollable(&body, var) => {
                for k in 0..n {
                    out.push_str(&format!("{{ const {var} = {k}u;{body}}}"));
                }
            }
            _ => {
                out.push_str(head);
                out.push('{');
                out.push_str(&body);
                out.push('}');
            }
        }
        rest = &tail[body_end + 1..];
    }
    out.push_str(rest);
    out
}

/// The byte index of the `pair.1` closing the `pair.0` at `open` (braces, parentheses):
/// shared with the other source rewrites (`shaders::matmul_source`).
pub(crate) fn matching(s: &str, open: usize, pair: (char, char)) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s[open..].char_indices() {
        if c == pair.0 {
            depth += 1;
        } else if c == pair.1 {
            depth -= 1;
            if depth == 0 {
                return Some(open + i);
            }
        }
    }
    None
}

/// The counter and trip count of a loop head `for (var i = 0u; i < N; i++) `.
fn counted<'a>(head: &'a str, consts: &HashMap<String, u64>) -> Option<(&'a str, u64)> {
    let inner = head.trim().strip_prefix("for (var ")?.strip_suffix(')')?;
    let mut parts = inner.split(';').map(str::trim);
    let (init, cond, step) = (parts.next()?, parts.next()?, parts.next()?);
    let (var, start) = init.split_once('=')?;
    let var = var.trim();
    if !is_ident(var) || start.trim() != "0u" || step != format!("{var}++") {
        return None;
    }
    let bound = cond.strip_prefix(var)?.trim_start().strip_prefix('<')?;
    if bound.starts_with('=') {
        return None;
    }
    Some((var, eval(bound, consts)?))
}

/// Whether a loop body may be copied with its counter made a constant.
fn unrollable(body: &str, var: &str) -> bool {
    let words: Vec<&str> = body
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .collect();
    if words.iter().any(|w| *w == "break" || *w == "continue") {
        return false;
    }
    // Any assignment to the counter: `i =`, `i +=`, `i++` (not `i ==`).
    for (at, _) in body.match_indices(var) {
        let before = body[..at].chars().next_back();
        let after = &body[at + var.len()..];
        let whole = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
            && !after
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if whole {
            let a = after.trim_start();
            let assigns = (a.starts_with('=') && !a.starts_with("=="))
                || ["+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "++", "--"]
                    .iter()
                    .any(|op| a.starts_with(op));
            if assigns {
                return false;
            }
        }
    }
    true
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Folds an unsigned expression of literals (`8u`, `8`) and known constants.
fn eval(expr: &str, consts: &HashMap<String, u64>) -> Option<u64> {
    let tokens = tokenize(expr)?;
    let mut pos = 0;
    let v = chain(&tokens, &mut pos, consts, 0)?;
    (pos == tokens.len()).then_some(v)
}

fn tokenize(expr: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if "+-*/()".contains(c) {
            out.push(c.to_string());
            chars.next();
        } else if c.is_alphanumeric() || c == '_' {
            let mut w = String::new();
            while let Some(&c) = chars.peek().filter(|c| c.is_alphanumeric() || **c == '_') {
                w.push(c);
                chars.next();
            }
            out.push(w);
        } else {
            return None;
        }
    }
    Some(out)
}

/// A chain of the binary operators of one precedence level: `+ -` (`level` 0) over
/// chains of `* /` (level 1) over atoms.
fn chain(t: &[String], pos: &mut usize, consts: &HashMap<String, u64>, level: u8) -> Option<u64> {
    let operand = |pos: &mut usize| {
        if level == 0 {
            chain(t, pos, consts, 1)
        } else {
            atom(t, pos, consts)
        }
    };
    let ops: [&str; 2] = if level == 0 { ["+", "-"] } else { ["*", "/"] };
    let mut v = operand(pos)?;
    while let Some(op) = t.get(*pos).filter(|o| ops.contains(&o.as_str())) {
        *pos += 1;
        let r = operand(pos)?;
        v = match op.as_str() {
            "+" => v.checked_add(r)?,
            "-" => v.checked_sub(r)?,
            "*" => v.checked_mul(r)?,
            _ => v.checked_div(r)?,
        };
    }
    Some(v)
}

fn atom(t: &[String], pos: &mut usize, consts: &HashMap<String, u64>) -> Option<u64> {
    let tok = t.get(*pos)?;
    *pos += 1;
    if tok == "(" {
        let v = chain(t, pos, consts, 0)?;
        (t.get(*pos)? == ")").then_some(())?;
        *pos += 1;
        return Some(v);
    }
    if let Some(v) = consts.get(tok) {
        return Some(*v);
    }
    tok.strip_suffix('u').unwrap_or(tok).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_loops_become_blocks_inner_first() {
        let src = "const R: u32 = 2u;\nconst N: u32 = R * 2u;\nfn f() {\n    for (var r = 0u; r < R; r++) {\n        for (var i = 0u; i < N / 2u; i++) { a[r * 2u + i] = 0.0; }\n    }\n}\n";
        let out = unroll(src, 8);
        assert!(!out.contains("for ("), "{out}");
        assert_eq!(out.matches("const r = ").count(), 2, "{out}");
        assert_eq!(out.matches("const i = 1u;").count(), 2, "{out}");
        assert!(out.contains("{ const r = 1u;"), "{out}");
    }

    #[test]
    fn loops_it_cannot_copy_stay_loops() {
        let cases = [
            // A runtime bound.
            "fn f() { for (var i = 0u; i < p.n; i++) { a[i] = 0.0; } }",
            // Too many trips.
            "fn f() { for (var i = 0u; i < 64u; i++) { a[i] = 0.0; } }",
            // Leaves the loop.
            "fn f() { for (var i = 0u; i < 4u; i++) { if (a[i] > 0.0) { break; } } }",
            "fn f() { for (var i = 0u; i < 4u; i++) { if (a[i] > 0.0) { continue; } } }",
            // Assigns the counter.
            "fn f() { for (var i = 0u; i < 4u; i++) { i += 1u; } }",
            // Another step or start.
            "fn f() { for (var i = 0u; i < 4u; i += 2u) { a[i] = 0.0; } }",
            "fn f() { for (var i = 1u; i < 4u; i++) { a[i] = 0.0; } }",
            "fn f() { for (var i = 0u; i <= 4u; i++) { a[i] = 0.0; } }",
        ];
        for src in cases {
            assert_eq!(unroll(src, 8), src);
        }
    }

    #[test]
    fn comparisons_and_other_names_are_not_assignments() {
        let src = "fn f() { for (var i = 0u; i < 2u; i++) { if (i == 1u) { a[i] = 0.0; } ii = 3u; b.i = 1u; } }";
        let out = unroll(src, 8);
        assert!(!out.contains("for ("), "{out}");
    }

    #[test]
    fn folds_constant_expressions() {
        let c = constants("const A: u32 = 8u;\nconst B: u32 = (A + 4u) / 3u;\n");
        assert_eq!(c["B"], 4);
        assert_eq!(eval("A * (B - 1u)", &c), Some(24));
        assert_eq!(eval("A / 0u", &c), None);
        assert_eq!(eval("p.k", &c), None);
    }
}
