//! What scripts declare they read (`// Read:` lines in their header), and the vocabulary the
//! loaded scripts make of it: which annotation names and ConfigMap keys the deployment
//! understands, on which objects. An annotation under an accepted prefix that no script
//! declares is reported, with the closest declared name when one is close.
//!
//! A declaration is one header line, continued on the indented comment lines after it:
//!
//! ```text
//! // Read:     allow-list (whitelist) cidrs from Ingress, ConfigMap, default none:
//! //           clients allowed on the routes; everyone else gets 403.
//! ```
//!
//! `NAME [(ALIAS, …)] TYPE from KIND, … [default DEFAULT]: DESCRIPTION`, where TYPE is the
//! accessor that reads it (`cidrs`, `int(1..100)`, `choice(a|b)`, …) and each KIND an object
//! kind (`Ingress`, `Service`, `ConfigMap`, …).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::diagnostics::{Diagnostics, Severity, UNREAD_VALUE};
use crate::objects::{Kind, ObjectRef};

use super::names::annotation_name;

/// The value types a declaration may name: the accessors of `ctx`.
pub const TYPES: &[&str] = &[
    "bool",
    "int",
    "size",
    "duration",
    "choice",
    "cidrs",
    "access_list",
    "balance",
    "header_name",
    "header_value",
    "headers",
    "host",
    "cookie_name",
    "path",
    "regex",
    "rewrite",
    "rewrites",
    "http_check",
    "secret_ref",
    "alpn",
    "tls_options",
    "ciphers",
    "ciphersuites",
    "cors_origin",
    "http_methods",
    "header_names",
    "redirect",
    "samples",
    "acl",
    "syslog_servers",
    "log_format",
    "snippet",
];

/// One setting a script declares it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The name without a prefix, e.g. `allow-list`.
    pub name: String,
    /// Other names of the same setting, e.g. `whitelist`.
    pub aliases: Vec<String>,
    /// The accessor type, with its arguments as written: `int(1..100)`.
    pub value_type: String,
    /// The objects it may come from.
    pub objects: Vec<Kind>,
    /// As written (`none` when there is none); absent when the line does not say.
    pub default: Option<String>,
    pub description: String,
}

impl Read {
    /// Every name of the setting, the main one first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(self.aliases.iter().map(String::as_str))
    }

    /// Parses the text of a `Read:` line (after the key, continuation lines joined).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let err = |why: &str| {
            format!(
                "Read: {why} (expected `NAME [(ALIAS, ...)] TYPE from KIND, ... [default VALUE]: DESCRIPTION`) in {text:?}"
            )
        };
        let from_at = text.find(" from ").ok_or_else(|| err("no `from KIND`"))?;
        let colon = text[from_at..]
            .find(": ")
            .map(|i| from_at + i)
            .or_else(|| text.ends_with(':').then(|| text.len() - 1))
            .ok_or_else(|| err("no `: DESCRIPTION`"))?;
        let description = text[colon + 1..].trim().to_string();
        if description.is_empty() {
            return Err(err("the description is empty"));
        }
        let head = text[..from_at].trim();
        let (name, rest) = head
            .split_once(char::is_whitespace)
            .ok_or_else(|| err("no TYPE"))?;
        let mut rest = rest.trim_start();
        let mut aliases = Vec::new();
        if let Some(inner) = rest.strip_prefix('(') {
            let (list, after) = inner
                .split_once(')')
                .ok_or_else(|| err("an alias list without `)`"))?;
            for alias in list.split(',').map(str::trim) {
                aliases.push(check_name(alias).map_err(|e| err(&e))?);
            }
            rest = after.trim_start();
        }
        let value_type = rest.trim();
        let base = value_type.split('(').next().unwrap_or_default();
        if !TYPES.contains(&base) || value_type.contains(char::is_whitespace) {
            return Err(err(&format!(
                "the type {value_type:?} is not one of {}",
                TYPES.join(", ")
            )));
        }
        ValueType::parse(value_type).map_err(|e| err(&e))?;
        let tail = text[from_at + " from ".len()..colon].trim();
        let (kinds, default) = match tail.split_once(" default ") {
            Some((k, d)) => (k, Some(d.trim().trim_end_matches(',').to_string())),
            None => match tail.strip_prefix("default ") {
                Some(_) => return Err(err("no KIND before `default`")),
                None => (tail, None),
            },
        };
        let mut objects = Vec::new();
        for word in kinds
            .split([',', ' '])
            .map(str::trim)
            .filter(|w| !w.is_empty())
        {
            let kind = Kind::ALL
                .into_iter()
                .find(|k| k.as_str() == word)
                .ok_or_else(|| err(&format!("{word:?} is not an object kind")))?;
            if !objects.contains(&kind) {
                objects.push(kind);
            }
        }
        if objects.is_empty() {
            return Err(err("no KIND after `from`"));
        }
        Ok(Self {
            name: check_name(name).map_err(|e| err(&e))?,
            aliases,
            value_type: value_type.to_string(),
            objects,
            default,
            description,
        })
    }
}

