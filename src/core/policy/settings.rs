//! Turning what a hook returned into typed settings.
//!
//! Hooks return Rhai maps. Every key is known, every value is parsed again with the same typed
//! parsers the accessors use: a script that builds a string by hand still cannot put raw
//! config text into the model.

use std::collections::BTreeMap;

use rhai::{Dynamic, Map};

use crate::model::{
    BackendSettings, CookiePersistence, GlobalSettings, HttpCheck, RateLimit, RouteSettings,
    SiteSettings, SiteValue, SourcePersistence, Timeout,
};
use crate::values;
use crate::values::{CHECK_METHODS, CHECK_VERSIONS};

/// Redirect codes `ssl-redirect-code` may use.
pub const REDIRECT_CODES: &[i64] = &[301, 302, 303, 307, 308];

/// What a route hook decides: backend-side settings plus the frontend's redirect choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteOutcome {
    /// Shared: equal outcomes of many routes are one remembered value (`policy::memo`).
    pub settings: std::sync::Arc<RouteSettings>,
    pub ssl_redirect: Option<bool>,
    pub ssl_redirect_code: Option<u16>,
    /// `ssl-redirect-port`: the HTTPS port redirects name; none: the scheme's default (443).
    pub ssl_redirect_port: Option<u16>,
    /// TLS options of the Ingress' TLS hosts (`ssl-min-ver`, `ssl-ciphers`,
    /// `ssl-ciphersuites`), on their crt-list line.
    pub host_tls: Option<crate::model::HostTls>,
    /// `route-acl` (read from the Service): the route is a canary route, taken only when this
    /// condition holds.
    pub route_acl: Option<crate::model::AclCondition>,
    /// `standalone-backend`: the route gets a backend of its own Ingress instead of the
    /// Service port's shared one.
    pub standalone_backend: Option<bool>,
    /// `ssl-passthrough`: the route's host passes TLS through to the Service's pods (by SNI).
    pub ssl_passthrough: Option<bool>,
}

/// `http-connection-mode` values, as HAProxy's `option` names them.
pub const HTTP_CONNECTION_MODES: &[&str] = &["http-keep-alive", "httpclose", "http-server-close"];

/// `syslog_servers`: an array of maps as `ctx.syslog_servers` returns them; each is put back
/// into the `syslog-server` syntax and parsed again.
fn syslog_servers(v: &Dynamic) -> Result<Vec<crate::model::SyslogServer>, String> {
    let mut lines = Vec::new();
    for item in array(v)? {
        let map = item
            .try_cast::<Map>()
            .ok_or_else(|| "expected an array of maps #{address, facility, ...}".to_string())?;
        let mut params = Vec::new();
        for (k, val) in &map {
            if val.is_unit() {
                continue;
            }
            let text = if val.is_int() {
                val.as_int().unwrap_or_default().to_string()
            } else {
                string(val)?
            };
            if text.contains([',', '\n']) {
                return Err(format!("{k}: {text:?} contains ',' or a line break"));
            }
            params.push(format!("{k}:{text}"));
        }
        lines.push(params.join(", "));
    }
    super::global_keys::parse_syslog_servers(&lines.join("\n"))
}

/// A problem with one returned key: the key, what is wrong, and whether the value still
/// applied (a warning) or not (an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub key: String,
    pub message: String,
    pub warning: bool,
}

impl KeyError {
    fn error(key: &str, message: String) -> Self {
        Self {
            key: key.to_string(),
            message,
            warning: false,
        }
    }
}

/// Which script set each site setting of one object, so that a second script setting the same
/// key to another value is reported (the later one applies, as for every other key).
#[derive(Debug, Default)]
pub struct SiteOwners(BTreeMap<String, String>);

/// The most keys in one object's site settings, and in one map or list inside them.
pub const MAX_SITE_KEYS: usize = 64;
/// The deepest nesting of lists and maps inside a site setting (a list of maps is 2).
pub const MAX_SITE_DEPTH: usize = 4;
/// The longest string in a site setting, in bytes: HAProxy reads lines of at most 2 KiB.
pub const MAX_SITE_STRING: usize = 1024;
/// The most bytes of strings in one object's site settings altogether.
pub const MAX_SITE_BYTES: usize = 16 * 1024;

/// `site: #{...}`: the site settings a script returned, checked and merged into `out` key by
/// key. A key another script set to a different value is reported as a warning and this
/// script's value applies; a bad key or value is an error and that key alone is dropped.
fn apply_site(
    value: &Dynamic,
    script: &str,
    out: &mut SiteSettings,
    owners: &mut SiteOwners,
    errors: &mut Vec<KeyError>,
) {
    let Some(map) = value.read_lock::<Map>() else {
        errors.push(KeyError::error(
            "site",
            format!(
                "expected a map #{{ name: value, ... }}, got {}",
                value.type_name()
            ),
        ));
        return;
    };
    let mut bytes = out.values().map(site_bytes).sum::<usize>();
    for (key, value) in map.iter() {
        let key = key.as_str();
        let field = format!("site.{key}");
        if value.is_unit() {
            // `()` unsets what an earlier script set.
            if let Some(old) = out.remove(key) {
                bytes -= site_bytes(&old);
            }
            owners.0.remove(key);
            continue;
        }
        let checked = site_key(key).and_then(|()| site_value(value, 1));
        let checked = checked.and_then(|v| {
            let previous = out.get(key).map_or(0, site_bytes);
            let total = bytes - previous + site_bytes(&v);
            if total > MAX_SITE_BYTES {
                Err(format!(
                    "the site settings of this object would hold {total} bytes of text; at most {MAX_SITE_BYTES}"
                ))
            } else if !out.contains_key(key) && out.len() >= MAX_SITE_KEYS {
                Err(format!("more than {MAX_SITE_KEYS} site settings"))
            } else {
                bytes = total;
                Ok(v)
            }
        });
        match checked {
            Ok(v) => {
                if let Some(earlier) = owners.0.get(key) {
                    if out.get(key) != Some(&v) && earlier != script {
                        errors.push(KeyError {
                            key: field,
                            message: format!(
                                "also set by {earlier} to another value; this script's value applies (scripts apply in name order)"
                            ),
                            warning: true,
                        });
                    }
                }
                owners.0.insert(key.to_string(), script.to_string());
                out.insert(key.to_string(), v);
            }
            Err(e) => errors.push(KeyError::error(&field, e)),
        }
    }
}

