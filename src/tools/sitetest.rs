//! `portcullis test`: a site author's test kit for scripts and templates.
//!
//! A test directory holds one subdirectory per case. A case is a small cluster (manifests,
//! read exactly like `--manifests`) plus what the rendered configuration must look like:
//!
//! - `expect.txt`: blocks of expectations (see [`parse_expectations`]),
//! - `expected.cfg`: the whole expected haproxy.cfg, compared line by line,
//! - `args` (optional): pipeline flags for this case, one per line, overriding the defaults
//!   given on the command line.
//!
//! Every case runs against the effective layers (bundled plus `--scripts-dir` and
//! `--templates-dir`) with no clock, so the same case always renders the same bytes. The
//! format is documented in docs/scripting.md.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};

use crate::cli::PipelineArgs;
use crate::pipeline::Pipeline;
use crate::source::files;
use crate::store::Store;

/// The fragments file of a case.
pub const EXPECT_FILE: &str = "expect.txt";
/// The full expected configuration of a case.
pub const EXPECTED_CFG: &str = "expected.cfg";
/// A case's pipeline flags.
pub const ARGS_FILE: &str = "args";
/// The main rendered file.
const CONFIG_FILE: &str = "haproxy.cfg";

/// Lines of context around each change in a diff.
const CONTEXT: usize = 3;
/// The largest (expected × rendered) region, after the common head and tail are set aside,
/// that gets a real line diff; beyond it a diff shows the first difference with context.
const MAX_DIFF_CELLS: usize = 4_000_000;
/// At most this many diff lines are shown per mismatch.
const MAX_DIFF_LINES: usize = 200;

/// The pipeline flags a case's `args` file may set: exactly the command line's.
#[derive(Debug, Parser)]
#[command(
    name = "args",
    no_binary_name = true,
    args_override_self = true,
    disable_help_flag = true
)]
struct CaseArgs {
    #[command(flatten)]
    pipeline: PipelineArgs,
}

/// The pipeline flags as clap matches, from flags without a program name (as in an `args`
/// file). `portcullis test` passes its own `test` subcommand matches instead.
pub fn base_matches<I, T>(flags: I) -> Result<ArgMatches, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    CaseArgs::command().try_get_matches_from(flags)
}

/// A test directory could not be used at all.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error("reading test directory {path}: {source}")]
    ReadDir {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "no test cases in {0}: a case is a directory holding manifests and {EXPECT_FILE} or {EXPECTED_CFG}"
    )]
    NoCases(String),
}

/// How many cases passed and failed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)
    }
}

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    /// Why the case failed, one entry per unmet expectation (entries may span lines).
    pub failures: Vec<String>,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// `ok   NAME`, or `FAIL NAME` followed by each failure indented by two spaces.
    pub fn report(&self) -> String {
        if self.passed() {
            return format!("ok   {}\n", self.name);
        }
        let mut text = format!("FAIL {}\n", self.name);
        for failure in &self.failures {
            for line in failure.lines() {
                text.push_str("  ");
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

/// Runs every case under `dir` (or `dir` itself, when it is a case), calling `each` as each
/// case finishes. `base` holds the default pipeline flags (the `test` command's matches, or
/// [`base_matches`]).
pub fn run(
    dir: &Path,
    base: &ArgMatches,
    mut each: impl FnMut(&CaseResult),
) -> Result<Summary, KitError> {
    let cases = discover(dir)?;
    let mut pipelines = Pipelines::default();
    let mut summary = Summary::default();
    for (name, case_dir) in cases {
        let result = run_case(&name, &case_dir, base, &mut pipelines);
        if result.passed() {
            summary.passed += 1;
        } else {
            summary.failed += 1;
        }
        each(&result);
    }
    Ok(summary)
}

/// The cases of a test directory, sorted by name: its subdirectories (names starting with `.`
/// are skipped), or the directory itself when it holds `expect.txt` or `expected.cfg`.
pub fn discover(dir: &Path) -> Result<Vec<(String, PathBuf)>, KitError> {
    if dir.join(EXPECT_FILE).is_file() || dir.join(EXPECTED_CFG).is_file() {
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        return Ok(vec![(name, dir.to_path_buf())]);
    }
    let read_error = |source| KitError::ReadDir {
        path: dir.display().to_string(),
        source,
    };
    let mut cases = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        // `metadata` follows symlinks: a case may be a link to a directory.
        if name.starts_with('.') || !std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        cases.push((name, path));
    }
    if cases.is_empty() {
        return Err(KitError::NoCases(dir.display().to_string()));
    }
    cases.sort();
    Ok(cases)
}

/// Compiled pipelines by (scripts dir, templates dir): cases sharing layers compile them once.
#[derive(Default)]
struct Pipelines {
    loaded: HashMap<(Option<PathBuf>, Option<PathBuf>), Result<Pipeline, String>>,
}

impl fmt::Debug for Pipelines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipelines")
            .field("loaded", &self.loaded.len())
            .finish()
    }
}