/// A declared type as the checks use it: the accessor, and the arguments the declaration
/// fixes (`int(1..100)`'s range, `choice(a|b)`'s words), if it gives any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueType {
    /// `int` or `int(MIN..MAX)`.
    Int(Option<(i64, i64)>),
    /// `choice` or `choice(A|B|…)`.
    Choice(Option<Vec<String>>),
    /// Any other accessor, by name: its parser takes no arguments.
    Plain(String),
}

impl ValueType {
    /// Parses a declaration's TYPE (the base already known to be one of [`TYPES`]).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (base, args) = match text.split_once('(') {
            Some((base, rest)) => {
                let args = rest
                    .strip_suffix(')')
                    .filter(|a| !a.is_empty())
                    .ok_or_else(|| format!("{text:?} has an unclosed or empty `(…)`"))?;
                (base, Some(args))
            }
            None => (text, None),
        };
        match (base, args) {
            ("int", None) => Ok(Self::Int(None)),
            ("int", Some(range)) => {
                let bound = |b: &str| {
                    b.trim()
                        .parse::<i64>()
                        .map_err(|_| format!("{text:?}: {b:?} is not an integer"))
                };
                let (min, max) = range
                    .split_once("..")
                    .ok_or_else(|| format!("{text:?} is not `int(MIN..MAX)`"))?;
                let (min, max) = (bound(min)?, bound(max)?);
                if min > max {
                    return Err(format!("{text:?}: the range is empty"));
                }
                Ok(Self::Int(Some((min, max))))
            }
            ("choice", None) => Ok(Self::Choice(None)),
            ("choice", Some(words)) => Ok(Self::Choice(Some(
                words.split('|').map(|w| w.trim().to_string()).collect(),
            ))),
            (base, None) => Ok(Self::Plain(base.to_string())),
            (base, Some(_)) => Err(format!("{text:?}: {base} takes no `(…)`")),
        }
    }

    /// The accessor that reads a value of this type.
    pub fn accessor(&self) -> &str {
        match self {
            Self::Int(_) => "int",
            Self::Choice(_) => "choice",
            Self::Plain(base) => base,
        }
    }

    /// Why a call of `accessor` with these arguments (`None` when they are not known before
    /// the call runs) does not read this type, or `None` when it does.
    pub fn mismatch(&self, accessor: &str, args: Option<&CallArgs>) -> Option<String> {
        if accessor != self.accessor() {
            return Some(format!("it is declared as {}", self.accessor()));
        }
        match (self, args) {
            (Self::Int(Some((min, max))), Some(CallArgs::Range(a, b))) if (min, max) != (a, b) => {
                Some(format!(
                    "it reads the range {a}..{b} but the declaration says {min}..{max}"
                ))
            }
            (Self::Choice(Some(words)), Some(CallArgs::Words(used))) if words != used => {
                Some(format!(
                    "it allows {} but the declaration says {}",
                    used.join("|"),
                    words.join("|")
                ))
            }
            _ => None,
        }
    }

    /// Whether `raw` is a valid value of this type, as the accessor would parse it. `None`
    /// for the types whose check depends on the object or the administrator's policy
    /// (snippets), which only their hook can tell.
    pub fn check(&self, raw: &str) -> Option<Result<(), String>> {
        use crate::values;
        fn ok<T>(r: values::ParseResult<T>) -> Option<Result<(), String>> {
            Some(r.map(|_| ()))
        }
        if let Err(e) = values::check_value_size(raw) {
            return Some(Err(e));
        }
        match self {
            Self::Int(range) => {
                let (min, max) = range.unwrap_or((i64::MIN, i64::MAX));
                ok(values::parse_int(raw, min, max))
            }
            Self::Choice(Some(words)) => {
                let refs: Vec<&str> = words.iter().map(String::as_str).collect();
                ok(values::parse_enum(raw, &refs))
            }
            Self::Choice(None) => None,
            Self::Plain(base) => match base.as_str() {
                "bool" => ok(values::parse_bool(raw)),
                "size" => ok(values::parse_size(raw)),
                "duration" => ok(values::parse_duration(raw)),
                "cidrs" => ok(values::parse_cidr_list(raw)),
                "access_list" => ok(values::parse_access_list(raw)),
                "balance" => ok(values::parse_balance(raw)),
                "header_name" => ok(values::parse_header_name(raw)),
                "header_value" => ok(values::parse_header_value(raw)),
                "headers" => ok(values::parse_header_lines(raw, None)),
                "host" => ok(values::parse_host_header(raw)),
                "cookie_name" => ok(values::parse_cookie_name(raw)),
                "path" => ok(values::parse_path(raw)),
                "regex" => ok(values::parse_acl_regex(raw)),
                "rewrite" => ok(values::parse_rewrite(raw)),
                "rewrites" => ok(values::parse_rewrites(raw)),
                "http_check" => ok(values::parse_http_check(raw)),
                "secret_ref" => ok(values::parse_secret_ref(raw)),
                "alpn" => ok(values::parse_alpn(raw)),
                "cors_origin" => ok(values::parse_cors_origin(raw)),
                "http_methods" => ok(values::parse_http_methods(raw)),
                "header_names" => ok(values::parse_header_name_list(raw)),
                "redirect" => ok(values::parse_redirect_target(raw)),
                "samples" => ok(values::parse_capture_samples(raw)),
                "acl" => ok(values::parse_route_acl(raw)),
                "syslog_servers" => ok(super::global_keys::parse_syslog_servers(raw)),
                "log_format" => ok(super::global_keys::parse_log_format(raw)),
                "tls_options" => ok(super::global_keys::parse_tls_bind_options(raw)),
                "ciphers" => ok(super::global_keys::parse_cipher_list(raw)),
                "ciphersuites" => ok(super::global_keys::parse_ciphersuites(raw)),
                _ => None,
            },
        }
    }
}

