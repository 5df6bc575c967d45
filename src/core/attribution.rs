//! HAProxy's verdict traced back to objects. When `haproxy -c` or a reload refuses a
//! configuration, the lines, proxies and addresses its messages name lead, through the rendered
//! configuration's sections and the model, to the objects that produced them; those alone are
//! then left out ([`Quarantine`]) so that everyone else's changes are applied.
//!
//! Pure: messages, the rendered configuration, the model and the store in, objects out.

use std::collections::{BTreeMap, BTreeSet};

use crate::diagnostics::{Diagnostic, Severity, Subject};
use crate::model::{Backend, Model};
use crate::objects::{Key, Kind, Object, ObjectRef};
use crate::render::{CONFIG_FILE, RenderedConfig, Section};
use crate::store::Store;

/// What one message of HAProxy's points at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pointer {
    /// A line of haproxy.cfg (`parsing [haproxy.cfg:57]`, `[haproxy.cfg:57]`).
    pub line: Option<usize>,
    /// A proxy named in the message (`backend 'x'`, `proxy 'x'`, `'server x/SRV_1'`).
    pub proxy: Option<String>,
    /// An address HAProxy could not bind (`cannot bind socket (…) [addr:port]`).
    pub bind: Option<(String, u16)>,
}

/// Reads what an `[ALERT]` line of HAProxy's names.
pub fn pointer(message: &str) -> Pointer {
    Pointer {
        line: config_line(message),
        proxy: proxy_name(message),
        bind: bind_address(message),
    }
}

