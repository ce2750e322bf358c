//! Which browser origins may call the server (`--cors-origins`): read by the CORS layer
//! and by `/tools`, which refuses a call CORS would not allow.

/// `*` allows any origin; `localhost` any origin whose host is loopback (any scheme or
/// port); otherwise the origin must be listed exactly.
pub fn origin_allowed(list: &[String], origin: &str) -> bool {
    list.iter().any(|a| match a.as_str() {
        "*" => true,
        "localhost" => {
            let rest = origin.split_once("://").map_or(origin, |(_, r)| r);
            let host = if let Some(v6) = rest.strip_prefix('[') {
                v6.split(']').next().unwrap_or("")
            } else {
                rest.split([':', '/']).next().unwrap_or("")
            };
            matches!(host, "localhost" | "127.0.0.1" | "::1")
        }
        a => a == origin,
    })
}

#[cfg(test)]
mod tests {
    use super::origin_allowed;

    #[test]
    fn cors_origins() {
        let any = vec!["*".to_string()];
        let local = vec!["localhost".to_string()];
        let listed = vec!["https://a.example".to_string()];
        assert!(origin_allowed(&any, "http://evil.com"));
        for o in [
            "http://localhost",
            "http://localhost:8080",
            "http://127.0.0.1:3000",
            "http://[::1]",
            "http://[::1]:3000",
        ] {
            assert!(origin_allowed(&local, o), "{o}");
        }
        for o in [
            "http://web.mydomain.fr",
            "http://notlocalhost",
            "http://localhost.evil.com",
            "http://evil.com",
        ] {
            assert!(!origin_allowed(&local, o), "{o}");
        }
        assert!(origin_allowed(&listed, "https://a.example"));
        assert!(!origin_allowed(&listed, "https://b.example"));
    }
}