/// Runs one case directory.
fn run_case(name: &str, dir: &Path, base: &ArgMatches, pipelines: &mut Pipelines) -> CaseResult {
    let failures = match check_case(dir, base, pipelines) {
        Ok(failures) => failures,
        Err(failure) => vec![failure],
    };
    CaseResult {
        name: name.to_string(),
        failures,
    }
}

/// The unmet expectations of a case; `Err` when the case cannot run at all.
fn check_case(
    dir: &Path,
    base: &ArgMatches,
    pipelines: &mut Pipelines,
) -> Result<Vec<String>, String> {
    let expect_path = dir.join(EXPECT_FILE);
    let cfg_path = dir.join(EXPECTED_CFG);
    let expect_text = read_optional(&expect_path)?;
    let expected_cfg = read_optional(&cfg_path)?;
    if expect_text.is_none() && expected_cfg.is_none() {
        return Err(format!(
            "{}: neither {EXPECT_FILE} nor {EXPECTED_CFG}: nothing to check",
            dir.display()
        ));
    }
    let expectations = match &expect_text {
        Some(text) => parse_expectations(text)
            .map_err(|e| format!("{}:{}: {}", expect_path.display(), e.line, e.message))?,
        None => Vec::new(),
    };
    let args = case_args(dir, base)?;

    let key = (args.scripts_dir.clone(), args.templates_dir.clone());
    let pipeline = pipelines.loaded.entry(key).or_insert_with(|| {
        crate::source::site::load_pipeline(
            args.scripts_dir.as_deref(),
            args.templates_dir.as_deref(),
            args.translate_config(),
        )
        .map_err(|e| format!("the scripts or templates do not load:\n{e}"))
    });
    let pipeline = pipeline.as_mut().map_err(|e| e.clone())?;
    pipeline.config = args.translate_config();

    let loaded = files::load_dir(dir).map_err(|e| e.to_string())?;
    let mut diagnostics: Vec<String> = loaded
        .diagnostics
        .into_sorted()
        .iter()
        .map(ToString::to_string)
        .collect();
    let store = Store::from_objects(loaded.objects);
    let output = pipeline
        .run(&store)
        .map_err(|e| format!("rendering failed: {e}"))?;
    diagnostics.extend(output.diagnostics.iter().map(ToString::to_string));

    let rendered = Rendered {
        files: output
            .rendered
            .files()
            .iter()
            .map(|(name, bytes)| {
                (
                    name.clone(),
                    String::from_utf8_lossy(&bytes.bytes()).into_owned(),
                )
            })
            .collect(),
        diagnostics,
    };
    let mut failures = Vec::new();
    let place = expect_path.display().to_string();
    for expectation in &expectations {
        if let Some(failure) = expectation.check(&rendered) {
            failures.push(format!("{place}:{}: {failure}", expectation.line));
        }
    }
    if let Some(expected) = expected_cfg {
        if let Some(diff) = compare_full(&expected, rendered.file(CONFIG_FILE).unwrap_or("")) {
            failures.push(format!(
                "{}: the rendered haproxy.cfg differs (- expected, + rendered):\n{diff}",
                cfg_path.display()
            ));
        }
    }
    Ok(failures)
}

