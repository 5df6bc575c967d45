//! Routes become map entries, with Kubernetes path semantics.
//!
//! Keys are host + path. Exact paths go to the exact map. A Prefix path `/foo` matches `/foo`
//! itself (exact map) and everything under `/foo/` (prefix map, longest match): element-wise,
//! so `/foobar` does not match. ImplementationSpecific paths are plain string prefixes.
//! Where two routes produce the same key, the more specific kind wins, then the older Ingress;
//! the loser is reported.

use std::collections::{BTreeMap, BTreeSet};

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{MapEntry, RouteMaps};
use crate::objects::ObjectRef;

/// An Ingress path type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathKind {
    Exact,
    Prefix,
    ImplementationSpecific,
}

impl PathKind {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "Exact" => Ok(PathKind::Exact),
            "Prefix" => Ok(PathKind::Prefix),
            "ImplementationSpecific" | "" => Ok(PathKind::ImplementationSpecific),
            other => Err(format!(
                "{other:?} is not Exact, Prefix or ImplementationSpecific"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::Exact => "Exact",
            PathKind::Prefix => "Prefix",
            PathKind::ImplementationSpecific => "ImplementationSpecific",
        }
    }
}

/// One Ingress path, resolved to a map value.
#[derive(Debug, Clone)]
pub struct RouteCandidate {
    /// Validated host, `*.`-prefixed for wildcards, empty for rules without a host.
    pub host: String,
    pub path: String,
    pub kind: PathKind,
    /// `backend` or `backend.policy`.
    pub value: String,
    /// Age rank of the Ingress (0 = oldest).
    pub rank: usize,
    pub ingress: ObjectRef,
    pub field: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Table {
    Exact,
    Prefix,
}

/// The map entries one route produces: (table, key, specificity; lower wins).
fn entries(route: &RouteCandidate) -> Vec<(Table, String, u8)> {
    let host = &route.host;
    match route.kind {
        PathKind::Exact => vec![(Table::Exact, format!("{host}{}", route.path), 0)],
        PathKind::Prefix => {
            let trimmed = route.path.trim_end_matches('/');
            if trimmed.is_empty() {
                vec![(Table::Prefix, format!("{host}/"), 0)]
            } else {
                vec![
                    (Table::Exact, format!("{host}{trimmed}"), 1),
                    (Table::Prefix, format!("{host}{trimmed}/"), 0),
                ]
            }
        }
        PathKind::ImplementationSpecific => {
            vec![(Table::Prefix, format!("{host}{}", route.path), 1)]
        }
    }
}

/// An Ingress asking for HTTP→HTTPS redirects on a TLS host.
#[derive(Debug, Clone)]
pub struct RedirectClaim {
    pub host: String,
    pub code: u16,
    /// Age rank of the Ingress (0 = oldest).
    pub rank: usize,
    pub ingress: ObjectRef,
}

/// Map keys and the routes claiming them, with their specificity and age rank.
type Claims<'a> = BTreeMap<(Table, String), Vec<(u8, usize, &'a RouteCandidate)>>;

/// Builds the routing and redirect maps, and the redirect codes in use.
pub fn build_maps(
    routes: &[RouteCandidate],
    redirects: Vec<RedirectClaim>,
    diags: &mut Diagnostics,
) -> (RouteMaps, Vec<u16>) {
    let mut claims: Claims<'_> = BTreeMap::new();
    for route in routes {
        for (table, key, specificity) in entries(route) {
            claims
                .entry((table, key))
                .or_default()
                .push((specificity, route.rank, route));
        }
    }
    let mut maps = RouteMaps::default();
    for ((table, key), mut claimants) in claims {
        claimants.sort_by_key(|(s, rank, r)| (*s, *rank, r.field.clone()));
        let winner = claimants[0].2;
        for (_, _, loser) in &claimants[1..] {
            if loser.value != winner.value && loser.ingress != winner.ingress {
                diags.object(
                    Severity::Warning,
                    &loser.ingress,
                    &loser.field,
                    format!(
                        "{} {} is also routed by {} ({}), which takes precedence",
                        host_label(&loser.host),
                        loser.path,
                        winner.ingress,
                        winner.field
                    ),
                );
            }
        }
        let entry = MapEntry {
            key,
            value: winner.value.clone(),
        };
        match table {
            Table::Exact => maps.exact.push(entry),
            Table::Prefix => maps.prefix.push(entry),
        }
    }

    let mut by_host: BTreeMap<String, Vec<(usize, u16, ObjectRef)>> = BTreeMap::new();
    for r in redirects {
        by_host
            .entry(r.host)
            .or_default()
            .push((r.rank, r.code, r.ingress));
    }
    let mut codes = BTreeSet::new();
    for (host, mut claims) in by_host {
        claims.sort();
        let (_, code, winner) = claims[0].clone();
        for (_, other_code, ingress) in &claims[1..] {
            if *other_code != code && *ingress != winner {
                diags.object(
                    Severity::Warning,
                    ingress,
                    "annotation ssl-redirect-code",
                    format!("host {host} already redirects with code {code} (set by {winner})"),
                );
            }
        }
        codes.insert(code);
        maps.ssl_redirect.push(MapEntry {
            key: host,
            value: code.to_string(),
        });
    }
    (maps, codes.into_iter().collect())
}

fn host_label(host: &str) -> String {
    if host.is_empty() {
        "path".to_string()
    } else {
        format!("host {host} path")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Key, Kind};

    fn route(host: &str, path: &str, kind: PathKind, value: &str, rank: usize) -> RouteCandidate {
        RouteCandidate {
            host: host.into(),
            path: path.into(),
            kind,
            value: value.into(),
            rank,
            ingress: ObjectRef::new(Kind::Ingress, &Key::new("ns", format!("i{rank}"))),
            field: "spec.rules[0].http.paths[0]".into(),
        }
    }

    #[test]
    fn prefix_is_element_wise_and_exact_wins() {
        let mut diags = Diagnostics::new();
        let (maps, _) = build_maps(
            &[
                route("a.com", "/foo/", PathKind::Prefix, "b1", 0),
                route("a.com", "/foo", PathKind::Exact, "b2", 1),
                route("", "/", PathKind::Prefix, "b3", 0),
                route("", "/x", PathKind::ImplementationSpecific, "b4", 0),
            ],
            vec![],
            &mut diags,
        );
        let show = |v: &[MapEntry]| {
            v.iter()
                .map(|e| format!("{} {}", e.key, e.value))
                .collect::<Vec<_>>()
        };
        assert_eq!(show(&maps.exact), ["a.com/foo b2"]);
        assert_eq!(show(&maps.prefix), ["/ b3", "/x b4", "a.com/foo/ b1"]);
        assert_eq!(diags.len(), 1, "the shadowed Prefix self-match is reported");
    }
}