/// The arguments after the name of an accessor call, where they fix what it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallArgs {
    /// `ctx.int(name, MIN, MAX)`.
    Range(i64, i64),
    /// `ctx.choice(name, [A, B, …])`, each word as a string.
    Words(Vec<String>),
}

/// The names one script declares, with their types: what its reads are checked against.
#[derive(Debug, Default)]
pub struct Declared {
    types: HashMap<String, ValueType>,
}

impl Declared {
    pub fn new<'a>(reads: impl IntoIterator<Item = &'a Read>) -> Self {
        let mut types = HashMap::new();
        for read in reads {
            // Checked when the declaration was parsed.
            let Ok(ty) = ValueType::parse(&read.value_type) else {
                continue;
            };
            for name in read.names() {
                types.insert(name.to_string(), ty.clone());
            }
        }
        Self { types }
    }

    /// Why reading `name` through `accessor` (`has` and `ignore_on` read any type) is not
    /// what the script declares, or `None` when it is.
    pub fn refuse(&self, name: &str, accessor: &str, args: Option<&CallArgs>) -> Option<String> {
        let Some(ty) = self.types.get(name) else {
            return Some(format!(
                "reads {name:?} (ctx.{accessor}) without declaring it: add a `// Read: {name} TYPE from KIND: DESCRIPTION` line to its header"
            ));
        };
        if matches!(accessor, "has" | "ignore_on") {
            return None;
        }
        ty.mismatch(accessor, args)
            .map(|why| format!("reads {name:?} through ctx.{accessor}, but {why}"))
    }
}