/// A file's text, `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: cannot read: {e}", path.display())),
    }
}

/// The pipeline flags of a case: the defaults, overridden by the flags its `args` file names.
/// Relative directories in `args` are relative to the case directory.
fn case_args(dir: &Path, base: &ArgMatches) -> Result<PipelineArgs, String> {
    let mut args =
        PipelineArgs::from_arg_matches(base).map_err(|e| format!("the default flags: {e}"))?;
    let path = dir.join(ARGS_FILE);
    let Some(text) = read_optional(&path)? else {
        return Ok(args);
    };
    let mut flags = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once(char::is_whitespace) {
            Some((flag, value)) => {
                flags.push(flag.to_string());
                flags.push(value.trim().to_string());
            }
            None => flags.push(line.to_string()),
        }
    }
    let mut matches = CaseArgs::command()
        .try_get_matches_from(&flags)
        .map_err(|e| format!("{}: {}", path.display(), clap_message(&e)))?;
    // Keep only what the file names: defaults and environment variables must not override
    // the command line's flags.
    let ids: Vec<String> = matches.ids().map(|id| id.as_str().to_string()).collect();
    for id in ids {
        if matches.value_source(&id) != Some(ValueSource::CommandLine) {
            let _ = matches.try_clear_id(&id);
        }
    }
    args.update_from_arg_matches(&matches)
        .map_err(|e| format!("{}: {}", path.display(), clap_message(&e)))?;
    let relative = |d: &mut Option<PathBuf>, id: &str| {
        if matches.contains_id(id) {
            if let Some(p) = d.as_mut().filter(|p| p.is_relative()) {
                *p = dir.join(&*p);
            }
        }
    };
    relative(&mut args.scripts_dir, "scripts_dir");
    relative(&mut args.templates_dir, "templates_dir");
    Ok(args)
}

/// The first line of a clap error, without its `error: ` prefix.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// What a case rendered.
#[derive(Debug)]
struct Rendered {
    files: Vec<(String, String)>,
    diagnostics: Vec<String>,
}

impl Rendered {
    fn file(&self, name: &str) -> Option<&str> {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }
}

/// A malformed `expect.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    /// 1-based line.
    pub line: usize,
    pub message: String,
}

/// One block of `expect.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// The 1-based line of the block's directive.
    pub line: usize,
    pub kind: ExpectKind,
    /// The block's lines, trimmed, with their line numbers.
    pub lines: Vec<(usize, String)>,
}

/// What a block asserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectKind {
    /// `contains:` / `file PATH contains:` — the lines appear consecutively, in order.
    Contains { file: String },
    /// `not contains:` / `file PATH not contains:` — none of the lines appears.
    NotContains { file: String },
    /// `diagnostic:` — each line is part of some diagnostic.
    Diagnostic,
    /// `no diagnostics` — there are none.
    NoDiagnostics,
}

const DIRECTIVES: &str = "`contains:`, `not contains:`, `file PATH contains:`, \
                          `file PATH not contains:`, `diagnostic:` or `no diagnostics`";