/// A site setting name, also the name of each map key inside one: a lowercase letter, then
/// lowercase letters, digits and `_`, at most 64 characters (`site.maintenance_body` in a
/// template).
fn site_key(key: &str) -> Result<(), String> {
    let ok = key.len() <= 64
        && key.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} is not a site setting name (a lowercase letter, then lowercase letters, digits and _, at most 64)",
            crate::diagnostics::quoted(key)
        ))
    }
}

/// A site value at nesting `depth` (1 for the value of a top-level key).
fn site_value(v: &Dynamic, depth: usize) -> Result<SiteValue, String> {
    if let Ok(b) = v.as_bool() {
        return Ok(SiteValue::Bool(b));
    }
    if let Ok(n) = v.as_int() {
        return Ok(SiteValue::Int(n));
    }
    if v.is_string() {
        return site_string(&v.clone().into_string().unwrap_or_default());
    }
    let nested = |what: &str| {
        if depth >= MAX_SITE_DEPTH {
            Err(format!(
                "{what} nested deeper than {MAX_SITE_DEPTH} levels of lists and maps"
            ))
        } else {
            Ok(())
        }
    };
    if v.is_array() {
        nested("a list")?;
        let items = v.clone().into_array().unwrap_or_default();
        if items.len() > MAX_SITE_KEYS {
            return Err(format!(
                "a list of {} elements; at most {MAX_SITE_KEYS}",
                items.len()
            ));
        }
        return items
            .iter()
            .enumerate()
            .map(|(i, item)| site_value(item, depth + 1).map_err(|e| format!("[{i}]: {e}")))
            .collect::<Result<_, _>>()
            .map(SiteValue::List);
    }
    if v.is_map() {
        nested("a map")?;
        let map = v.clone().cast::<Map>();
        if map.len() > MAX_SITE_KEYS {
            return Err(format!(
                "a map of {} keys; at most {MAX_SITE_KEYS}",
                map.len()
            ));
        }
        let mut out = BTreeMap::new();
        for (key, item) in &map {
            site_key(key)?;
            let value = site_value(item, depth + 1).map_err(|e| format!("{key}: {e}"))?;
            out.insert(key.to_string(), value);
        }
        return Ok(SiteValue::Map(out));
    }
    Err(format!(
        "expected a bool, an integer, a string, an array or a map, got {}",
        v.type_name()
    ))
}

/// A string of a site setting: a token when the output guard would print it as it is, text
/// otherwise; text must be quotable (no `'`, no control character).
pub fn site_string(s: &str) -> Result<SiteValue, String> {
    let shown = || crate::diagnostics::quoted(s);
    if s.is_empty() {
        return Err("an empty string (leave the key out, or return ())".to_string());
    }
    if s.len() > MAX_SITE_STRING {
        return Err(format!(
            "a string of {} bytes; at most {MAX_SITE_STRING}",
            s.len()
        ));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!("{} contains the control character {c:?}", shown()));
    }
    if crate::render::formatter::is_token(s) {
        return Ok(SiteValue::Token(s.to_string()));
    }
    if s.contains('\'') {
        return Err(format!(
            "{} is text (not a single token) and contains ', so it cannot be quoted",
            shown()
        ));
    }
    Ok(SiteValue::Text(s.to_string()))
}

/// The bytes of text in a site value.
fn site_bytes(v: &SiteValue) -> usize {
    match v {
        SiteValue::Bool(_) | SiteValue::Int(_) => 0,
        SiteValue::Token(s) | SiteValue::Text(s) => s.len(),
        SiteValue::List(items) => items.iter().map(site_bytes).sum(),
        SiteValue::Map(map) => map.iter().map(|(k, v)| k.len() + site_bytes(v)).sum(),
    }
}