/// A read whose name is written in the script: `ctx.duration("timeout-server")`, or an
/// array of names for a name and its aliases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiteralRead {
    pub line: usize,
    pub accessor: String,
    pub names: Vec<String>,
    /// The arguments fixing what it accepts, when they are written out too.
    pub args: Option<CallArgs>,
}

/// Every method call in `ast` named like an accessor (or `has`, `ignore_on`) whose name
/// argument is a literal: the reads a script's text shows. Names built at run time are
/// checked when they are read.
pub fn literal_reads(ast: &rhai::AST) -> Vec<LiteralRead> {
    use rhai::{ASTNode, Expr};
    let mut out = Vec::new();
    ast.walk(&mut |path: &[ASTNode]| {
        let Some(ASTNode::Expr(Expr::MethodCall(call, pos))) = path.last() else {
            return true;
        };
        let accessor = call.name.as_str();
        let at = match accessor {
            "ignore_on" => 1,
            "has" => 0,
            a if TYPES.contains(&a) => 0,
            _ => return true,
        };
        let literal = |i: usize| call.args.get(i).and_then(|a| a.get_literal_value(None));
        let Some(names) = literal(at).and_then(|v| strings(&v)) else {
            return true;
        };
        let args = match accessor {
            "int" => match (literal(1), literal(2)) {
                (Some(a), Some(b)) => a
                    .as_int()
                    .ok()
                    .zip(b.as_int().ok())
                    .map(|(a, b)| CallArgs::Range(a, b)),
                _ => None,
            },
            "choice" => literal(1)
                .and_then(|v| v.into_array().ok())
                .map(|a| CallArgs::Words(a.iter().map(ToString::to_string).collect())),
            _ => None,
        };
        out.push(LiteralRead {
            line: pos.line().unwrap_or(0),
            accessor: accessor.to_string(),
            names,
            args,
        });
        true
    });
    out
}

/// A literal string, or an array of literal strings.
fn strings(value: &rhai::Dynamic) -> Option<Vec<String>> {
    if value.is_string() {
        return Some(vec![value.to_string()]);
    }
    value
        .clone()
        .into_array()
        .ok()?
        .iter()
        .map(|v| v.is_string().then(|| v.to_string()))
        .collect()
}

/// A setting name: lowercase letters, digits, `-` and `.`, starting with a letter or digit.
fn check_name(name: &str) -> Result<String, String> {
    let ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'));
    if ok {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a setting name (lowercase letters, digits, '-', '.')"
        ))
    }
}

/// Names the core reads itself, not a script: the references to the incumbent's custom
/// resources (`translate::incumbent_crs`).
const CORE_READS: &[(&str, &[Kind])] = &[
    (
        "cr-backend",
        &[Kind::Service, Kind::Ingress, Kind::ConfigMap],
    ),
    ("cr-defaults", &[Kind::ConfigMap]),
    ("cr-global", &[Kind::ConfigMap]),
];

/// Every name the loaded scripts declare (and those of [`CORE_READS`]), with the objects
/// each may come from.
#[derive(Debug, Default)]
pub struct Vocabulary {
    names: BTreeMap<String, Known>,
    /// The closest known name of the unknown names seen so far.
    suggestions: Mutex<HashMap<String, Option<String>>>,
}

#[derive(Debug, Default, Clone)]
struct Known {
    objects: Vec<Kind>,
    /// Each declaration's type (as written, and parsed) with the kinds it is declared for.
    types: Vec<(String, ValueType, Vec<Kind>)>,
}