/// Parses `expect.txt`.
///
/// A directive starts in the first column; the lines it lists follow, indented. Lines are
/// compared trimmed. Blank lines, and lines starting with `#` in the first column, are
/// skipped. Directives:
///
/// - `contains:` — the lines appear in haproxy.cfg consecutively and in this order (blank
///   lines of haproxy.cfg are skipped too);
/// - `not contains:` — none of the lines appears anywhere in haproxy.cfg;
/// - `file PATH contains:` / `file PATH not contains:` — the same for another rendered file,
///   e.g. `maps/exact.map`;
/// - `diagnostic:` — each line is a substring of some diagnostic;
/// - `no diagnostics` — the case produces no diagnostic (nothing may follow it indented).
pub fn parse_expectations(text: &str) -> Result<Vec<Expectation>, FormatError> {
    let mut blocks: Vec<Expectation> = Vec::new();
    let error = |line: usize, message: String| FormatError { line, message };
    for (index, raw) in text.lines().enumerate() {
        let n = index + 1;
        if raw.trim().is_empty() || raw.starts_with('#') {
            continue;
        }
        if raw.starts_with([' ', '\t']) {
            match blocks.last_mut() {
                Some(block) if block.kind != ExpectKind::NoDiagnostics => {
                    block.lines.push((n, raw.trim().to_string()));
                }
                Some(_) => {
                    return Err(error(
                        n,
                        "`no diagnostics` takes no lines; start a new directive in the first column"
                            .to_string(),
                    ));
                }
                None => {
                    return Err(error(
                        n,
                        format!("an indented line before any directive; expected {DIRECTIVES}"),
                    ));
                }
            }
            continue;
        }
        finish(blocks.last())?;
        let kind = parse_directive(raw.trim_end()).ok_or_else(|| {
            error(
                n,
                format!("unknown directive `{}`; expected {DIRECTIVES}", raw.trim()),
            )
        })?;
        blocks.push(Expectation {
            line: n,
            kind,
            lines: Vec::new(),
        });
    }
    finish(blocks.last())?;
    if blocks.is_empty() {
        return Err(error(1, format!("no expectations; expected {DIRECTIVES}")));
    }
    let has = |k: &ExpectKind| blocks.iter().find(|b| &b.kind == k).map(|b| b.line);
    if let (Some(line), Some(_)) = (
        has(&ExpectKind::NoDiagnostics),
        has(&ExpectKind::Diagnostic),
    ) {
        return Err(error(
            line,
            "`no diagnostics` contradicts the `diagnostic:` block".to_string(),
        ));
    }
    Ok(blocks)
}

/// A block that lists lines must list at least one.
fn finish(block: Option<&Expectation>) -> Result<(), FormatError> {
    match block {
        Some(b) if b.kind != ExpectKind::NoDiagnostics && b.lines.is_empty() => Err(FormatError {
            line: b.line,
            message: "this directive lists no lines (list them below it, indented)".to_string(),
        }),
        _ => Ok(()),
    }
}

fn parse_directive(line: &str) -> Option<ExpectKind> {
    let config = || CONFIG_FILE.to_string();
    match line {
        "contains:" => return Some(ExpectKind::Contains { file: config() }),
        "not contains:" => return Some(ExpectKind::NotContains { file: config() }),
        "diagnostic:" => return Some(ExpectKind::Diagnostic),
        "no diagnostics" => return Some(ExpectKind::NoDiagnostics),
        _ => {}
    }
    let rest = line.strip_prefix("file ")?;
    let (file, negated) = match rest.strip_suffix(" not contains:") {
        Some(file) => (file, true),
        None => (rest.strip_suffix(" contains:")?, false),
    };
    let file = file.trim();
    if file.is_empty() || file.contains(char::is_whitespace) {
        return None;
    }
    let file = file.to_string();
    Some(if negated {
        ExpectKind::NotContains { file }
    } else {
        ExpectKind::Contains { file }
    })
}

