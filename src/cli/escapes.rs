//! Escape sequences in prompts, processed as llama.cpp's tools do by default (`-e`):
//! `\n \r \t \' \" \\` and `\xNN`; any other backslash stays as written.

/// `s` with its escape sequences replaced by the bytes they stand for. Bytes, because
/// `\xNN` can write a byte that is not valid UTF-8 on its own.
pub fn unescape_bytes(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' || i + 1 == s.len() {
            out.push(s[i]);
            i += 1;
            continue;
        }
        let c = s[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'\'' | b'"' | b'\\' => out.push(c),
            b'x' if s.len() >= i + 2 && s[i..i + 2].iter().all(u8::is_ascii_hexdigit) => {
                let hex = std::str::from_utf8(&s[i..i + 2]).expect("hex digits are ASCII");
                out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
                i += 2;
            }
            _ => out.extend_from_slice(&[b'\\', c]),
        }
    }
    out
}

/// [`unescape_bytes`] for text; a `\xNN` that leaves invalid UTF-8 becomes U+FFFD.
pub fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&unescape_bytes(s.as_bytes())).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_llama_cpp() {
        assert_eq!(unescape(r#"a\nb\tc\\d\'\"e"#), "a\nb\tc\\d'\"e");
        assert_eq!(unescape(r"\x41\x4g\q\"), "A\\x4g\\q\\");
        assert_eq!(unescape_bytes(br"\xff"), vec![0xff]);
        // A backslash escapes the next one, so `\\n` is a backslash and an n.
        assert_eq!(unescape(r"\\n"), "\\n");
    }
}
