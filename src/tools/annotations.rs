//! `portcullis annotations list`: every annotation and ConfigMap key the effective scripts
//! declare they read, as a table, JSON, or the Markdown of the reference in
//! docs/annotations.md.

use serde::Serialize;

use crate::layers::Layer;
use crate::policy::PolicyEngine;

/// One declared setting, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub name: String,
    pub aliases: Vec<String>,
    #[serde(rename = "type")]
    pub value_type: String,
    /// As declared; `None` when the declaration gives none.
    pub default: Option<String>,
    /// The kinds of object it may come from.
    pub objects: Vec<&'static str>,
    pub description: String,
    /// The script that declares it.
    pub script: String,
    /// `bundled`, or the site file's path.
    pub source: String,
}

/// The declarations of `engine`'s scripts, by name (then script).
pub fn rows(engine: &PolicyEngine) -> Vec<Row> {
    let mut rows: Vec<Row> = engine
        .declarations()
        .flat_map(|(file, declaration)| {
            let source = match &file.layer {
                Layer::Bundled => "bundled".to_string(),
                Layer::Site { path } => path.display().to_string(),
            };
            declaration.reads.iter().map(move |read| Row {
                name: read.name.clone(),
                aliases: read.aliases.clone(),
                value_type: read.value_type.clone(),
                default: read.default.clone(),
                objects: read.objects.iter().map(|k| k.as_str()).collect(),
                description: read.description.clone(),
                script: file.name.clone(),
                source: source.clone(),
            })
        })
        .collect();
    rows.sort_by(|a, b| (&a.name, &a.script).cmp(&(&b.name, &b.script)));
    rows
}

/// A plain table: one line per setting, the description last.
pub fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let name = if r.aliases.is_empty() {
                r.name.clone()
            } else {
                format!("{} ({})", r.name, r.aliases.join(", "))
            };
            let source = if r.source == "bundled" {
                format!("{} (bundled)", r.script)
            } else {
                r.source.clone()
            };
            [
                name,
                r.value_type.clone(),
                r.default.clone().unwrap_or_else(|| "-".to_string()),
                r.objects.join(","),
                source,
                r.description.clone(),
            ]
        })
        .collect();
    let header = ["NAME", "TYPE", "DEFAULT", "FROM", "SCRIPT", "DESCRIPTION"].map(String::from);
    let mut widths = [0usize; 5];
    for row in std::iter::once(&header).chain(&cells) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&cells) {
        let mut line = String::new();
        for (w, cell) in widths.iter().zip(row) {
            line.push_str(&format!("{cell:<w$}  "));
        }
        line.push_str(&row[5]);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The rows as a JSON array.
pub fn json(rows: &[Row]) -> String {
    let mut out = serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".to_string());
    out.push('\n');
    out
}

/// The rows as a Markdown table (the generated reference of docs/annotations.md).
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| name (aliases) | type | default | from | description | script |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let mut name = format!("`{}`", r.name);
        if !r.aliases.is_empty() {
            let aliases: Vec<String> = r.aliases.iter().map(|a| format!("`{a}`")).collect();
            name.push_str(&format!(" ({})", aliases.join(", ")));
        }
        let default = match r.default.as_deref() {
            None | Some("none") => "none".to_string(),
            Some(d) => format!("`{d}`"),
        };
        let source = if r.source == "bundled" {
            format!("`{}`", r.script)
        } else {
            format!("`{}`", r.source)
        };
        out.push_str(&format!(
            "| {name} | `{}` | {} | {} | {} | {} |\n",
            cell(&r.value_type),
            cell(&default),
            r.objects.join(", "),
            cell(&r.description),
            source
        ));
    }
    out
}

/// Text fit for a Markdown table cell: `|` escaped (also inside code spans, as GitHub reads
/// them), no line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_declaration_is_listed_in_each_form() {
        let engine = PolicyEngine::load(None).unwrap();
        let rows = rows(&engine);
        let declared: usize = engine.declarations().map(|(_, d)| d.reads.len()).sum();
        assert_eq!(rows.len(), declared);
        let allow = rows.iter().find(|r| r.name == "allow-list").unwrap();
        assert_eq!(allow.aliases, ["whitelist"]);
        assert_eq!(allow.source, "bundled");
        assert_eq!(allow.script, "access-list.rhai");
        let table = table(&rows);
        assert_eq!(table.lines().count(), rows.len() + 1);
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("allow-list (whitelist)")
                    && l.contains("access-list.rhai (bundled)"))
        );
        let json: serde_json::Value = serde_json::from_str(&json(&rows)).unwrap();
        assert_eq!(json.as_array().unwrap().len(), rows.len());
        let markdown = markdown(&rows);
        assert_eq!(markdown.lines().count(), rows.len() + 2);
        assert!(markdown.contains("`choice(h1\\|h2)`"), "pipes are escaped");
    }
}