impl Expectation {
    /// Why the rendered output does not meet this expectation, or `None` when it does.
    fn check(&self, rendered: &Rendered) -> Option<String> {
        match &self.kind {
            ExpectKind::Contains { file } => {
                let text = match rendered.file(file) {
                    Some(t) => t,
                    None => return Some(missing_file(file, rendered)),
                };
                check_contains(file, text, &self.lines)
            }
            ExpectKind::NotContains { file } => {
                let text = match rendered.file(file) {
                    Some(t) => t,
                    None => return Some(missing_file(file, rendered)),
                };
                let mut found = Vec::new();
                for (n, want) in &self.lines {
                    for (i, line) in text.lines().enumerate() {
                        if line.trim() == want {
                            found.push(format!(
                                "  {file} line {}: {want}  (expect.txt line {n})",
                                i + 1
                            ));
                        }
                    }
                }
                (!found.is_empty()).then(|| {
                    format!(
                        "{file} has lines it must not contain:\n{}",
                        found.join("\n")
                    )
                })
            }
            ExpectKind::Diagnostic => {
                let missing: Vec<String> = self
                    .lines
                    .iter()
                    .filter(|(_, want)| !rendered.diagnostics.iter().any(|d| d.contains(want)))
                    .map(|(_, want)| format!("  - {want}"))
                    .collect();
                (!missing.is_empty()).then(|| {
                    format!(
                        "no diagnostic contains:\n{}\nthe diagnostics were:\n{}",
                        missing.join("\n"),
                        list_diagnostics(&rendered.diagnostics)
                    )
                })
            }
            ExpectKind::NoDiagnostics => (!rendered.diagnostics.is_empty()).then(|| {
                format!(
                    "expected no diagnostics, got:\n{}",
                    list_diagnostics(&rendered.diagnostics)
                )
            }),
        }
    }
}