impl Vocabulary {
    /// The vocabulary of these declarations.
    pub fn new<'a>(reads: impl IntoIterator<Item = &'a Read>) -> Self {
        let mut names: BTreeMap<String, Known> = BTreeMap::new();
        for (name, objects) in CORE_READS {
            names.insert(
                name.to_string(),
                Known {
                    objects: objects.to_vec(),
                    types: Vec::new(),
                },
            );
        }
        for read in reads {
            for name in read.names() {
                let known = names.entry(name.to_string()).or_default();
                for kind in &read.objects {
                    if !known.objects.contains(kind) {
                        known.objects.push(*kind);
                    }
                }
                if let Ok(ty) = ValueType::parse(&read.value_type) {
                    known
                        .types
                        .push((read.value_type.clone(), ty, read.objects.clone()));
                }
            }
        }
        Self {
            names,
            suggestions: Mutex::default(),
        }
    }

    /// Whether some script declares `name` (for any object).
    pub fn knows(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// Reports every annotation of `object` under an accepted prefix that no script reads on
    /// an object of its kind: a warning naming the annotation, with the closest known name;
    /// and every one that some script reads there but whose value is not of the declared
    /// type ([`Self::check_value`]). Annotations without a prefix are not reported: they may
    /// belong to anyone.
    pub fn check_annotations(
        &self,
        object: &ObjectRef,
        annotations: &BTreeMap<String, String>,
        diags: &mut Diagnostics,
    ) {
        let mut suggest = MAX_SUGGESTED_PER_OBJECT;
        for (key, value) in annotations {
            let Some((_, name)) = annotation_name(key) else {
                continue;
            };
            let field = || format!("annotation {key}");
            match self.verdict(name, object.kind, "annotation", &mut suggest) {
                Some(message) => diags.object(Severity::Warning, object, field(), message),
                None => self.check_value(object, name, value, field, diags),
            }
        }
    }

    /// Reports `value` of `name` on `object` when it is of none of the types declared for
    /// that kind of object: an error naming the field and the type, before (and whether or
    /// not) a hook reads it. Types whose check depends on more than the value (snippets,
    /// a `choice` without its words) are left to the hook.
    fn check_value(
        &self,
        object: &ObjectRef,
        name: &str,
        value: &str,
        field: impl FnOnce() -> String,
        diags: &mut Diagnostics,
    ) {
        let Some(known) = self.names.get(name) else {
            return;
        };
        let mut first_error = None;
        for (written, ty, kinds) in &known.types {
            if !kinds.contains(&object.kind) {
                continue;
            }
            match ty.check(value) {
                None | Some(Ok(())) => return,
                Some(Err(e)) => {
                    first_error.get_or_insert((written, e));
                }
            }
        }
        if let Some((written, e)) = first_error {
            diags.object(
                Severity::Error,
                object,
                field(),
                format!("declared {written}: {e}{UNREAD_VALUE}"),
            );
        }
    }

    /// Reports every key of the controller ConfigMap that no script reads from a ConfigMap.
    /// A key with an accepted prefix is read as the name after it (see
    /// [`super::context::ValueSource::config_map`]).
    /// Values of a declared type are checked as on objects ([`Self::check_annotations`]).
    pub fn check_config_map(
        &self,
        object: &ObjectRef,
        data: &BTreeMap<String, String>,
        diags: &mut Diagnostics,
    ) {
        let mut suggest = MAX_SUGGESTED_PER_OBJECT;
        for (key, value) in data {
            let name = annotation_name(key).map_or(key.as_str(), |(_, n)| n);
            let field = || format!("key {key}");
            match self.verdict(name, Kind::ConfigMap, "key", &mut suggest) {
                Some(message) => diags.object(Severity::Warning, object, field(), message),
                None => self.check_value(object, name, value, field, diags),
            }
        }
    }

    /// Why `name` on an object of `kind` is not read, or `None` when it is.
    /// `suggest` is how many more unknown names of this object may get a suggestion.
    fn verdict(&self, name: &str, kind: Kind, noun: &str, suggest: &mut usize) -> Option<String> {
        match self.names.get(name) {
            Some(known) if known.objects.contains(&kind) => None,
            Some(known) => {
                let places: Vec<&str> = known.objects.iter().map(|k| k.as_str()).collect();
                Some(format!(
                    "ignored: no script reads it on {} {} (only on {})",
                    article(kind),
                    kind.as_str(),
                    places.join(", ")
                ))
            }
            None => Some(match self.suggestion(name, suggest) {
                Some(near) => {
                    format!("ignored: no script reads this {noun}; did you mean {near}?")
                }
                None => format!("ignored: no script reads this {noun}"),
            }),
        }
    }

    /// [`Self::closest`] while the object has suggestions left.
    fn suggestion(&self, name: &str, left: &mut usize) -> Option<String> {
        if *left == 0 {
            return None;
        }
        *left -= 1;
        self.closest(name)
    }

    /// The known name closest to `name`, if it is close: at most a third of its length in
    /// edits (and at most 3), ties broken by name order. The same unknown names come back on
    /// many objects, so answers are remembered (a bounded number of them).
    fn closest(&self, name: &str) -> Option<String> {
        let remembered = self
            .suggestions
            .lock()
            .ok()
            .and_then(|m| m.get(name).cloned());
        if let Some(answer) = remembered {
            return answer;
        }
        let limit = (name.len() / 3).clamp(1, 3);
        let lower = name.to_ascii_lowercase();
        let answer = self
            .names
            .keys()
            .filter_map(|known| Some((edit_distance_within(&lower, known, limit)?, known)))
            .min_by_key(|(d, _)| *d)
            .map(|(_, k)| k.clone());
        if let Ok(mut m) = self.suggestions.lock() {
            if m.len() >= MAX_SUGGESTIONS {
                m.clear();
            }
            m.insert(name.to_string(), answer.clone());
        }
        answer
    }
}