/// `[<…>haproxy.cfg:<line>]` anywhere in the message.
fn config_line(message: &str) -> Option<usize> {
    let needle = format!("{CONFIG_FILE}:");
    let mut rest = message;
    while let Some(at) = rest.find(&needle) {
        let after = &rest[at + needle.len()..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && after[digits.len()..].starts_with(']') {
            return digits.parse().ok();
        }
        rest = after;
    }
    None
}

fn proxy_name(message: &str) -> Option<String> {
    for word in ["backend '", "frontend '", "proxy '", "Proxy '", "listen '"] {
        if let Some(at) = message.find(word) {
            let name: String = message[at + word.len()..]
                .chars()
                .take_while(|c| *c != '\'')
                .collect();
            if !name.is_empty() {
                return Some(name);
            }
        }
    }
    // `'server <proxy>/<server>'`, `Starting frontend <proxy>:`.
    if let Some(at) = message.find("'server ") {
        let name: String = message[at + 8..]
            .chars()
            .take_while(|c| *c != '/' && *c != '\'')
            .collect();
        if !name.is_empty() {
            return Some(name);
        }
    }
    let at = message.find("Starting frontend ")?;
    let name: String = message[at + 18..]
        .chars()
        .take_while(|c| *c != ':' && !c.is_whitespace())
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The `[addr:port]` of a `cannot bind socket` message (HAProxy writes IPv6 addresses
/// without brackets there: `[::1:443]`).
fn bind_address(message: &str) -> Option<(String, u16)> {
    let at = message.find("cannot bind socket")?;
    let open = message[at..].find('[')? + at;
    let close = message[open..].rfind(']')? + open;
    let inside = &message[open + 1..close];
    let (addr, port) = inside.rsplit_once(':')?;
    Some((
        addr.trim_matches(|c| c == '[' || c == ']').to_string(),
        port.parse().ok()?,
    ))
}

/// One object HAProxy's verdict leads to, with the message that led there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Culprit {
    pub object: ObjectRef,
    pub message: String,
}

/// The tenant objects HAProxy's `messages` lead to. Messages that point at nothing a tenant
/// wrote (the global section, the controller's own frontends without a tenant's name on the
/// line) lead nowhere: the configuration is then refused as a whole, as before.
pub fn culprits(
    messages: &[String],
    rendered: &RenderedConfig,
    model: &Model,
    store: &Store,
) -> Vec<Culprit> {
    let cfg = rendered.haproxy_cfg();
    let lines: Vec<&str> = cfg.lines().collect();
    let sections = rendered.sections();
    let mut found: BTreeMap<ObjectRef, String> = BTreeMap::new();
    for message in messages {
        let p = pointer(message);
        let text = p.line.and_then(|n| lines.get(n.wrapping_sub(1)).copied());
        let mut proxies: BTreeSet<String> = BTreeSet::new();
        if let Some(section) = p.line.and_then(|n| Section::containing(&sections, n)) {
            proxies.insert(section.name.clone());
        }
        proxies.extend(p.proxy.clone());
        let mut candidates: BTreeSet<ObjectRef> = BTreeSet::new();
        for proxy in &proxies {
            candidates.extend(owners_of_proxy(proxy, text, model, store));
        }
        if let Some((addr, port)) = &p.bind {
            candidates.extend(owners_of_bind(addr, *port, model, store));
        }
        let narrowed = narrow(candidates, text, store);
        let short = message.trim();
        for object in narrowed {
            found.entry(object).or_insert_with(|| short.to_string());
        }
    }
    found
        .into_iter()
        .map(|(object, message)| Culprit { object, message })
        .collect()
}

/// Site template parts (`parts/site/…`) HAProxy's `messages` lead to: for each refused line
/// of haproxy.cfg, the line of a site part that prints it (its literal text, around the
/// values it prints, matches), as an error naming the site file and that line. The objects
/// whose section holds the line are still found by [`culprits`]; this tells the site's
/// template author which of their lines HAProxy refused.
pub fn site_parts(
    messages: &[String],
    rendered: &RenderedConfig,
    templates: &[crate::layers::SourceFile],
) -> Vec<Diagnostic> {
    let parts: Vec<&crate::layers::SourceFile> = templates
        .iter()
        .filter(|t| {
            t.name.starts_with("parts/site/")
                && matches!(t.layer, crate::layers::Layer::Site { .. })
        })
        .collect();
    if parts.is_empty() {
        return Vec::new();
    }
    let cfg = rendered.haproxy_cfg();
    let lines: Vec<&str> = cfg.lines().collect();
    let mut found: BTreeMap<(String, usize), (usize, String)> = BTreeMap::new();
    for message in messages {
        let Some(n) = pointer(message).line else {
            continue;
        };
        let Some(text) = lines.get(n.wrapping_sub(1)) else {
            continue;
        };
        for part in &parts {
            for (i, source) in part.text.lines().enumerate() {
                if template_line_prints(source, text) {
                    found
                        .entry((part.display_name("templates"), i + 1))
                        .or_insert_with(|| (n, message.trim().to_string()));
                }
            }
        }
    }
    found
        .into_iter()
        .map(|((file, line), (cfg_line, message))| Diagnostic {
            severity: Severity::Error,
            subject: Subject::Source { file },
            field: None,
            message: format!(
                "line {line}: HAProxy refused what it printed (haproxy.cfg line {cfg_line}): {}",
                shorten(&message, 300)
            ),
        })
        .collect()
}

/// Whether template line `source` can print `line`: its literal pieces (the text around
/// `{{ … }}` and `{% … %}`) appear in `line` in order, the first at its start and the last at
/// its end. A line with less than 4 characters of literal text matches nothing.
fn template_line_prints(source: &str, line: &str) -> bool {
    let mut pieces: Vec<&str> = Vec::new();
    let mut rest = source;
    loop {
        let open = ["{{", "{%", "{#"].iter().filter_map(|o| rest.find(o)).min();
        let Some(at) = open else {
            pieces.push(rest);
            break;
        };
        pieces.push(&rest[..at]);
        let close = match &rest[at..at + 2] {
            "{{" => "}}",
            "{%" => "%}",
            _ => "#}",
        };
        match rest[at + 2..].find(close) {
            Some(end) => rest = &rest[at + 2 + end + 2..],
            // A tag over several lines: nothing after it on this one is literal.
            None => break,
        }
    }
    let literal: usize = pieces.iter().map(|p| p.trim().len()).sum();
    if literal < 4 {
        return false;
    }
    let line = line.trim();
    let (first, last) = (pieces[0].trim_start(), pieces[pieces.len() - 1].trim_end());
    if pieces.len() == 1 {
        return line == first.trim_end();
    }
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    for piece in &pieces[1..pieces.len() - 1] {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The objects behind proxy `name`: a backend's Service and the Ingresses or TCP objects
/// routing to it, a TCP frontend's TCP object; in a shared frontend, the backends and route
/// policies the refused line names.
fn owners_of_proxy(
    name: &str,
    line: Option<&str>,
    model: &Model,
    store: &Store,
) -> BTreeSet<ObjectRef> {
    let mut out = BTreeSet::new();
    if let Some(b) = model.backends.iter().find(|b| b.name == name) {
        out.extend(owners_of_backend(b, store, false));
        return out;
    }
    if let Some(b) = model.tcp_backends.iter().find(|b| b.name == name) {
        out.extend(owners_of_backend(b, store, true));
        return out;
    }
    if let Some(frontend) = name.strip_prefix("tcp_") {
        if model.tcp.iter().any(|t| t.frontend == name) {
            out.extend(tcp_objects_with_frontend(frontend, store));
            return out;
        }
    }
    // A shared frontend: only what the line itself names.
    let Some(line) = line else {
        return out;
    };
    for word in line.split(|c: char| !(c.is_ascii_alphanumeric() || "_-.:".contains(c))) {
        for b in model.backends.iter() {
            if b.name == word || b.policies.iter().any(|p| p.id == word) {
                out.extend(owners_of_backend(b, store, false));
            }
        }
    }
    out
}

/// A backend's Service, and the Ingresses (HTTP) or TCP objects routing to it. A standalone
/// backend (`<namespace>_<ingress>_svc_<service>_<port>`) belongs to its one Ingress.
fn owners_of_backend(b: &Backend, store: &Store, tcp: bool) -> Vec<ObjectRef> {
    let mut out = Vec::new();
    let service = Key::new(b.namespace.clone(), b.service.clone());
    if store.service(&service).is_some() {
        out.push(ObjectRef::new(Kind::Service, &service));
    }
    if tcp {
        for (key, t) in store.tcps() {
            let names = |s: &crate::objects::TcpService| {
                std::iter::once(&s.service)
                    .chain(&s.services)
                    .any(|t| t.name == b.service)
            };
            if key.namespace == b.namespace && t.spec.iter().any(names) {
                out.push(ObjectRef::new(Kind::Tcp, key));
            }
        }
        return out;
    }
    let standalone = b
        .name
        .strip_prefix(&format!("{}_", b.namespace))
        .and_then(|rest| rest.split_once("_svc_"))
        .map(|(ingress, _)| ingress.replace(':', "."));
    for (key, ingress) in store.ingresses() {
        if key.namespace != b.namespace {
            continue;
        }
        if let Some(own) = &standalone {
            if &key.name != own {
                continue;
            }
        }
        if ingress_services(ingress).any(|s| s == b.service) {
            out.push(ObjectRef::new(Kind::Ingress, key));
        }
    }
    out
}

/// Every Service name an Ingress routes to (rules and default backend).
fn ingress_services(
    ingress: &k8s_openapi::api::networking::v1::Ingress,
) -> impl Iterator<Item = &str> {
    let spec = ingress.spec.as_ref();
    let rules = spec
        .and_then(|s| s.rules.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|r| r.http.as_ref())
        .flat_map(|h| h.paths.iter())
        .filter_map(|p| p.backend.service.as_ref());
    let default = spec
        .and_then(|s| s.default_backend.as_ref())
        .and_then(|d| d.service.as_ref());
    rules.chain(default).map(|s| s.name.as_str())
}

fn tcp_objects_with_frontend(frontend: &str, store: &Store) -> Vec<ObjectRef> {
    store
        .tcps()
        .filter(|(_, t)| t.spec.iter().any(|s| s.frontend.name == frontend))
        .map(|(key, _)| ObjectRef::new(Kind::Tcp, key))
        .collect()
}

/// The TCP objects with a bind on `addr:port` (a wildcard bind of either side overlaps).
fn owners_of_bind(addr: &str, port: u16, model: &Model, store: &Store) -> Vec<ObjectRef> {
    // HAProxy names the address as it was written (`[::]`, `*`, empty for every address).
    let ip = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .ok()
        .filter(|ip| !ip.is_unspecified());
    let mut out = Vec::new();
    for service in &model.tcp {
        let hit = service.binds.iter().any(|b| {
            b.port == port && ip.is_none_or(|ip| b.address == ip || b.address.is_unspecified())
        });
        if hit {
            if let Some(frontend) = service.frontend.strip_prefix("tcp_") {
                out.extend(tcp_objects_with_frontend(frontend, store));
            }
        }
    }
    out
}

/// Of several candidates, those whose own words (annotation values, TCP specs) appear on the
/// refused line; all of them when none does or the line is unknown.
fn narrow(
    candidates: BTreeSet<ObjectRef>,
    line: Option<&str>,
    store: &Store,
) -> BTreeSet<ObjectRef> {
    let Some(line) = line else {
        return candidates;
    };
    if candidates.len() < 2 {
        return candidates;
    }
    let named: BTreeSet<ObjectRef> = candidates
        .iter()
        .filter(|c| {
            store
                .get(c.kind, &Key::new(c.namespace.clone(), c.name.clone()))
                .is_some_and(|o| {
                    own_words(&o)
                        .iter()
                        .any(|w| distinctive(w) && line.contains(w.as_str()))
                })
        })
        .cloned()
        .collect();
    if named.is_empty() { candidates } else { named }
}

/// Whether a word of an object's own is telling enough to tie a refused line to it: not a
/// short word, a number or a switch (`true`, `enabled`) that many objects and templates write.
fn distinctive(word: &str) -> bool {
    const COMMON: [&str; 6] = ["true", "false", "enabled", "disabled", "on", "off"];
    word.len() >= 4
        && !word.bytes().all(|b| b.is_ascii_digit())
        && !COMMON.iter().any(|c| word.eq_ignore_ascii_case(c))
}

/// The values an object's author wrote that could reach a line of haproxy.cfg as they are.
fn own_words(object: &Object) -> Vec<String> {
    let mut words: Vec<String> = object
        .metadata()
        .annotations
        .iter()
        .flatten()
        .flat_map(|(_, v)| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect();
    if let Object::Tcp(t) = object {
        for s in &t.spec {
            words.push(s.frontend.name.clone());
        }
    }
    words
}

/// Objects left out of the pipeline because HAProxy refused what they produced, until they
/// change. Owned by the controller; applied to each snapshot before it is translated.
#[derive(Debug, Default)]
pub struct Quarantine {
    held: BTreeMap<ObjectRef, (Object, String)>,
}

impl Quarantine {
    /// Leaves `culprit` out while it stays as `store` holds it now. Returns false when it is
    /// held already or not in `store` (nothing new to leave out).
    pub fn hold(&mut self, culprit: &Culprit, store: &Store) -> bool {
        if self.held.contains_key(&culprit.object) {
            return false;
        }
        let key = Key::new(
            culprit.object.namespace.clone(),
            culprit.object.name.clone(),
        );
        let Some(object) = store.get(culprit.object.kind, &key) else {
            return false;
        };
        self.held
            .insert(culprit.object.clone(), (object, culprit.message.clone()));
        true
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Removes the held objects from `store` while they are unchanged, forgets those that
    /// changed or went away (they get another chance), and returns an error for each object
    /// left out and the objects left out, so a publishing store can hold them again.
    pub fn exclude(&mut self, store: &mut Store) -> (Vec<Diagnostic>, Vec<Object>) {
        let mut diagnostics = Vec::new();
        let mut excluded = Vec::new();
        self.held.retain(|r, (object, message)| {
            let key = Key::new(r.namespace.clone(), r.name.clone());
            if !store.holds_equal(object) {
                return false;
            }
            store.delete(r.kind, &key);
            excluded.push(object.clone());
            diagnostics.push(Diagnostic {
                severity: Severity::Error,
                subject: Subject::Object(r.clone()),
                field: None,
                message: format!(
                    "HAProxy refused the configuration this object produced, so it is left out until it changes: {}",
                    shorten(message, 300)
                ),
            });
            true
        });
        (diagnostics, excluded)
    }
}

/// At most `max` bytes of `text` (on a character boundary), marked when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A template line prints a config line when its literal text surrounds the printed
    /// values in order; tag-only lines and short literals print nothing attributable.
    #[test]
    fn template_lines_are_matched_by_their_literal_text() {
        let prints = template_line_prints;
        assert!(prints(
            "  compression algo {{ site.compression.algo }}",
            "  compression algo gzip-fast"
        ));
        assert!(prints(
            "  compression type{% for t in site.types %} {{ t }}{% endfor +%}",
            "  compression type text/html text/plain"
        ));
        assert!(prints(
            "  http-request deny if {{ applies }} { path -m reg {{ site.deny_path|q }} }",
            "  http-request deny if { var(txn.policy) -m str p1 } { path -m reg '^/a' }"
        ));
        assert!(prints(
            "  option http-buffer-request",
            "  option http-buffer-request"
        ));
        assert!(!prints(
            "  compression algo {{ site.algo }}",
            "  compression type text/html"
        ));
        assert!(!prints("  option http-buffer-request", "  option httplog"));
        assert!(!prints("{% if site.algo is defined %}", "  anything"));
        assert!(!prints("  {{ line }}", "  anything"));
        assert!(!prints(
            "{# a comment that goes on",
            "a comment that goes on"
        ));
    }

    #[test]
    fn pointers_are_read_from_haproxys_own_words() {
        let p = pointer(
            "[ALERT]    (14319) : config : parsing [/tmp/x/haproxy.cfg:12] : error detected in backend 'b1' while parsing 'http-request replace-path' rule",
        );
        assert_eq!(p.line, Some(12));
        assert_eq!(p.proxy.as_deref(), Some("b1"));
        let p = pointer(
            "[ALERT]    (1) : config : [haproxy.cfg:19] : 'server ns_web_80/SRV_1' : unable to stat SSL certificate",
        );
        assert_eq!((p.line, p.proxy.as_deref()), (Some(19), Some("ns_web_80")));
        let p = pointer(
            "[ALERT]    (1) : Starting frontend tcp_db: cannot bind socket (Address already in use) [127.0.0.1:6060]",
        );
        assert_eq!(p.proxy.as_deref(), Some("tcp_db"));
        assert_eq!(p.bind, Some(("127.0.0.1".to_string(), 6060)));
        let p = pointer("[ALERT] (1) : cannot bind socket (Address in use) [::1:443]");
        assert_eq!(p.bind, Some(("::1".to_string(), 443)));
        assert_eq!(
            pointer("[ALERT] (1) : config : Fatal errors found in configuration."),
            Pointer::default()
        );
        // A file named like the configuration but not followed by a line number.
        assert_eq!(pointer("haproxy.cfg: and haproxy.cfg:x]").line, None);
    }
}