fn list_diagnostics(diagnostics: &[String]) -> String {
    if diagnostics.is_empty() {
        return "  (none)".to_string();
    }
    diagnostics
        .iter()
        .map(|d| format!("  {d}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn missing_file(file: &str, rendered: &Rendered) -> String {
    let names: Vec<&str> = rendered.files.iter().map(|(n, _)| n.as_str()).collect();
    format!(
        "no file {file} was rendered; the rendered files are: {}",
        names.join(", ")
    )
}

/// Checks that `want` appears in `text` consecutively (trimmed lines, blank lines skipped);
/// otherwise shows the nearest place as a diff.
fn check_contains(file: &str, text: &str, want: &[(usize, String)]) -> Option<String> {
    // (1-based line number, trimmed line) of every non-blank line.
    let have: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
        .collect();
    let want: Vec<&str> = want.iter().map(|(_, l)| l.as_str()).collect();
    if want.is_empty() {
        return None;
    }
    let found = have
        .windows(want.len())
        .any(|w| w.iter().map(|(_, l)| *l).eq(want.iter().copied()));
    if found {
        return None;
    }
    // The nearest place: the alignment where the most expected lines match.
    let mut best: Option<(usize, usize)> = None; // (matches, start in `have`)
    for (k, w) in want.iter().enumerate() {
        for (j, (_, h)) in have.iter().enumerate() {
            if h != w {
                continue;
            }
            let start = j.saturating_sub(k);
            let score = want
                .iter()
                .zip(have[start..].iter())
                .filter(|(w, (_, h))| *w == h)
                .count();
            if best.is_none_or(|(s, b)| score > s || (score == s && start < b)) {
                best = Some((score, start));
            }
        }
    }
    let what = if want.len() == 1 {
        format!("this line is not in {file}")
    } else {
        format!("these lines are not in {file}, consecutively and in this order")
    };
    let Some((_, start)) = best else {
        let lines: Vec<String> = want.iter().map(|w| format!("  - {w}")).collect();
        return Some(format!("{what}:\n{}", lines.join("\n")));
    };
    let end = (start + want.len() + CONTEXT).min(have.len());
    let window: Vec<&str> = have[start..end].iter().map(|(_, l)| *l).collect();
    let ops = trim_window(diff(&want, &window).unwrap_or_default());
    let near = ops
        .first()
        .and_then(|o| have.get(start + o.b))
        .map_or(0, |(n, _)| *n);
    let mut text = format!("{what} (- expected, + rendered, near {file} line {near}):");
    for o in &ops {
        let (mark, line) = match o.op {
            Op::Same => (' ', want[o.a]),
            Op::Delete => ('-', want[o.a]),
            Op::Insert => ('+', window[o.b]),
        };
        text.push_str(&format!("\n  {mark} {line}"));
    }
    Some(text)
}

/// Cuts the rendered lines around a block's diff that are not part of the mismatch: those
/// before the first expected line, and those after the last one, except as many as stand in
/// for expected lines missing at the end.
fn trim_window(mut ops: Vec<Edit>) -> Vec<Edit> {
    let lead = ops.iter().take_while(|o| o.op == Op::Insert).count();
    ops.drain(..lead);
    let Some(last) = ops.iter().rposition(|o| o.op != Op::Insert) else {
        return ops;
    };
    let keep = if ops[last].op == Op::Delete {
        let expected = ops[..=last].iter().filter(|o| o.op != Op::Insert).count();
        let rendered = ops[..=last].iter().filter(|o| o.op != Op::Delete).count();
        expected.saturating_sub(rendered)
    } else {
        0
    };
    let tail = ops.len() - last - 1;
    ops.truncate(last + 1 + keep.min(tail));
    ops
}

/// Compares a full expected haproxy.cfg with the rendered one, line by line; `None` when they
/// agree. `Portcullis <version>` in the expected text stands for the running version.
fn compare_full(expected: &str, rendered: &str) -> Option<String> {
    let expected = expected.replace(
        "Portcullis <version>",
        concat!("Portcullis ", env!("CARGO_PKG_VERSION")),
    );
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = rendered.lines().collect();
    if a == b {
        return None;
    }
    Some(match diff(&a, &b) {
        Some(ops) => unified(&a, &b, &ops),
        None => first_difference(&a, &b),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// In both.
    Same,
    /// Only in the expected side (`-`).
    Delete,
    /// Only in the rendered side (`+`).
    Insert,
}

/// One diff step: `a` and `b` are the positions in each side when it is taken.
#[derive(Debug, Clone, Copy)]
struct Edit {
    op: Op,
    a: usize,
    b: usize,
}

/// A line diff (longest common subsequence) of `a` into `b`; `None` when the differing
/// middle is too large for the quadratic table.
fn diff(a: &[&str], b: &[&str]) -> Option<Vec<Edit>> {
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (ma, mb) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let (n, m) = (ma.len(), mb.len());
    if n.saturating_mul(m) > MAX_DIFF_CELLS {
        return None;
    }
    // lcs[i * (m + 1) + j]: the LCS length of ma[i..] and mb[j..].
    let width = m + 1;
    let mut lcs = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * width + j] = if ma[i] == mb[j] {
                lcs[(i + 1) * width + j + 1] + 1
            } else {
                lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
            };
        }
    }
    let mut edits: Vec<Edit> = (0..head)
        .map(|k| Edit {
            op: Op::Same,
            a: k,
            b: k,
        })
        .collect();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        let (op, di, dj) = if i < n && j < m && ma[i] == mb[j] {
            (Op::Same, 1, 1)
        } else if j == m || (i < n && lcs[(i + 1) * width + j] >= lcs[i * width + j + 1]) {
            (Op::Delete, 1, 0)
        } else {
            (Op::Insert, 0, 1)
        };
        edits.push(Edit {
            op,
            a: head + i,
            b: head + j,
        });
        i += di;
        j += dj;
    }
    edits.extend((0..tail).map(|k| Edit {
        op: Op::Same,
        a: head + n + k,
        b: head + m + k,
    }));
    Some(edits)
}

