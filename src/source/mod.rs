//! Sources of Kubernetes objects. Every source produces [`crate::objects::Object`]s for the store.

pub mod files;
pub mod site;
pub mod watch;

use crate::diagnostics::{Diagnostic, Severity, Subject};

/// How many source problems `/readyz` lists.
pub const SOURCE_ERRORS_SHOWN: usize = 10;

/// The errors about manifest files and documents among `diagnostics` (the objects they last
/// produced stay in force meanwhile), as lines for `/readyz`: the first
/// [`SOURCE_ERRORS_SHOWN`], then how many more there are.
pub fn source_errors(diagnostics: &[Diagnostic]) -> Vec<String> {
    let mut errors = diagnostics.iter().filter(|d| {
        d.severity == Severity::Error
            && matches!(d.subject, Subject::File { .. } | Subject::Document { .. })
    });
    let mut lines: Vec<String> = errors
        .by_ref()
        .take(SOURCE_ERRORS_SHOWN)
        .map(ToString::to_string)
        .collect();
    let more = errors.count();
    if more > 0 {
        lines.push(format!("and {more} more"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_errors_are_the_file_and_document_errors_capped() {
        let diagnostic = |severity, subject| Diagnostic {
            severity,
            subject,
            field: None,
            message: "m".to_string(),
        };
        let document = |index| Subject::Document {
            file: "a.yaml".to_string(),
            index,
        };
        let mut diagnostics = vec![
            diagnostic(Severity::Warning, document(1)),
            diagnostic(
                Severity::Error,
                Subject::Source {
                    file: "x.rhai".to_string(),
                },
            ),
        ];
        assert!(source_errors(&diagnostics).is_empty());
        for index in 1..=SOURCE_ERRORS_SHOWN + 2 {
            diagnostics.push(diagnostic(Severity::Error, document(index)));
        }
        let lines = source_errors(&diagnostics);
        assert_eq!(lines.len(), SOURCE_ERRORS_SHOWN + 1);
        assert_eq!(lines[0], "error: a.yaml (document 1): m");
        assert_eq!(lines[SOURCE_ERRORS_SHOWN], "and 2 more");
    }
}