pub fn apply_global(
    map: &Map,
    out: &mut GlobalSettings,
    script: &str,
    owners: &mut SiteOwners,
) -> Vec<KeyError> {
    let mut errors = Vec::new();
    for (key, value) in map {
        let key = key.as_str();
        let result = match key {
            "site" => {
                apply_site(value, script, &mut out.site, owners, &mut errors);
                Ok(())
            }
            "config_snippet" => snippet(value).map(|s| out.config_snippet = s),
            "frontend_snippet" => snippet(value).map(|s| out.frontend_snippet = s),
            "client_ca" => secret(value).map(|s| out.tls.client_ca = Some(s)),
            "client_ca_invalid" => boolean(value).map(|b| out.tls.client_ca_invalid |= b),
            "client_crt_optional" => boolean(value).map(|b| out.tls.client_crt_optional = b),
            "tls_alpn" => alpn(value).map(|a| out.tls.alpn = Some(a)),
            "client_strict_sni" => boolean(value).map(|b| out.tls.strict_sni = b),
            "ssl_certificate" => secret(value).map(|s| out.tls.ssl_certificate = Some(s)),
            "maxconn" => int(value, 1, 10_000_000).map(|n| out.maxconn = Some(n as u32)),
            "nbthread" => int(value, 1, 4096).map(|n| out.nbthread = Some(n as u32)),
            "hard_stop_after" => duration_ms(value).map(|ms| out.hard_stop_after_ms = Some(ms)),
            "syslog_servers" => syslog_servers(value).map(|s| out.syslog_servers = s),
            "log_format" => string(value)
                .and_then(|f| super::global_keys::parse_log_format(&f))
                .map(|f| out.log_format = Some(f)),
            "log_format_tcp" => string(value)
                .and_then(|f| super::global_keys::parse_log_format(&f))
                .map(|f| out.log_format_tcp = Some(f)),
            "dontlognull" => boolean(value).map(|b| out.dontlognull = Some(b)),
            "logasap" => boolean(value).map(|b| out.logasap = Some(b)),
            "dontlog_normal" => boolean(value).map(|b| out.dontlog_normal = Some(b)),
            "http_connection_mode" => string(value)
                .and_then(|m| values::parse_enum(&m, HTTP_CONNECTION_MODES))
                .map(|m| out.http_connection_mode = Some(m)),
            "proxy_protocol" => cidrs(value).map(|c| out.proxy_protocol = c),
            "ssl_bind_options" => string(value)
                .and_then(|o| super::global_keys::parse_tls_bind_options(&o))
                .map(|o| out.ssl_bind_options = o),
            "ssl_ciphers" => string(value)
                .and_then(|c| super::global_keys::parse_cipher_list(&c))
                .map(|c| out.ssl_ciphers = Some(c)),
            "ssl_ciphersuites" => string(value)
                .and_then(|c| super::global_keys::parse_ciphersuites(&c))
                .map(|c| out.ssl_ciphersuites = Some(c)),
            _ => match Timeout::from_setting_key(key) {
                Some(timeout) => duration_ms(value).map(|ms| {
                    out.timeouts.insert(timeout, ms);
                }),
                None => Err(unknown_key(key, "global")),
            },
        };
        if let Err(e) = result {
            errors.push(KeyError::error(key, e));
        }
    }
    errors
}

pub fn apply_backend(
    map: &Map,
    out: &mut BackendSettings,
    script: &str,
    owners: &mut SiteOwners,
) -> Vec<KeyError> {
    let mut errors = Vec::new();
    for (key, value) in map {
        let key = key.as_str();
        let result = match key {
            "site" => {
                apply_site(value, script, &mut out.site, owners, &mut errors);
                Ok(())
            }
            "balance" => string(value)
                .and_then(|s| values::parse_balance(&s))
                .map(|b| {
                    out.balance = b.split(' ').map(str::to_string).collect();
                    out.hash_consistent = values::is_hash_balance(&out.balance);
                }),
            "check" => boolean(value).map(|b| out.check = b),
            "check_http" => http_check(value).map(|c| out.check_http = Some(c)),
            "check_interval" => duration_ms(value).map(|ms| out.check_interval_ms = Some(ms)),
            "maxconn" => int(value, 1, 1_000_000).map(|n| out.maxconn = Some(n as u32)),
            "server_ssl" => boolean(value).map(|b| out.server_ssl = b),
            "server_proto" => string(value)
                .and_then(|s| values::parse_enum(&s, &["h1", "h2"]))
                .map(|p| out.server_proto = (p == "h2").then_some(p)),
            "forwarded_for" => boolean(value).map(|b| out.forwarded_for = b),
            "abortonclose" => boolean(value).map(|b| out.abortonclose = b),
            "slots_block" => int(value, 1, 1000).map(|n| {
                out.slots_block = n as u32;
                out.server_slots = true;
            }),
            "config_snippet" => snippet(value).map(|s| out.config_snippet = s),
            "source_ip_persistence" => {
                source_persistence(value).map(|p| out.source_persistence = Some(p))
            }
            "cookie_persistence" => {
                cookie_persistence(value).map(|c| out.cookie_persistence = Some(c))
            }
            "send_proxy" => string(value)
                .and_then(|s| values::parse_send_proxy(&s))
                .map(|k| out.send_proxy = Some(k)),
            "server_ca" => secret(value).map(|s| out.server_ca = Some(s)),
            "server_crt" => secret(value).map(|s| out.server_crt = Some(s)),
            // Only ever switched on: one script's bad value is not undone by another's.
            "server_tls_unusable" => boolean(value).map(|b| out.server_tls_unusable |= b),
            _ => match Timeout::from_setting_key(key).filter(|t| t.in_backend()) {
                Some(timeout) => duration_ms(value).map(|ms| {
                    out.timeouts.insert(timeout, ms);
                }),
                None => Err(unknown_key(key, "backend")),
            },
        };
        if let Err(e) = result {
            errors.push(KeyError::error(key, e));
        }
    }
    errors
}