/// The edits as unified-diff hunks with [`CONTEXT`] lines around each change.
fn unified(a: &[&str], b: &[&str], edits: &[Edit]) -> String {
    let changes: Vec<usize> = (0..edits.len())
        .filter(|&k| edits[k].op != Op::Same)
        .collect();
    let mut lines = Vec::new();
    let mut k = 0;
    while k < changes.len() {
        // A hunk: changes no more than 2 × CONTEXT unchanged lines apart.
        let mut last = k;
        while last + 1 < changes.len() && changes[last + 1] - changes[last] <= 2 * CONTEXT + 1 {
            last += 1;
        }
        let from = changes[k].saturating_sub(CONTEXT);
        let to = (changes[last] + CONTEXT + 1).min(edits.len());
        let hunk = &edits[from..to];
        let count = |op: Op| {
            hunk.iter()
                .filter(|e| e.op == Op::Same || e.op == op)
                .count()
        };
        lines.push(format!(
            "@@ -{},{} +{},{} @@",
            hunk[0].a + 1,
            count(Op::Delete),
            hunk[0].b + 1,
            count(Op::Insert)
        ));
        for e in hunk {
            lines.push(match e.op {
                Op::Same => format!(" {}", a[e.a]),
                Op::Delete => format!("-{}", a[e.a]),
                Op::Insert => format!("+{}", b[e.b]),
            });
        }
        k = last + 1;
    }
    cap(lines)
}

/// For differences too large to diff: the first differing line, with context.
fn first_difference(a: &[&str], b: &[&str]) -> String {
    let first = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let from = first.saturating_sub(CONTEXT);
    let mut lines = vec![format!(
        "(too large for a line diff: {} expected and {} rendered lines; the first difference, at line {}, follows)",
        a.len(),
        b.len(),
        first + 1
    )];
    lines.extend(a[from..first].iter().map(|l| format!(" {l}")));
    let shown = 2 * CONTEXT;
    lines.extend(a[first..].iter().take(shown).map(|l| format!("-{l}")));
    lines.extend(b[first..].iter().take(shown).map(|l| format!("+{l}")));
    cap(lines)
}