/// How many unknown names of one object get a suggestion: the rest are reported without one,
/// so that an object with thousands of made-up annotations costs little.
const MAX_SUGGESTED_PER_OBJECT: usize = 16;

/// How many suggestions a vocabulary remembers before it starts afresh.
const MAX_SUGGESTIONS: usize = 4096;

/// The edit distance of `a` and `b` (by bytes; an adjacent swap counts as one edit) if it is
/// at most `limit`: names whose lengths differ by more are not compared at all, and a row
/// whose every cell is past the limit ends the comparison.
fn edit_distance_within(a: &str, b: &str, limit: usize) -> Option<usize> {
    if a.len().abs_diff(b.len()) > limit || a.len() > MAX_COMPARED || b.len() > MAX_COMPARED {
        return None;
    }
    let d = edit_distance(a.as_bytes(), b.as_bytes(), limit);
    (d <= limit).then_some(d)
}

/// The longest names compared for a suggestion.
const MAX_COMPARED: usize = 63;

/// Levenshtein distance, an adjacent swap counting as one edit; once every cell of a row is
/// past `limit`, `limit + 1`. Both are at most [`MAX_COMPARED`] bytes long.
fn edit_distance(a: &[u8], b: &[u8], limit: usize) -> usize {
    // Rows i-2, i-1 and i of the table.
    let mut before = [0usize; MAX_COMPARED + 1];
    let mut prev = [0usize; MAX_COMPARED + 1];
    for (j, cell) in prev.iter_mut().enumerate().take(b.len() + 1) {
        *cell = j;
    }
    let mut cur = [0usize; MAX_COMPARED + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        let mut row_min = cur[0];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            cur[j] = d;
            row_min = row_min.min(d);
        }
        if row_min > limit {
            return limit + 1;
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

fn article(kind: Kind) -> &'static str {
    // By sound: "an HTTPRoute".
    if kind.as_str().starts_with(['A', 'E', 'I', 'O', 'U']) || kind == Kind::HttpRoute {
        "an"
    } else {
        "a"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Key;

    #[test]
    fn a_read_line_parses_into_its_parts() {
        let r = Read::parse(
            "allow-list (whitelist) cidrs from Ingress, ConfigMap default none: clients allowed; everyone else gets 403.",
        )
        .unwrap();
        assert_eq!(r.name, "allow-list");
        assert_eq!(r.aliases, ["whitelist"]);
        assert_eq!(r.value_type, "cidrs");
        assert_eq!(r.objects, [Kind::Ingress, Kind::ConfigMap]);
        assert_eq!(r.default.as_deref(), Some("none"));
        assert_eq!(r.description, "clients allowed; everyone else gets 403.");
        let r = Read::parse("pod-maxconn int(1..1000000) from Service: the cap.").unwrap();
        assert_eq!(r.value_type, "int(1..1000000)");
        assert_eq!(r.default, None);
        for bad in [
            "allow-list cidrs Ingress: no from",
            "allow-list cidrs from Ingress",
            "allow-list cidrs from Ingress:",
            "allow-list banana from Ingress: x",
            "allow-list cidrs from Pods: x",
            "Allow-List cidrs from Ingress: x",
            "allow-list (white list) cidrs from Ingress: x",
            "allow-list cidrs from default 1: x",
        ] {
            assert!(Read::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unread_annotations_are_reported_with_the_closest_name() {
        let reads = [
            Read::parse("timeout-server duration from Service, Ingress, ConfigMap: t.").unwrap(),
            Read::parse("allow-list (whitelist) cidrs from Ingress, ConfigMap: a.").unwrap(),
            Read::parse("global-config-snippet snippet from ConfigMap: g.").unwrap(),
        ];
        let vocabulary = Vocabulary::new(&reads);
        let object = ObjectRef::new(Kind::Ingress, &Key::new("ns", "web"));
        let keys: BTreeMap<String, String> = [
            "haproxy.org/timeout-server",
            "haproxy.com/whitelist",
            "haproxy.org/timeout-sever",
            "ingress.kubernetes.io/alow-list",
            "portcullis.io/frobnicate",
            "haproxy.org/global-config-snippet",
            "timeout-sever",
            "example.com/timeout-sever",
            "kubectl.kubernetes.io/last-applied-configuration",
        ]
        .iter()
        .map(|k| {
            let value = if k.ends_with("whitelist") {
                "10.0.0.0/8"
            } else {
                "1s"
            };
            (k.to_string(), value.to_string())
        })
        .collect();
        let mut diags = Diagnostics::new();
        vocabulary.check_annotations(&object, &keys, &mut diags);
        let lines: Vec<String> = diags.into_sorted().iter().map(|d| d.to_string()).collect();
        assert_eq!(
            lines,
            [
                "warning: Ingress ns/web: annotation haproxy.org/global-config-snippet: ignored: no script reads it on an Ingress (only on ConfigMap)",
                "warning: Ingress ns/web: annotation haproxy.org/timeout-sever: ignored: no script reads this annotation; did you mean timeout-server?",
                "warning: Ingress ns/web: annotation ingress.kubernetes.io/alow-list: ignored: no script reads this annotation; did you mean allow-list?",
                "warning: Ingress ns/web: annotation portcullis.io/frobnicate: ignored: no script reads this annotation",
            ]
        );
    }

    /// Past 16 unknown names on one object, the rest are reported without a suggestion.
    #[test]
    fn suggestions_are_bounded_per_object() {
        let reads = [Read::parse("timeout-server duration from Ingress: t.").unwrap()];
        let vocabulary = Vocabulary::new(&reads);
        let object = ObjectRef::new(Kind::Ingress, &Key::new("ns", "web"));
        let keys: BTreeMap<String, String> = (0..20)
            .map(|i| (format!("haproxy.org/timeout-serve{i}"), String::new()))
            .collect();
        let mut diags = Diagnostics::new();
        vocabulary.check_annotations(&object, &keys, &mut diags);
        let suggested = diags
            .iter()
            .filter(|d| d.message.contains("did you mean"))
            .count();
        assert_eq!((diags.len(), suggested), (20, 16));
    }

    /// A declared annotation's value is checked against its declared type once per object,
    /// whether or not a hook reads it; the report gives way to a hook's own report of the
    /// same field.
    #[test]
    fn values_are_checked_against_their_declared_type() {
        let reads = [
            Read::parse("timeout-server duration from Service, ConfigMap: t.").unwrap(),
            Read::parse("pod-maxconn int(1..100) from Service: m.").unwrap(),
            Read::parse("server-proto choice(h1|h2) from Service: p.").unwrap(),
            Read::parse("backend-config-snippet snippet from Service: s.").unwrap(),
            Read::parse("check-interval duration from Ingress: i.").unwrap(),
        ];
        let vocabulary = Vocabulary::new(&reads);
        let object = ObjectRef::new(Kind::Service, &Key::new("ns", "web"));
        let annotations: BTreeMap<String, String> = [
            ("haproxy.org/timeout-server", "10x"),
            ("portcullis.io/pod-maxconn", "500"),
            ("haproxy.org/server-proto", "h2"),
            ("haproxy.org/backend-config-snippet", "anything at all"),
            ("haproxy.org/check-interval", "banana"),
            ("timeout-server", "bare, not checked"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut diags = Diagnostics::new();
        vocabulary.check_annotations(&object, &annotations, &mut diags);
        let lines: Vec<String> = diags
            .clone()
            .into_sorted()
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert_eq!(
            lines,
            [
                "warning: Service ns/web: annotation haproxy.org/check-interval: ignored: no script reads it on a Service (only on Ingress)",
                "error: Service ns/web: annotation haproxy.org/timeout-server: declared duration: \"10x\" is not a duration (expected e.g. 500ms, 30s, 5m, 1h, 1d); ignored wherever it is read",
                "error: Service ns/web: annotation portcullis.io/pod-maxconn: declared int(1..100): 500 is outside the allowed range 1..100; ignored wherever it is read",
            ]
        );
        // A hook that reads the value reports it with its consequence: that report stays.
        diags.object(
            Severity::Error,
            &object,
            "annotation haproxy.org/timeout-server",
            "\"10x\" is not a duration; setting ignored",
        );
        let lines: Vec<String> = diags.into_sorted().iter().map(|d| d.to_string()).collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[1].ends_with("; setting ignored"), "{lines:?}");
        assert!(lines[2].contains("pod-maxconn"), "{lines:?}");

        let config = ObjectRef::new(Kind::ConfigMap, &Key::new("ns", "cfg"));
        let data = BTreeMap::from([
            ("timeout-server".to_string(), "never".to_string()),
            ("haproxy.org/timeout-server".to_string(), "5s".to_string()),
        ]);
        let mut diags = Diagnostics::new();
        vocabulary.check_config_map(&config, &data, &mut diags);
        let lines: Vec<String> = diags.into_sorted().iter().map(|d| d.to_string()).collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "error: ConfigMap ns/cfg: key timeout-server: declared duration: \"never\""
            ),
            "{lines:?}"
        );
    }

    #[test]
    fn edit_distance_counts_swaps_as_one() {
        let d = |a: &str, b: &str| edit_distance(a.as_bytes(), b.as_bytes(), 9);
        assert_eq!(d("timeout-server", "timeout-server"), 0);
        assert_eq!(d("timeout-sever", "timeout-server"), 1);
        assert_eq!(d("tiemout-server", "timeout-server"), 1);
        assert_eq!(d("", "abc"), 3);
        assert_eq!(d("kitten", "sitting"), 3);
        assert_eq!(edit_distance_within("kitten", "sitting", 2), None);
        assert_eq!(edit_distance_within("a", "abcdef", 3), None);
        assert_eq!(edit_distance(b"abcdefgh", b"zzzzzzzz", 2), 3);
    }
}
