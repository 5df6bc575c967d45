//! Turning what a hook returned into typed settings.
//!
//! Hooks return Rhai maps. Every key is known, every value is parsed again with the same typed
//! parsers the accessors use: a script that builds a string by hand still cannot put raw
//! config text into the model.

use rhai::{Dynamic, Map};

use crate::model::{BackendSettings, GlobalSettings, HttpCheck, RouteSettings, SourcePersistence};
use crate::policy::context::CHECK_METHODS;
use crate::values;

/// Redirect codes `ssl-redirect-code` may use.
pub const REDIRECT_CODES: &[i64] = &[301, 302, 303, 307, 308];

/// What a route hook decides: backend-side settings plus the frontend's redirect choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteOutcome {
    pub settings: RouteSettings,
    pub ssl_redirect: Option<bool>,
    pub ssl_redirect_code: Option<u16>,
}

/// `timeout_<name>` keys the global hook may return, with HAProxy's names.
const GLOBAL_TIMEOUTS: &[(&str, &str)] = &[
    ("timeout_client", "client"),
    ("timeout_client_fin", "client-fin"),
    ("timeout_connect", "connect"),
    ("timeout_http_keep_alive", "http-keep-alive"),
    ("timeout_http_request", "http-request"),
    ("timeout_queue", "queue"),
    ("timeout_server", "server"),
    ("timeout_server_fin", "server-fin"),
    ("timeout_tunnel", "tunnel"),
    ("timeout_check", "check"),
];

/// `timeout_<name>` keys a backend hook may return.
const BACKEND_TIMEOUTS: &[(&str, &str)] = &[
    ("timeout_check", "check"),
    ("timeout_connect", "connect"),
    ("timeout_queue", "queue"),
    ("timeout_server", "server"),
    ("timeout_tunnel", "tunnel"),
];

/// A problem with one returned key.
pub type KeyError = (String, String);

pub fn apply_global(map: &Map, out: &mut GlobalSettings) -> Vec<KeyError> {
    let mut errors = Vec::new();
    for (key, value) in map {
        let key = key.as_str();
        let result = match key {
            "config_snippet" => snippet(value).map(|s| out.config_snippet = s),
            "frontend_snippet" => snippet(value).map(|s| out.frontend_snippet = s),
            _ => match GLOBAL_TIMEOUTS.iter().find(|(k, _)| *k == key) {
                Some((_, name)) => duration_ms(value).map(|ms| {
                    out.timeouts.insert(name.to_string(), ms);
                }),
                None => Err(unknown_key(key, "global")),
            },
        };
        if let Err(e) = result {
            errors.push((key.to_string(), e));
        }
    }
    errors
}

pub fn apply_backend(map: &Map, out: &mut BackendSettings) -> Vec<KeyError> {
    let mut errors = Vec::new();
    for (key, value) in map {
        let key = key.as_str();
        let result = match key {
            "balance" => string(value)
                .and_then(|s| values::parse_balance(&s))
                .map(|b| out.balance = b.split(' ').map(str::to_string).collect()),
            "check" => boolean(value).map(|b| out.check = b),
            "check_http" => http_check(value).map(|c| out.check_http = Some(c)),
            "check_interval" => duration_ms(value).map(|ms| out.check_interval_ms = Some(ms)),
            "maxconn" => int(value, 1, 1_000_000).map(|n| out.maxconn = Some(n as u32)),
            "server_ssl" => boolean(value).map(|b| out.server_ssl = b),
            "server_proto" => string(value)
                .and_then(|s| values::parse_enum(&s, &["h1", "h2"]))
                .map(|p| out.server_proto = (p == "h2").then_some(p)),
            "forwarded_for" => boolean(value).map(|b| out.forwarded_for = b),
            "slots_block" => int(value, 1, 1000).map(|n| out.slots_block = n as u32),
            "config_snippet" => snippet(value).map(|s| out.config_snippet = s),
            "source_ip_persistence" => {
                source_persistence(value).map(|p| out.source_persistence = Some(p))
            }
            _ => match BACKEND_TIMEOUTS.iter().find(|(k, _)| *k == key) {
                Some((_, name)) => duration_ms(value).map(|ms| {
                    out.timeouts.insert(name.to_string(), ms);
                }),
                None => Err(unknown_key(key, "backend")),
            },
        };
        if let Err(e) = result {
            errors.push((key.to_string(), e));
        }
    }
    errors
}

pub fn apply_route(map: &Map, out: &mut RouteOutcome) -> Vec<KeyError> {
    let mut errors = Vec::new();
    for (key, value) in map {
        let key = key.as_str();
        let s = &mut out.settings;
        let result = match key {
            "set_host" => string(value)
                .and_then(|h| values::parse_host_header(&h))
                .map(|h| s.set_host = Some(h)),
            "request_headers" => headers(value).map(|h| s.request_headers = h),
            "response_headers" => headers(value).map(|h| s.response_headers = h),
            "path_rewrite" => pair(value)
                .and_then(|(re, repl)| {
                    Ok((values::parse_regex(&re)?, values::parse_replacement(&repl)?))
                })
                .map(|p| s.path_rewrite = Some(p)),
            "allow_list" => cidrs(value).map(|c| s.allow_list = c),
            "deny_list" => cidrs(value).map(|c| s.deny_list = c),
            "ssl_redirect" => boolean(value).map(|b| out.ssl_redirect = Some(b)),
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
            errors.push((key.to_string(), e));
        }
    }
    errors
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

fn headers(v: &Dynamic) -> Result<Vec<(String, String)>, String> {
    array(v)?
        .iter()
        .map(|item| {
            let (n, val) = pair(item)?;
            Ok((
                values::parse_header_name(&n)?,
                values::parse_header_value(&val)?,
            ))
        })
        .collect()
}

fn cidrs(v: &Dynamic) -> Result<Vec<String>, String> {
    let items = array(v)?
        .iter()
        .map(string)
        .collect::<Result<Vec<_>, _>>()?;
    values::parse_cidr_list(&items.join(","))
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
        .and_then(|s| int(s, 1, 1 << 32))?;
    let expire_ms = map
        .get("expire")
        .ok_or_else(|| "missing \"expire\"".to_string())
        .and_then(duration_ms)?;
    Ok(SourcePersistence {
        size: size_text(size as u64),
        expire_ms,
    })
}

/// A size as HAProxy writes it: `1m` for 1048576, `100k` for 102400, else the number.
fn size_text(n: u64) -> String {
    if n % (1 << 30) == 0 {
        format!("{}g", n >> 30)
    } else if n % (1 << 20) == 0 {
        format!("{}m", n >> 20)
    } else if n % (1 << 10) == 0 {
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
    Ok(HttpCheck {
        method: values::parse_enum(&field("method")?, CHECK_METHODS)?,
        uri: values::parse_path(&field("uri")?)?,
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
        let errors = apply_backend(&map, &mut out);
        assert!(out.balance.is_empty());
        assert!(out.check);
        let keys: Vec<_> = errors.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["balance", "nonsense"]);
    }
}
