//! Errors from the Kubernetes API, read the same way at start-up and by the watches.

/// 401 Unauthorized, 403 Forbidden and 404 Not Found do not heal with time.
pub fn is_permanent_status(code: u16) -> bool {
    matches!(code, 401 | 403 | 404)
}

/// An error and its causes on one line: `ServiceError: client error (Connect): dns error: ...`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Layers often repeat their cause in their own message.
        if !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_failures_are_permanent_and_outages_are_not() {
        for code in [401, 403, 404] {
            assert!(is_permanent_status(code));
        }
        for code in [429, 500, 502, 503, 504] {
            assert!(!is_permanent_status(code));
        }
    }

    #[test]
    fn error_chain_names_every_cause_once() {
        let inner = std::io::Error::other("Name or service not known");
        let outer = std::io::Error::other(Wrapped(inner));
        assert_eq!(error_chain(&outer), "dns error: Name or service not known");
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "dns error")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
