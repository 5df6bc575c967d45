//! Pattern files (`--configmap-patternfiles`): the names of their keys, the bounds on their
//! content, the patterns HAProxy reads from them, and the access lists that name one
//! (`patterns/<key>`).
//!
//! A pattern file is written as it is, next to haproxy.cfg, and read by HAProxy (`-f` in an
//! ACL, `map()` in a snippet). Its lines are read as HAProxy 2.6 reads them
//! (`pat_ref_read_from_file()` in `src/pattern.c`): a line starting with `#` is a comment,
//! leading spaces and tabs are skipped, the pattern ends at the first CR or LF, an empty line
//! is skipped. Trailing spaces belong to the pattern, and so does a `#` after indentation.

use super::{ParseResult, parse_cidr, parse_cidr_list};
use crate::diagnostics::quoted;

/// How a value names a pattern file: `patterns/<key>`, which is also its path relative to
/// the configuration directory.
pub const PATTERN_PREFIX: &str = "patterns/";

/// The largest pattern file: a ConfigMap holds at most 1 MiB in all.
pub const MAX_PATTERN_FILE_BYTES: usize = 1024 * 1024;
/// The most lines of one pattern file.
pub const MAX_PATTERN_LINES: usize = 100_000;
/// The longest line: HAProxy reads a line into one buffer (`tune.bufsize`, 16 KiB by
/// default) and would cut a longer one in two patterns.
pub const MAX_PATTERN_LINE_BYTES: usize = 4096;
/// The longest key (file name).
pub const MAX_PATTERN_KEY_BYTES: usize = 128;

/// Where the pattern file of `key` is written, relative to the configuration directory.
pub fn pattern_path(key: &str) -> String {
    format!("{PATTERN_PREFIX}{key}")
}

/// A pattern file's key: a safe file name of 1 to 128 letters, digits, `.`, `_` and `-`,
/// starting with a letter or digit (so never `.`, `..` or a hidden file).
pub fn parse_pattern_key(key: &str) -> ParseResult<String> {
    let ok = !key.is_empty()
        && key.len() <= MAX_PATTERN_KEY_BYTES
        && key.as_bytes()[0].is_ascii_alphanumeric()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!(
            "{} is not a pattern file name (1 to {MAX_PATTERN_KEY_BYTES} letters, digits, '.', '_' and '-', starting with a letter or digit)",
            quoted(key)
        ))
    }
}

/// `patterns/<key>`: returns the key.
pub fn parse_pattern_ref(v: &str) -> ParseResult<String> {
    let Some(key) = v.trim().strip_prefix(PATTERN_PREFIX) else {
        return Err(format!(
            "{} does not name a pattern file (patterns/<key>)",
            quoted(v)
        ));
    };
    parse_pattern_key(key).map_err(|e| format!("{}: {e}", quoted(v)))
}

/// Whether `content` may be written as a pattern file: at most [`MAX_PATTERN_FILE_BYTES`]
/// bytes, [`MAX_PATTERN_LINES`] lines of at most [`MAX_PATTERN_LINE_BYTES`] bytes, and no
/// control character but tab, CR and LF.
pub fn check_pattern_content(content: &str) -> ParseResult<()> {
    if content.len() > MAX_PATTERN_FILE_BYTES {
        return Err(format!(
            "the file has {} bytes; at most {MAX_PATTERN_FILE_BYTES}",
            content.len()
        ));
    }
    for (n, line) in content.split('\n').enumerate() {
        // The empty text after a last newline is no line.
        if n >= MAX_PATTERN_LINES && !line.is_empty() {
            return Err(format!("the file has more than {MAX_PATTERN_LINES} lines"));
        }
        if line.len() > MAX_PATTERN_LINE_BYTES {
            return Err(format!(
                "line {}: {} bytes; at most {MAX_PATTERN_LINE_BYTES}",
                n + 1,
                line.len()
            ));
        }
        if let Some(c) = line
            .chars()
            .find(|c| c.is_control() && !matches!(c, '\t' | '\r'))
        {
            return Err(format!(
                "line {}: the control character {c:?} is not allowed",
                n + 1
            ));
        }
    }
    Ok(())
}

/// The patterns HAProxy reads from a pattern file, each with its line number (from 1).
pub fn pattern_lines(content: &str) -> impl Iterator<Item = (usize, &str)> {
    content.split('\n').enumerate().filter_map(|(n, line)| {
        if line.starts_with('#') {
            return None;
        }
        let pattern = line.trim_start_matches([' ', '\t']);
        let pattern = pattern.split('\r').next().unwrap_or_default();
        (!pattern.is_empty()).then_some((n + 1, pattern))
    })
}

/// Checks that every pattern of a file is an IP address or CIDR block, as an access list
/// (`src -f`) needs. Returns how many there are, or the first bad line's number and why.
pub fn check_address_patterns(content: &str) -> Result<usize, (usize, String)> {
    let mut count = 0;
    for (n, pattern) in pattern_lines(content) {
        parse_cidr(pattern).map_err(|e| {
            let hint = if pattern.trim_start().starts_with('#') {
                " (a comment must start at the beginning of its line)"
            } else if pattern.ends_with([' ', '\t']) {
                " (trailing spaces belong to the pattern)"
            } else {
                ""
            };
            (n, format!("{e}{hint}"))
        })?;
        count += 1;
    }
    Ok(count)
}