pub fn apply_route(
    map: &Map,
    out: &mut RouteOutcome,
    script: &str,
    owners: &mut SiteOwners,
) -> Vec<KeyError> {
    let mut errors = Vec::new();
    for (key, value) in map {
        let key = key.as_str();
        let s = std::sync::Arc::make_mut(&mut out.settings);
        let result = match key {
            "site" => {
                apply_site(value, script, &mut s.site, owners, &mut errors);
                Ok(())
            }
            "set_host" => string(value)
                .and_then(|h| values::parse_host_header(&h))
                .map(|h| s.set_host = Some(h)),
            "request_headers" => {
                headers(value, values::Direction::Request).map(|h| s.request_headers = h)
            }
            "response_headers" => {
                headers(value, values::Direction::Response).map(|h| s.response_headers = h)
            }
            "path_rewrite" => rewrites(value).map(|mut rules| {
                s.path_rewrite = (!rules.is_empty()).then(|| rules.remove(0));
                s.more_path_rewrites = rules;
            }),
            "allow_list" => access_list(value).map(|a| (s.allow_list, s.allow_file) = a),
            "deny_list" => access_list(value).map(|a| (s.deny_list, s.deny_file) = a),
            "deny_all" => deny_all(value).map(|d| s.deny_all = Some(d)),
            "basic_auth" => basic_auth(value).map(|a| s.basic_auth = Some(a)),
            "cors" => cors(value).map(|c| s.cors = Some(c)),
            "hsts" => hsts(value).map(|h| s.hsts = Some(h)),
            "rate_limit" => rate_limit(value).map(|r| s.rate_limit = Some(r)),
            "src_ip_header" => string(value)
                .and_then(|h| values::parse_header_name(&h))
                .map(|h| s.src_ip_header = Some(h)),
            "request_redirect" => request_redirect(value).map(|r| s.redirect = Some(r)),
            "request_capture" => request_capture(value).map(|c| s.capture = Some(c)),
            "route_acl" => string(value)
                .and_then(|c| values::parse_route_acl(&c))
                .map(|c| out.route_acl = Some(c)),
            "standalone_backend" => boolean(value).map(|b| out.standalone_backend = Some(b)),
            "ssl_passthrough" => boolean(value).map(|b| out.ssl_passthrough = Some(b)),
            "ssl_redirect" => boolean(value).map(|b| out.ssl_redirect = Some(b)),
            "tls_min_version" => string(value)
                .and_then(|v| super::global_keys::parse_tls_version(&v))
                .map(|v| {
                    out.host_tls
                        .get_or_insert_with(Default::default)
                        .min_version = Some(v);
                }),
            "tls_ciphers" => string(value)
                .and_then(|c| super::global_keys::parse_cipher_list(&c))
                .map(|c| out.host_tls.get_or_insert_with(Default::default).ciphers = Some(c)),
            "tls_ciphersuites" => string(value)
                .and_then(|c| super::global_keys::parse_ciphersuites(&c))
                .map(|c| {
                    out.host_tls
                        .get_or_insert_with(Default::default)
                        .ciphersuites = Some(c);
                }),
            // 443 is what `https://` means without a port: the plain scheme redirect.
            "ssl_redirect_port" => int(value, 1, 65535)
                .map(|p| out.ssl_redirect_port = Some(p as u16).filter(|p| *p != 443)),
            "ssl_redirect_code" => int(value, 300, 399).and_then(|c| {
                if REDIRECT_CODES.contains(&c) {
                    out.ssl_redirect_code = Some(c as u16);
                    Ok(())
                } else {
                    Err(format!("{c} is not one of 301, 302, 303, 307, 308"))
                }
            }),
            _ => Err(unknown_key(key, "route")),
        };
        if let Err(e) = result {
            errors.push(KeyError::error(key, e));
        }
    }
    errors
}

/// A Secret as `ctx.secret_ref` returns it: `"namespace/name"`.
fn secret(v: &Dynamic) -> Result<String, String> {
    let text = string(v)?;
    match values::parse_secret_ref(&text)? {
        (Some(ns), name) => Ok(format!("{ns}/{name}")),
        (None, _) => Err(format!("{text:?} must be namespace/name")),
    }
}

/// ALPN protocol names, an array as `ctx.alpn` returns it.
fn alpn(v: &Dynamic) -> Result<Vec<String>, String> {
    let items = array(v)?
        .iter()
        .map(string)
        .collect::<Result<Vec<_>, _>>()?;
    values::parse_alpn(&items.join(","))
}

fn unknown_key(key: &str, hook: &str) -> String {
    format!("{key:?} is not a {hook} setting (see docs/scripting.md)")
}

fn boolean(v: &Dynamic) -> Result<bool, String> {
    v.as_bool()
        .map_err(|t| format!("expected a boolean, got {t}"))
}

fn int(v: &Dynamic, min: i64, max: i64) -> Result<i64, String> {
    let n = v
        .as_int()
        .map_err(|t| format!("expected an integer, got {t}"))?;
    if n < min || n > max {
        return Err(format!("{n} is outside {min}..{max}"));
    }
    Ok(n)
}

fn duration_ms(v: &Dynamic) -> Result<u64, String> {
    int(v, 0, values::MAX_DURATION_MS as i64).map(|n| n as u64)
}

fn string(v: &Dynamic) -> Result<String, String> {
    v.clone()
        .into_string()
        .map_err(|t| format!("expected a string, got {t}"))
}

fn array(v: &Dynamic) -> Result<rhai::Array, String> {
    v.clone()
        .into_array()
        .map_err(|t| format!("expected an array, got {t}"))
}

fn pair(v: &Dynamic) -> Result<(String, String), String> {
    match array(v)?.as_slice() {
        [a, b] => Ok((string(a)?, string(b)?)),
        _ => Err("expected a two-element array".to_string()),
    }
}

/// `[name, value]` pairs, each value a header value in format form (see
/// [`values::check_header_format`]) whose samples are available in `direction`.
fn headers(v: &Dynamic, direction: values::Direction) -> Result<Vec<(String, String)>, String> {
    array(v)?
        .iter()
        .map(|item| {
            let (n, val) = pair(item)?;
            values::check_header_format_for(&val, Some(direction))
                .map_err(|e| format!("{}: {e}", crate::diagnostics::quoted(&val)))?;
            Ok((values::parse_header_name(&n)?, val))
        })
        .collect()
}

