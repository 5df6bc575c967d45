//! Diagnostics: what went wrong with which object and field, collected instead of aborting.
//!
//! Bad cluster input never stops the pipeline. Each stage records a [`Diagnostic`] naming the
//! object and the field, drops just that setting or object, and carries on.

use std::fmt;

use serde::Serialize;

use crate::objects::ObjectRef;

/// The most characters of a value a message quotes.
pub const QUOTE_CHARS: usize = 64;

/// A value as a message quotes it (see [`quoted`]).
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a>(&'a str);

/// `v` as a message quotes it: escaped like Rust's `{:?}`, and when longer than
/// [`QUOTE_CHARS`] characters only its start, followed by `… (N bytes)`. A value of any size
/// makes a message of bounded size.
pub fn quoted(v: &str) -> Quoted<'_> {
    Quoted(v)
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(QUOTE_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => write!(f, "{:?}… ({} bytes)", &self.0[..end], self.0.len()),
        }
    }
}

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something was ignored or defaulted; output is still complete.
    Warning,
    /// A setting or object was dropped.
    Error,
}

/// Where a diagnostic points: a Kubernetes object, a manifest document, or a script/template.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Subject {
    /// A Kubernetes object.
    Object(ObjectRef),
    /// A document in a manifest file (1-based document index).
    Document { file: String, index: usize },
    /// A whole manifest file.
    File { file: String },
    /// A policy script or template.
    Source { file: String },
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Object(o) => write!(f, "{o}"),
            Subject::Document { file, index } => write!(f, "{file} (document {index})"),
            Subject::File { file } => write!(f, "{file}"),
            Subject::Source { file } => write!(f, "{file}"),
        }
    }
}

/// One problem found in the input.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub subject: Subject,
    /// The field or annotation concerned, e.g. `annotation haproxy.org/timeout-server`.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{level}: {}", self.subject)?;
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// How the message of a value's type check ends: the value is reported before any hook reads
/// it, and a hook's own report of the same field (which says what happens instead) replaces it
/// ([`Diagnostics::into_sorted`]).
pub const UNREAD_VALUE: &str = "; ignored wherever it is read";

/// An append-only list of diagnostics, sorted and de-duplicated on output so that the same
/// inputs always report the same lines.
#[derive(Debug, Default, Clone)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, d: Diagnostic) {
        self.items.push(d);
    }

    /// Records a problem with one field of one object.
    pub fn object(
        &mut self,
        severity: Severity,
        object: &ObjectRef,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.push(Diagnostic {
            severity,
            subject: Subject::Object(object.clone()),
            field: Some(field.into()),
            message: message.into(),
        });
    }

    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The diagnostics in a deterministic order, without duplicates. An error that a field's
    /// value is not of its declared type (ending in
    /// [`UNREAD_VALUE`]) is left out when another error on the same
    /// object and field (a hook's, which says what happens instead) reports it.
    pub fn into_sorted(mut self) -> Vec<Diagnostic> {
        self.items.sort();
        self.items.dedup();
        let provisional =
            |d: &Diagnostic| d.severity == Severity::Error && d.message.ends_with(UNREAD_VALUE);
        if self.items.iter().any(provisional) {
            let reported: std::collections::BTreeSet<(&Subject, &Option<String>)> = self
                .items
                .iter()
                .filter(|d| d.severity == Severity::Error && !provisional(d))
                .map(|d| (&d.subject, &d.field))
                .collect();
            let superseded: Vec<bool> = self
                .items
                .iter()
                .map(|d| provisional(d) && reported.contains(&(&d.subject, &d.field)))
                .collect();
            let mut i = 0;
            self.items.retain(|_| {
                i += 1;
                !superseded[i - 1]
            });
        }
        self.items
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_bounded() {
        assert_eq!(quoted("a\nb").to_string(), r#""a\nb""#);
        let exact = "x".repeat(QUOTE_CHARS);
        assert_eq!(quoted(&exact).to_string(), format!("{exact:?}"));
        let long = "é".repeat(5_000_000);
        let text = quoted(&long).to_string();
        assert_eq!(
            text,
            format!("{:?}… (10000000 bytes)", "é".repeat(QUOTE_CHARS))
        );
    }
}