/// An access list as written: IP addresses and CIDR blocks, or a pattern file of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessList {
    /// Canonical addresses and blocks (see [`parse_cidr_list`]).
    Addresses(Vec<String>),
    /// The key of a pattern file (`patterns/<key>`), resolved in translation.
    File(String),
}

impl AccessList {
    /// As a script sees it: the addresses, or the one reference `patterns/<key>`.
    pub fn into_strings(self) -> Vec<String> {
        match self {
            AccessList::Addresses(list) => list,
            AccessList::File(key) => vec![pattern_path(&key)],
        }
    }
}

/// IP addresses and CIDR blocks separated by commas and/or whitespace, or one pattern file
/// `patterns/<key>` (the incumbent's form), which stands alone.
pub fn parse_access_list(v: &str) -> ParseResult<AccessList> {
    let items: Vec<&str> = v
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|i| !i.is_empty())
        .collect();
    match items.as_slice() {
        [one] if one.starts_with(PATTERN_PREFIX) => parse_pattern_ref(one).map(AccessList::File),
        _ if items.iter().any(|i| i.starts_with(PATTERN_PREFIX)) => Err(format!(
            "{}: a pattern file (patterns/<key>) stands alone, without addresses or other files",
            quoted(v)
        )),
        _ => parse_cidr_list(v).map(AccessList::Addresses),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_safe_file_names() {
        for ok in ["ips", "ips2", "allow.list", "a_b-c", "0"] {
            assert_eq!(parse_pattern_key(ok).as_deref(), Ok(ok), "{ok}");
        }
        let long = "a".repeat(MAX_PATTERN_KEY_BYTES + 1);
        for bad in [
            "", ".", "..", ".hidden", "-x", "a/b", "a b", "ä", "a\\b", &long,
        ] {
            assert!(parse_pattern_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn references_name_a_key() {
        assert_eq!(parse_pattern_ref("patterns/ips").as_deref(), Ok("ips"));
        assert_eq!(parse_pattern_ref(" patterns/ips ").as_deref(), Ok("ips"));
        for bad in [
            "ips",
            "patterns/",
            "patterns/../x",
            "patterns/a/b",
            "/patterns/ips",
        ] {
            assert!(parse_pattern_ref(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn access_lists_are_addresses_or_one_file() {
        assert_eq!(
            parse_access_list("patterns/ips"),
            Ok(AccessList::File("ips".to_string()))
        );
        assert_eq!(
            parse_access_list("10.0.0.0/8, 192.0.2.1"),
            Ok(AccessList::Addresses(vec![
                "10.0.0.0/8".to_string(),
                "192.0.2.1".to_string()
            ]))
        );
        for bad in [
            "patterns/ips, 10.0.0.1",
            "patterns/ips patterns/ips2",
            "patterns/../etc/passwd",
            "patterns/",
            "",
            "ips",
        ] {
            assert!(parse_access_list(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            AccessList::File("ips".to_string()).into_strings(),
            ["patterns/ips"]
        );
    }

    #[test]
    fn lines_are_read_as_haproxy_reads_them() {
        let content =
            "# a comment\n10.0.0.0/8\n\n  192.0.2.1\r\n\t2001:db8::/32\n   \n  # indented\n";
        let lines: Vec<_> = pattern_lines(content).collect();
        assert_eq!(
            lines,
            [
                (2, "10.0.0.0/8"),
                (4, "192.0.2.1"),
                (5, "2001:db8::/32"),
                (7, "# indented")
            ]
        );
    }

    #[test]
    fn address_files_hold_only_addresses() {
        assert_eq!(
            check_address_patterns("# allowed\n192.168.0.0/24\n\n192.168.1.1\r\n::1\n"),
            Ok(3)
        );
        assert_eq!(check_address_patterns(""), Ok(0));
        assert_eq!(check_address_patterns("# nothing\n\n"), Ok(0));
        let (line, why) = check_address_patterns("10.0.0.1\n10.0.0.300\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("\"10.0.0.300\" is not an IP address"), "{why}");
        let (line, why) = check_address_patterns("10.0.0.1\n  # later\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("beginning of its line"), "{why}");
        let (line, why) = check_address_patterns("10.0.0.1 \n").unwrap_err();
        assert_eq!(line, 1);
        assert!(why.contains("trailing spaces"), "{why}");
        assert!(check_address_patterns("10.0.0.0/33").is_err());
        assert!(check_address_patterns("alpha-0 0").is_err());
    }

    #[test]
    fn content_is_bounded() {
        assert!(check_pattern_content("alpha-0 0\nalpha-1 1\n").is_ok());
        assert!(check_pattern_content("a\tb\r\n").is_ok());
        assert!(check_pattern_content("a\0b").is_err());
        assert!(check_pattern_content("a\x1bb").is_err());
        let long_line = "a".repeat(MAX_PATTERN_LINE_BYTES + 1);
        assert!(check_pattern_content(&long_line).is_err());
        let many = "1\n".repeat(MAX_PATTERN_LINES);
        assert!(check_pattern_content(&many).is_ok());
        let too_many = "1\n".repeat(MAX_PATTERN_LINES + 1);
        assert!(check_pattern_content(&too_many).is_err());
        let big = "a\n".repeat(MAX_PATTERN_FILE_BYTES / 2 + 1);
        assert!(check_pattern_content(&big).is_err());
    }
}