/// `[regex, replacement]`, or an array of them (applied in order; at most
/// [`values::MAX_REWRITES`]).
fn rewrites(v: &Dynamic) -> Result<Vec<(String, String)>, String> {
    let items = array(v)?;
    let rules = if items.first().is_some_and(|i| i.is_string()) {
        vec![pair(v)?]
    } else {
        items.iter().map(pair).collect::<Result<Vec<_>, _>>()?
    };
    if rules.is_empty() || rules.len() > values::MAX_REWRITES {
        return Err(format!("expected 1 to {} rules", values::MAX_REWRITES));
    }
    rules
        .into_iter()
        .map(|(re, repl)| Ok((values::parse_regex(&re)?, values::parse_replacement(&repl)?)))
        .collect()
}

fn cidrs(v: &Dynamic) -> Result<Vec<String>, String> {
    let items = array(v)?
        .iter()
        .map(string)
        .collect::<Result<Vec<_>, _>>()?;
    values::parse_cidr_list(&items.join(","))
}

/// Addresses and blocks, or the one pattern file `patterns/<key>` (as `ctx.access_list`
/// returns them): the list, or the file's path.
fn access_list(v: &Dynamic) -> Result<(Vec<String>, Option<String>), String> {
    let items = array(v)?
        .iter()
        .map(string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match values::parse_access_list(&items.join(","))? {
        values::AccessList::Addresses(list) => (list, None),
        values::AccessList::File(key) => (Vec::new(), Some(values::pattern_path(&key))),
    })
}

/// `#{size: <entries>, expire: <ms>}`.
fn source_persistence(v: &Dynamic) -> Result<SourcePersistence, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{size, expire}".to_string())?;
    let size = map
        .get("size")
        .ok_or_else(|| "missing \"size\"".to_string())
        .and_then(|s| int(s, 1, values::MAX_TABLE_ENTRIES as i64))?;
    let expire_ms = map
        .get("expire")
        .ok_or_else(|| "missing \"expire\"".to_string())
        .and_then(duration_ms)?;
    Ok(SourcePersistence {
        size: size_text(size as u64),
        expire_ms,
    })
}

/// `#{name: <cookie name>, dynamic: <bool>}`. The dynamic key is not the script's business:
/// translation adds it from `--dynamic-cookie-key-secret`.
fn cookie_persistence(v: &Dynamic) -> Result<CookiePersistence, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{name, dynamic}".to_string())?;
    let name = map
        .get("name")
        .ok_or_else(|| "missing \"name\"".to_string())
        .and_then(string)
        .and_then(|n| values::parse_cookie_name(&n))?;
    let dynamic = map
        .get("dynamic")
        .ok_or_else(|| "missing \"dynamic\"".to_string())
        .and_then(boolean)?;
    Ok(CookiePersistence {
        name,
        dynamic,
        key: None,
    })
}

/// `#{requests, period, size, status, whitelist}`: requests per period (milliseconds) per
/// client address, the table size in entries, the refusal's status code and the addresses
/// never limited (possibly empty).
fn rate_limit(v: &Dynamic) -> Result<RateLimit, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{requests, period, size, status, whitelist}".to_string())?;
    let field = |k: &str| map.get(k).ok_or_else(|| format!("missing {k:?}"));
    let requests = int(field("requests")?, 1, i64::from(i32::MAX))?;
    let period_ms = int(field("period")?, 1, values::MAX_DURATION_MS as i64)?;
    let size = int(field("size")?, 1, values::MAX_TABLE_ENTRIES as i64)?;
    let status = deny_status(int(field("status")?, 100, 599)?)?;
    let whitelist = field("whitelist")?;
    let (whitelist, whitelist_file) = if array(whitelist)?.is_empty() {
        (Vec::new(), None)
    } else {
        access_list(whitelist)?
    };
    Ok(RateLimit {
        requests: requests as u64,
        period_ms: period_ms as u64,
        size: size_text(size as u64),
        status,
        whitelist,
        whitelist_file,
    })
}

