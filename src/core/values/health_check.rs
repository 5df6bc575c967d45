//! The parser of `check-http`, the HTTP health check of a backend's servers.

use super::ParseResult;
use crate::diagnostics::quoted;

/// HTTP methods a health check may use.
pub const CHECK_METHODS: &[&str] = &["GET", "HEAD", "OPTIONS", "POST"];

/// HTTP versions a health check may name.
pub const CHECK_VERSIONS: &[&str] = &["HTTP/1.0", "HTTP/1.1"];

/// `check-http` as the incumbent reads it: `URI`, `METHOD URI` or `METHOD URI VERSION`, where
/// VERSION may carry headers in HAProxy's old `option httpchk` form,
/// `HTTP/1.1\r\nHost:\ example.com` (the `\r\n` and `\ ` written as such).
pub fn parse_http_check(v: &str) -> ParseResult<crate::model::HttpCheck> {
    if v.chars().any(char::is_control) {
        return Err(format!("{v} contains control characters", v = quoted(v)));
    }
    // The old form escapes the spaces of its headers: they are not word separators.
    let words: Vec<String> = {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut chars = v.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    chars.next();
                    word.push_str("\\ ");
                }
                ' ' | '\t' => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        words
    };
    let (method, uri, version) = match words.as_slice() {
        [uri] => ("GET".to_string(), uri, None),
        [method, uri] => (super::parse_enum(method, CHECK_METHODS)?, uri, None),
        [method, uri, version] => (
            super::parse_enum(method, CHECK_METHODS)?,
            uri,
            Some(version.as_str()),
        ),
        _ => {
            return Err(format!(
                "{v} is not 'URI', 'METHOD URI' or 'METHOD URI VERSION'",
                v = quoted(v)
            ));
        }
    };
    let uri = super::parse_path(uri)?;
    let mut headers = Vec::new();
    let version = match version {
        None => None,
        Some(text) => {
            let mut parts = text.split("\\r\\n");
            let version = parts.next().unwrap_or_default();
            let version = super::parse_enum(version, CHECK_VERSIONS)?;
            for header in parts.filter(|h| !h.is_empty()) {
                let (name, value) = header
                    .split_once(':')
                    .ok_or_else(|| format!("{} is not a 'Name:\\ value' header", quoted(header)))?;
                let value = value.replace("\\ ", " ");
                headers.push((
                    super::parse_header_name(name)?,
                    super::parse_header_value(value.trim())?,
                ));
            }
            Some(version)
        }
    };
    if headers.len() > 8 {
        return Err("a health check may send at most 8 headers".to_string());
    }
    Ok(crate::model::HttpCheck {
        method,
        uri,
        version,
        headers,
    })
}