fn cap(mut lines: Vec<String>) -> String {
    if lines.len() > MAX_DIFF_LINES {
        let more = lines.len() - MAX_DIFF_LINES;
        lines.truncate(MAX_DIFF_LINES);
        lines.push(format!("... ({more} more diff lines)"));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn expectations_parse() {
        let text = "# a comment\ncontains:\n  backend a\n    mode http\n\n\
                    not contains:\n  option forwardfor\n\
                    file maps/exact.map contains:\n  a.example.com/ x\n\
                    file maps/exact.map not contains:\n  b\n\
                    diagnostic:\n  annotation haproxy.org/x\n";
        let blocks = parse_expectations(text).unwrap();
        assert_eq!(blocks.len(), 5);
        assert_eq!(
            blocks[0].lines,
            [(3, "backend a".to_string()), (4, "mode http".to_string())]
        );
        assert_eq!(
            blocks[3].kind,
            ExpectKind::NotContains {
                file: "maps/exact.map".to_string()
            }
        );
        assert_eq!(blocks[4].kind, ExpectKind::Diagnostic);
    }

    #[test]
    fn malformed_expectations_name_the_line() {
        let cases = [
            (
                "contains:\n  a\ncontain:\n  b\n",
                3,
                "unknown directive `contain:`",
            ),
            ("  a\n", 1, "before any directive"),
            ("contains:\nnot contains:\n  a\n", 1, "lists no lines"),
            ("no diagnostics\n  a\n", 2, "takes no lines"),
            ("# only a comment\n", 1, "no expectations"),
            ("file contains:\n  a\n", 1, "unknown directive"),
            ("diagnostic:\n  x\nno diagnostics\n", 3, "contradicts"),
        ];
        for (text, line, message) in cases {
            let e = parse_expectations(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert!(e.message.contains(message), "{text:?}: {e:?}");
        }
    }

    fn rendered(cfg: &str) -> Rendered {
        Rendered {
            files: vec![(CONFIG_FILE.to_string(), cfg.to_string())],
            diagnostics: vec!["error: Ingress a/b: annotation x: bad".to_string()],
        }
    }

    fn check(expect: &str, cfg: &str) -> Vec<String> {
        let r = rendered(cfg);
        parse_expectations(expect)
            .unwrap()
            .iter()
            .filter_map(|e| e.check(&r))
            .collect()
    }

    #[test]
    fn contains_is_consecutive_and_skips_blank_lines() {
        let cfg = "backend a\n  mode http\n\n  balance roundrobin\nbackend b\n";
        assert!(check("contains:\n  mode http\n  balance roundrobin\n", cfg).is_empty());
        let f = check("contains:\n  backend a\n  balance roundrobin\n", cfg);
        assert_eq!(f.len(), 1);
        assert!(f[0].contains("+ mode http"), "{}", f[0]);
        let f = check(
            "contains:\n  backend a\n  mode http\n  balance leastconn\n",
            cfg,
        );
        assert!(f[0].contains("- balance leastconn"), "{}", f[0]);
        assert!(f[0].contains("+ balance roundrobin"), "{}", f[0]);
        assert!(f[0].contains("near haproxy.cfg line 1"), "{}", f[0]);
        let f = check("contains:\n  nothing like it\n", cfg);
        assert!(f[0].contains("- nothing like it"), "{}", f[0]);
    }

    #[test]
    fn other_expectations() {
        let cfg = "backend a\n  option forwardfor\n";
        let f = check("not contains:\n  option forwardfor\n", cfg);
        assert!(f[0].contains("haproxy.cfg line 2"), "{}", f[0]);
        assert!(check("diagnostic:\n  annotation x: bad\n", cfg).is_empty());
        let f = check("diagnostic:\n  annotation y\n", cfg);
        assert!(f[0].contains("- annotation y"), "{}", f[0]);
        assert!(f[0].contains("annotation x: bad"), "{}", f[0]);
        assert_eq!(check("no diagnostics\n", cfg).len(), 1);
        let f = check("file maps/x.map contains:\n  a\n", cfg);
        assert!(f[0].contains("no file maps/x.map"), "{}", f[0]);
    }

    #[test]
    fn full_comparison_is_a_unified_diff() {
        let a: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let b = a
            .replace("line 10\n", "line ten\n")
            .replace("line 18\n", "");
        let diff = compare_full(&a, &b).unwrap();
        assert!(diff.contains("-line 10\n+line ten"), "{diff}");
        assert!(diff.contains("-line 18"), "{diff}");
        assert!(diff.starts_with("@@ -7,"), "{diff}");
        assert!(!diff.contains("line 1\n"), "{diff}");
        assert_eq!(compare_full(&a, &a), None);
        let versioned = "# Portcullis <version>\n";
        let real = concat!("# Portcullis ", env!("CARGO_PKG_VERSION"), "\n");
        assert_eq!(compare_full(versioned, real), None);
    }

    #[test]
    fn large_differences_fall_back_to_the_first_one() {
        let a: Vec<String> = (0..3000).map(|i| format!("a{i}")).collect();
        let b: Vec<String> = (0..3000).map(|i| format!("b{i}")).collect();
        let (a, b) = (a.join("\n"), b.join("\n"));
        let diff = compare_full(&a, &b).unwrap();
        assert!(diff.starts_with("(too large"), "{diff}");
        assert!(diff.contains("-a0\n"), "{diff}");
        assert!(diff.contains("+b0\n"), "{diff}");
    }

    #[test]
    fn case_args_override_only_what_they_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(ARGS_FILE),
            "# the class\n--ingress-class edge\n--scripts-dir=site\n",
        )
        .unwrap();
        let base = base_matches(["--configmap", "ingress/portcullis"]).unwrap();
        let args = case_args(dir.path(), &base).unwrap();
        assert_eq!(args.ingress_class, "edge");
        assert_eq!(args.configmap.unwrap().to_string(), "ingress/portcullis");
        assert_eq!(args.scripts_dir.unwrap(), dir.path().join("site"));
        std::fs::write(dir.path().join(ARGS_FILE), "--no-such-flag\n").unwrap();
        let e = case_args(dir.path(), &base).unwrap_err();
        assert!(e.contains("args") && e.contains("--no-such-flag"), "{e}");
    }
}