/// `#{status, because}`: every request of the route refused with `status` (one HAProxy can
/// refuse with), because of the bad values of the settings named in `because` (an array of
/// setting names).
fn deny_all(v: &Dynamic) -> Result<crate::model::DenyAll, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{status, because}".to_string())?;
    let field = |k: &str| map.get(k).ok_or_else(|| format!("missing {k:?}"));
    let status = deny_status(int(field("status")?, 100, 599)?)?;
    let because = array(field("because")?)?
        .iter()
        .map(|name| {
            let name = string(name)?;
            let plain = !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if plain {
                Ok(name)
            } else {
                Err(format!(
                    "because: {:?} is not a setting name (lowercase letters, digits, -)",
                    name.chars().take(64).collect::<String>()
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if because.is_empty() {
        return Err("because: name the setting whose value refuses the route".to_string());
    }
    Ok(crate::model::DenyAll { status, because })
}

/// A status code HAProxy can refuse with.
fn deny_status(status: i64) -> Result<u16, String> {
    if !values::DENY_STATUS_CODES.contains(&status) {
        return Err(format!(
            "status {status} is not one HAProxy can refuse with ({})",
            values::DENY_STATUS_CODES
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(status as u16)
}

/// `#{secret: "namespace/name" or (), realm}`: basic authentication against the users of a
/// Secret (resolved by translation); without a secret nobody can log in.
fn basic_auth(v: &Dynamic) -> Result<crate::model::BasicAuth, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{secret, realm}".to_string())?;
    let realm = map
        .get("realm")
        .ok_or_else(|| "missing \"realm\"".to_string())
        .and_then(string)
        .and_then(|r| values::parse_header_value(&r))?;
    let secret = match map.get("secret") {
        None => None,
        Some(s) if s.is_unit() => None,
        Some(s) => {
            let text = string(s)?;
            match values::parse_secret_ref(&text)? {
                (Some(ns), name) => Some((ns, name)),
                (None, _) => return Err(format!("{text:?} must be namespace/name")),
            }
        }
    };
    Ok(crate::model::BasicAuth {
        userlist: secret.as_ref().map_or_else(
            || crate::model::NOBODY_USERLIST.to_string(),
            |(ns, name)| format!("auth_{ns}_{name}"),
        ),
        secret: secret.map(|(ns, name)| format!("{ns}/{name}")),
        realm,
    })
}

/// `#{allow_origin, allow_methods, allow_headers, allow_credentials, max_age, respond_to_options}`
/// (`max_age` in seconds).
fn cors(v: &Dynamic) -> Result<crate::model::Cors, String> {
    let map = v.clone().try_cast::<Map>().ok_or_else(|| {
        "expected a map #{allow_origin, allow_methods, allow_headers, allow_credentials, max_age, respond_to_options}"
            .to_string()
    })?;
    let field = |k: &str| map.get(k).ok_or_else(|| format!("missing {k:?}"));
    Ok(crate::model::Cors {
        allow_origin: values::parse_cors_origin(&string(field("allow_origin")?)?)?,
        allow_methods: values::parse_http_methods(&string(field("allow_methods")?)?)?,
        allow_headers: values::parse_header_name_list(&string(field("allow_headers")?)?)?,
        allow_credentials: boolean(field("allow_credentials")?)?,
        max_age: int(field("max_age")?, 0, values::MAX_DURATION_MS as i64 / 1000)? as u64,
        respond_to_options: boolean(field("respond_to_options")?)?,
    })
}

/// `#{max_age, include_subdomains, preload}` (`max_age` in seconds).
fn hsts(v: &Dynamic) -> Result<crate::model::Hsts, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{max_age, include_subdomains, preload}".to_string())?;
    let field = |k: &str| map.get(k).ok_or_else(|| format!("missing {k:?}"));
    Ok(crate::model::Hsts {
        max_age: int(field("max_age")?, 0, HSTS_MAX_AGE)? as u64,
        include_subdomains: boolean(field("include_subdomains")?)?,
        preload: boolean(field("preload")?)?,
    })
}

/// The longest `hsts-max-age`: two years, in seconds.
pub const HSTS_MAX_AGE: i64 = 63_072_000;

/// `#{to: <target>, code: <301|302|303|307|308>}` (`code` optional: 302).
fn request_redirect(v: &Dynamic) -> Result<crate::model::Redirect, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{to, code}".to_string())?;
    let to = map
        .get("to")
        .ok_or_else(|| "missing \"to\"".to_string())
        .and_then(string)?;
    let (scheme, host) = values::parse_redirect_target(&to)?;
    let code = match map.get("code") {
        None => 302,
        Some(c) => {
            let c = int(c, 300, 399)?;
            if !REDIRECT_CODES.contains(&c) {
                return Err(format!("code {c} is not one of 301, 302, 303, 307, 308"));
            }
            c as u16
        }
    };
    Ok(crate::model::Redirect {
        scheme,
        host,
        code,
        path: None,
        port: None,
    })
}

/// The default length of a capture slot (`request-capture-len`).
pub const CAPTURE_LEN: i64 = 128;
/// The longest capture slot.
pub const MAX_CAPTURE_LEN: i64 = 8192;

/// `#{samples: [<sample expression>, ...], len: <1..8192>}` (`len` optional: 128).
fn request_capture(v: &Dynamic) -> Result<crate::model::RequestCapture, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{samples, len}".to_string())?;
    let samples = array(
        map.get("samples")
            .ok_or_else(|| "missing \"samples\"".to_string())?,
    )?
    .iter()
    .map(string)
    .collect::<Result<Vec<_>, _>>()?;
    let samples = values::parse_capture_samples(&samples.join("\n"))?;
    let len = match map.get("len") {
        None => CAPTURE_LEN,
        Some(n) => int(n, 1, MAX_CAPTURE_LEN)?,
    };
    Ok(crate::model::RequestCapture {
        samples,
        len: len as u32,
    })
}

/// A size as HAProxy writes it: `1m` for 1048576, `100k` for 102400, else the number.
fn size_text(n: u64) -> String {
    if n.is_multiple_of(1 << 30) {
        format!("{}g", n >> 30)
    } else if n.is_multiple_of(1 << 20) {
        format!("{}m", n >> 20)
    } else if n.is_multiple_of(1 << 10) {
        format!("{}k", n >> 10)
    } else {
        n.to_string()
    }
}

fn http_check(v: &Dynamic) -> Result<HttpCheck, String> {
    let map = v
        .clone()
        .try_cast::<Map>()
        .ok_or_else(|| "expected a map #{method, uri}".to_string())?;
    let field = |k: &str| {
        map.get(k)
            .ok_or_else(|| format!("missing {k:?}"))
            .and_then(string)
    };
    let version = match map.get("version") {
        None => None,
        Some(v) => Some(values::parse_enum(&string(v)?, CHECK_VERSIONS)?),
    };
    let headers = match map.get("headers") {
        None => Vec::new(),
        Some(v) => array(v)?
            .iter()
            .map(|item| {
                let (n, val) = pair(item)?;
                Ok((
                    values::parse_header_name(&n)?,
                    values::parse_header_value(&val)?,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?,
    };
    Ok(HttpCheck {
        method: values::parse_enum(&field("method")?, CHECK_METHODS)?,
        uri: values::parse_path(&field("uri")?)?,
        version,
        headers,
    })
}

/// Only a value made by `ctx.snippet(..)` is a snippet: a string from a script is refused, so
/// no script can write raw config past the snippet policy.
fn snippet(value: &Dynamic) -> Result<Vec<String>, String> {
    value
        .clone()
        .try_cast::<super::context::Snippet>()
        .map(|s| s.0)
        .ok_or_else(|| {
            format!(
                "expected a snippet from ctx.snippet(..), got a {}",
                value.type_name()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returned_strings_are_parsed_again() {
        let mut map = Map::new();
        map.insert("balance".into(), "roundrobin\n  lua-load /x".into());
        map.insert("check".into(), true.into());
        map.insert("nonsense".into(), 1.into());
        let mut out = BackendSettings::default();
        let errors = apply_backend(&map, &mut out, "t.rhai", &mut SiteOwners::default());
        assert!(out.balance.is_empty());
        assert!(out.check);
        let keys: Vec<_> = errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["balance", "nonsense"]);
    }

    #[test]
    fn global_keys_are_parsed_again() {
        let server = |facility: &str| {
            let mut m = Map::new();
            m.insert("address".into(), "10.0.0.1".into());
            m.insert("port".into(), 514.into());
            m.insert("facility".into(), facility.into());
            m.insert("level".into(), Dynamic::UNIT);
            Dynamic::from_array(vec![Dynamic::from_map(m)])
        };
        let mut map = Map::new();
        map.insert("syslog_servers".into(), server("local3"));
        map.insert("log_format".into(), "%ci %[src".into());
        map.insert("http_connection_mode".into(), "keep-alive-please".into());
        map.insert(
            "proxy_protocol".into(),
            Dynamic::from_array(vec!["10.0.0.0/8".into()]),
        );
        map.insert("maxconn".into(), 0.into());
        let mut out = GlobalSettings::default();
        let mut keys: Vec<String> =
            apply_global(&map, &mut out, "t.rhai", &mut SiteOwners::default())
                .into_iter()
                .map(|e| e.key)
                .collect();
        keys.sort();
        assert_eq!(keys, ["http_connection_mode", "log_format", "maxconn"]);
        assert_eq!(out.syslog_servers[0].facility, "local3");
        assert_eq!(out.syslog_servers[0].port, Some(514));
        assert_eq!(out.proxy_protocol, ["10.0.0.0/8"]);
        for smuggled in ["local0\n  lua-load /x", "local0, address:1.2.3.4"] {
            let mut map = Map::new();
            map.insert("syslog_servers".into(), server(smuggled));
            let mut out = GlobalSettings::default();
            assert_eq!(
                apply_global(&map, &mut out, "t.rhai", &mut SiteOwners::default()).len(),
                1,
                "{smuggled:?}"
            );
            assert!(out.syslog_servers.is_empty());
        }
    }

    /// The fail-closed settings: a route refused whole, a backend without usable TLS, an
    /// HTTPS bind refusing everyone; each checked, and never switched off by another key.
    #[test]
    fn fail_closed_settings_are_parsed_again() {
        let deny = |status: i64, because: Vec<Dynamic>| {
            let mut m = Map::new();
            m.insert("status".into(), status.into());
            m.insert("because".into(), Dynamic::from_array(because));
            Dynamic::from_map(m)
        };
        let mut map = Map::new();
        map.insert("deny_all".into(), deny(403, vec!["allow-list".into()]));
        let mut out = RouteOutcome::default();
        assert!(apply_route(&map, &mut out, "t.rhai", &mut SiteOwners::default()).is_empty());
        let denied = out.settings.deny_all.clone().unwrap();
        assert_eq!(
            (denied.status, denied.because),
            (403, vec!["allow-list".to_string()])
        );
        assert!(!out.settings.is_empty(), "a denied route has a policy");
        for bad in [
            deny(200, vec!["allow-list".into()]),
            deny(403, vec![]),
            deny(403, vec!["allow-list\n  lua-load /x".into()]),
        ] {
            let mut map = Map::new();
            map.insert("deny_all".into(), bad);
            let mut out = RouteOutcome::default();
            assert_eq!(
                apply_route(&map, &mut out, "t.rhai", &mut SiteOwners::default()).len(),
                1
            );
            assert!(out.settings.deny_all.is_none());
        }

        let mut backend = BackendSettings::default();
        for unusable in [true, false] {
            let mut map = Map::new();
            map.insert("server_tls_unusable".into(), unusable.into());
            assert!(
                apply_backend(&map, &mut backend, "t.rhai", &mut SiteOwners::default()).is_empty()
            );
        }
        assert!(
            backend.server_tls_unusable,
            "a later false does not switch it off"
        );

        let mut global = GlobalSettings::default();
        let mut map = Map::new();
        map.insert("client_ca_invalid".into(), true.into());
        assert!(apply_global(&map, &mut global, "t.rhai", &mut SiteOwners::default()).is_empty());
        assert!(global.tls.client_ca_invalid && global.tls.client_ca.is_none());
    }

    #[test]
    fn traffic_policies_are_parsed_again() {
        let rate = |status: i64, whitelist: Vec<Dynamic>| {
            let mut m = Map::new();
            m.insert("requests".into(), 10.into());
            m.insert("period".into(), 1000.into());
            m.insert("size".into(), 102_400.into());
            m.insert("status".into(), status.into());
            m.insert("whitelist".into(), Dynamic::from_array(whitelist));
            Dynamic::from_map(m)
        };
        let mut map = Map::new();
        map.insert("rate_limit".into(), rate(429, vec!["10.0.0.0/8".into()]));
        let mut out = RouteOutcome::default();
        assert!(apply_route(&map, &mut out, "t.rhai", &mut SiteOwners::default()).is_empty());
        let limit = out.settings.rate_limit.clone().unwrap();
        assert_eq!((limit.size.as_str(), limit.status), ("100k", 429));
        assert_eq!(limit.whitelist, ["10.0.0.0/8"]);
        for bad in [rate(418, vec![]), rate(429, vec!["10.0.0.0/8 #x".into()])] {
            let mut map = Map::new();
            map.insert("rate_limit".into(), bad);
            let mut out = RouteOutcome::default();
            assert_eq!(
                apply_route(&map, &mut out, "t.rhai", &mut SiteOwners::default()).len(),
                1
            );
            assert!(out.settings.rate_limit.is_none());
        }

        let mut cookie = Map::new();
        cookie.insert("name".into(), "SRV\n  lua-load /x".into());
        cookie.insert("dynamic".into(), true.into());
        let mut map = Map::new();
        map.insert("cookie_persistence".into(), Dynamic::from_map(cookie));
        map.insert("send_proxy".into(), "send-proxy-v2".into());
        let mut out = BackendSettings::default();
        let keys: Vec<String> = apply_backend(&map, &mut out, "t.rhai", &mut SiteOwners::default())
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(keys, ["cookie_persistence", "send_proxy"]);
        assert!(out.cookie_persistence.is_none() && out.send_proxy.is_none());
    }

    fn site_map(entries: Vec<(&str, Dynamic)>) -> Map {
        let mut site = Map::new();
        for (k, v) in entries {
            site.insert(k.into(), v);
        }
        let mut map = Map::new();
        map.insert("site".into(), Dynamic::from_map(site));
        map
    }

    /// Site values are plain typed data: strings become tokens or quotable text, nothing
    /// else gets through, and sizes are bounded; a bad key costs only that key.
    #[test]
    fn site_settings_are_typed_data() {
        let mut nested = Map::new();
        nested.insert(
            "types".into(),
            Dynamic::from_array(vec!["text/html".into()]),
        );
        let map = site_map(vec![
            ("on", true.into()),
            ("level", 5.into()),
            ("algo", "gzip".into()),
            ("body", "Back at 14:00 # soon".into()),
            ("compression", Dynamic::from_map(nested)),
            ("newline", "gzip\n  lua-load /x".into()),
            ("quote", "it's".into()),
            ("empty", "".into()),
            ("float", Dynamic::from(1.5_f64)),
            ("Bad-Key", true.into()),
            ("long", "x".repeat(MAX_SITE_STRING + 1).into()),
        ]);
        let mut out = RouteOutcome::default();
        let errors = apply_route(&map, &mut out, "a.rhai", &mut SiteOwners::default());
        let mut keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "site.Bad-Key",
                "site.empty",
                "site.float",
                "site.long",
                "site.newline",
                "site.quote"
            ],
            "{errors:?}"
        );
        assert!(errors.iter().all(|e| !e.warning));
        let site = &out.settings.site;
        assert_eq!(site["on"], SiteValue::Bool(true));
        assert_eq!(site["level"], SiteValue::Int(5));
        assert_eq!(site["algo"], SiteValue::Token("gzip".into()));
        assert_eq!(site["body"], SiteValue::Text("Back at 14:00 # soon".into()));
        let SiteValue::Map(c) = &site["compression"] else {
            panic!("{site:?}")
        };
        assert_eq!(
            c["types"],
            SiteValue::List(vec![SiteValue::Token("text/html".into())])
        );
        assert!(
            !out.settings.is_empty(),
            "site settings make a route policy"
        );

        // Too deep, too many.
        let mut deep = Dynamic::from_array(vec![1.into()]);
        for _ in 0..MAX_SITE_DEPTH {
            deep = Dynamic::from_array(vec![deep]);
        }
        let many = Dynamic::from_array((0..=MAX_SITE_KEYS as i64).map(Dynamic::from).collect());
        let map = site_map(vec![("deep", deep), ("many", many)]);
        let mut out = BackendSettings::default();
        let errors = apply_backend(&map, &mut out, "a.rhai", &mut SiteOwners::default());
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(out.site.is_empty());

        // Not a map at all.
        let mut map = Map::new();
        map.insert("site".into(), "compression".into());
        let mut out = GlobalSettings::default();
        let errors = apply_global(&map, &mut out, "a.rhai", &mut SiteOwners::default());
        assert_eq!(errors[0].key, "site");
    }

    /// Site keys of several scripts merge; the same key set to another value by a later
    /// script is a warning naming the earlier one, and the later value applies.
    #[test]
    fn site_settings_of_several_scripts_merge() {
        let mut owners = SiteOwners::default();
        let mut out = BackendSettings::default();
        let first = site_map(vec![("algo", "gzip".into()), ("level", 1.into())]);
        assert!(apply_backend(&first, &mut out, "a.rhai", &mut owners).is_empty());
        let second = site_map(vec![("types", "text/html".into()), ("level", 1.into())]);
        assert!(apply_backend(&second, &mut out, "b.rhai", &mut owners).is_empty());
        let third = site_map(vec![("algo", "deflate".into()), ("types", Dynamic::UNIT)]);
        let errors = apply_backend(&third, &mut out, "c.rhai", &mut owners);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].warning);
        assert_eq!(errors[0].key, "site.algo");
        assert!(
            errors[0].message.contains("also set by a.rhai"),
            "{errors:?}"
        );
        let keys: Vec<&String> = out.site.keys().collect();
        assert_eq!(keys, ["algo", "level"]);
        assert_eq!(out.site["algo"], SiteValue::Token("deflate".into()));
    }
}
