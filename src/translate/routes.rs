//! Routes become map entries, with Kubernetes path semantics.
//!
//! Keys are host + path. Exact paths go to the exact map. A Prefix path `/foo` matches `/foo`
//! itself (exact map) and everything under `/foo/` (prefix map, longest match): element-wise,
//! so `/foobar` does not match. ImplementationSpecific paths are plain string prefixes.
//! Where two routes produce the same key, the more specific kind wins, then the older Ingress;
//! the loser is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{AclCondition, CanaryRoute, MapEntry, RouteMaps};
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
    /// Shared by the routes of one Ingress (kept from run to run: see `translate::parts`).
    pub ingress: Arc<ObjectRef>,
    pub field: String,
    /// `route-acl` of the Service: a canary route, taken only when the condition holds. It
    /// makes no entry of its own in the regular part of the maps (see [`build_canaries`]).
    pub canary: Option<Box<AclCondition>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Table {
    Exact,
    Prefix,
}

/// The map entries one route produces, each given to `entry` as (table, key, specificity;
/// lower wins).
fn entries(route: &RouteCandidate, mut entry: impl FnMut(Table, String, u8)) {
    let host = &route.host;
    let key = |path: &str, slash: bool| {
        let mut key = String::with_capacity(host.len() + path.len() + 1);
        key.push_str(host);
        key.push_str(path);
        if slash {
            key.push('/');
        }
        key
    };
    match route.kind {
        PathKind::Exact => entry(Table::Exact, key(&route.path, false), 0),
        PathKind::Prefix => {
            let trimmed = route.path.trim_end_matches('/');
            if trimmed.is_empty() {
                entry(Table::Prefix, key("", true), 0);
            } else {
                entry(Table::Exact, key(trimmed, false), 1);
                entry(Table::Prefix, key(trimmed, true), 0);
            }
        }
        PathKind::ImplementationSpecific => entry(Table::Prefix, key(&route.path, false), 1),
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

/// One route's claim on a map key.
struct Claim<'a> {
    table: Table,
    /// The key's first eight bytes as a number (zeros after a shorter key, which holds no
    /// NUL): ordering by it, then by the key, is ordering by the key, and most comparisons
    /// of the sort end at the number.
    prefix: u64,
    key: String,
    specificity: u8,
    route: &'a RouteCandidate,
}

impl<'a> Claim<'a> {
    fn new(table: Table, key: String, specificity: u8, route: &'a RouteCandidate) -> Self {
        let mut first = [0u8; 8];
        let n = key.len().min(8);
        first[..n].copy_from_slice(&key.as_bytes()[..n]);
        Claim {
            table,
            prefix: u64::from_be_bytes(first),
            key,
            specificity,
            route,
        }
    }

    /// By key, then precedence: the more specific kind, the older Ingress, the lower field.
    fn order(&self) -> (Table, u64, &str, u8, usize, &str) {
        (
            self.table,
            self.prefix,
            &self.key,
            self.specificity,
            self.route.rank,
            &self.route.field,
        )
    }
}

/// Builds the routing and redirect maps, and the redirect codes in use.
pub fn build_maps(
    routes: &[&RouteCandidate],
    redirects: &[&RedirectClaim],
    diags: &mut Diagnostics,
) -> (RouteMaps, Vec<u16>) {
    // One sorted list rather than a tree of keys: at 10 000 Ingresses that is some 60 000
    // claims, and the tree's nodes and per-key lists were most of the time.
    let mut claims: Vec<Claim<'_>> = Vec::with_capacity(routes.len() * 2);
    for route in routes.iter().copied().filter(|r| r.canary.is_none()) {
        entries(route, |table, key, specificity| {
            claims.push(Claim::new(table, key, specificity, route));
        });
    }
    claims.sort_unstable_by(|a, b| a.order().cmp(&b.order()));
    let mut maps = RouteMaps::default();
    let mut rest = claims.as_mut_slice();
    while !rest.is_empty() {
        let same = rest
            .iter()
            .position(|c| c.table != rest[0].table || c.key != rest[0].key)
            .unwrap_or(rest.len());
        let (claimants, tail) = rest.split_at_mut(same);
        rest = tail;
        let winner = claimants[0].route;
        for loser in claimants[1..].iter().map(|c| c.route) {
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
            key: std::mem::take(&mut claimants[0].key),
            value: winner.value.clone(),
        };
        match claimants[0].table {
            Table::Exact => maps.exact.push(entry),
            Table::Prefix => maps.prefix.push(entry),
        }
    }

    let mut by_host: BTreeMap<&str, Vec<(usize, u16, &ObjectRef)>> = BTreeMap::new();
    for r in redirects {
        by_host
            .entry(&r.host)
            .or_default()
            .push((r.rank, r.code, &r.ingress));
    }
    let mut codes = BTreeSet::new();
    for (host, mut claims) in by_host {
        claims.sort();
        let (_, code, winner) = claims[0];
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
            key: host.to_string(),
            value: code.to_string(),
        });
    }
    (maps, codes.into_iter().collect())
}

/// The first character of the keys of the canary part of both maps; no host or path starts
/// with it, so regular lookups never meet these keys and canary lookups meet only them.
pub const CANARY_KEY_PREFIX: &str = "~";
/// The value of a key in the canary part whose best routes are regular ones.
pub const NO_CANARY: &str = "-";

/// `route-acl`: the canary part of the maps and the canary routes of the frontends.
///
/// The frontends look `~<host><path>` up in the same steps as a regular route (exact host,
/// wildcard, no host; exact map, then longest prefix) before the regular lookup. The canary
/// part holds the keys of the canary routes and, so that a more specific regular route still
/// wins, the keys of every regular route that could match a request one of them matches. A
/// key's value is the id of its canary set (the canary routes among its best claimants, in
/// precedence order: the older Ingress, then the lower field), or [`NO_CANARY`]. A request
/// whose key has a set goes to the first of its canary routes whose condition holds; every
/// other request is routed by the regular part alone, as if the canary routes did not exist.
pub fn build_canaries(routes: &[&RouteCandidate], maps: &mut RouteMaps) -> Vec<CanaryRoute> {
    let mut canary_keys: Vec<(&str, String)> = Vec::new();
    for r in routes.iter().filter(|r| r.canary.is_some()) {
        entries(r, |_, key, _| {
            canary_keys.push((r.host.as_str(), key[r.host.len()..].to_string()));
        });
    }
    if canary_keys.is_empty() {
        return Vec::new();
    }
    let mut claims: Claims<'_> = BTreeMap::new();
    for route in routes.iter().copied() {
        entries(route, |table, key, specificity| {
            if route.canary.is_none() {
                let path = &key[route.host.len()..];
                let overlaps = canary_keys.iter().any(|(host, canary_path)| {
                    hosts_overlap(&route.host, host)
                        && (path.starts_with(canary_path.as_str()) || canary_path.starts_with(path))
                });
                if !overlaps {
                    return;
                }
            }
            claims
                .entry((table, key))
                .or_default()
                .push((specificity, route.rank, route));
        });
    }
    let mut sets: BTreeMap<String, Vec<CanaryRoute>> = BTreeMap::new();
    for ((table, key), mut claimants) in claims {
        claimants.sort_by_key(|(s, rank, r)| (*s, *rank, r.field.clone()));
        let best = claimants[0].0;
        let mut alternatives: Vec<(&AclCondition, &str)> = Vec::new();
        for (_, _, route) in claimants.iter().filter(|(s, _, _)| *s == best) {
            if let Some(condition) = &route.canary {
                let alternative = (condition.as_ref(), route.value.as_str());
                if !alternatives.contains(&alternative) {
                    alternatives.push(alternative);
                }
            }
        }
        let value = if alternatives.is_empty() {
            NO_CANARY.to_string()
        } else {
            let set = canary_set_id(&alternatives);
            sets.entry(set.clone()).or_insert_with(|| {
                alternatives
                    .iter()
                    .map(|(condition, route)| CanaryRoute {
                        set: set.clone(),
                        route: route.to_string(),
                        condition: (*condition).clone(),
                    })
                    .collect()
            });
            set
        };
        let entry = MapEntry {
            key: format!("{CANARY_KEY_PREFIX}{key}"),
            value,
        };
        // `~` sorts after every character a regular key starts with: the maps stay sorted.
        match table {
            Table::Exact => maps.exact.push(entry),
            Table::Prefix => maps.prefix.push(entry),
        }
    }
    sets.into_values().flatten().collect()
}

/// Whether one request could match keys of both hosts: the same host, a host and its
/// one-label wildcard, or a rule without a host.
fn hosts_overlap(a: &str, b: &str) -> bool {
    let wild = |h: &str| -> String {
        if h.starts_with("*.") {
            h.to_string()
        } else {
            h.split_once('.')
                .map_or_else(|| "*".to_string(), |(_, rest)| format!("*.{rest}"))
        }
    };
    a == b || a.is_empty() || b.is_empty() || wild(a) == b || wild(b) == a
}

/// `a` + the first 10 hex digits of the SHA-256 of the set's conditions and routes.
fn canary_set_id(alternatives: &[(&AclCondition, &str)]) -> String {
    let json = serde_json::to_string(alternatives).unwrap_or_default();
    let digest = Sha256::digest(json.as_bytes());
    let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    format!("a{hex}")
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
            ingress: Arc::new(ObjectRef::new(
                Kind::Ingress,
                &Key::new("ns", format!("i{rank}")),
            )),
            field: "spec.rules[0].http.paths[0]".into(),
            canary: None,
        }
    }

    #[test]
    fn prefix_is_element_wise_and_exact_wins() {
        let mut diags = Diagnostics::new();
        let routes = [
            route("a.com", "/foo/", PathKind::Prefix, "b1", 0),
            route("a.com", "/foo", PathKind::Exact, "b2", 1),
            route("", "/", PathKind::Prefix, "b3", 0),
            route("", "/x", PathKind::ImplementationSpecific, "b4", 0),
        ];
        let (maps, _) = build_maps(&routes.iter().collect::<Vec<_>>(), &[], &mut diags);
        let show = |v: &[MapEntry]| {
            v.iter()
                .map(|e| format!("{} {}", e.key, e.value))
                .collect::<Vec<_>>()
        };
        assert_eq!(show(&maps.exact), ["a.com/foo b2"]);
        assert_eq!(show(&maps.prefix), ["/ b3", "/x b4", "a.com/foo/ b1"]);
        assert_eq!(diags.len(), 1, "the shadowed Prefix self-match is reported");
    }

    #[test]
    fn canary_routes_get_the_canary_part_of_the_maps() {
        let condition = crate::values::parse_route_acl("cookie(staging) -m found").unwrap();
        let canary = |host: &str, path: &str, kind: PathKind, value: &str, rank: usize| {
            let mut r = route(host, path, kind, value, rank);
            r.canary = Some(Box::new(condition.clone()));
            r
        };
        let routes = [
            route("a.com", "/", PathKind::Prefix, "main", 0),
            route("a.com", "/api", PathKind::Prefix, "api", 0),
            route("*.a.com", "/", PathKind::Prefix, "wild", 0),
            route("b.com", "/", PathKind::Prefix, "b", 0),
            canary("a.com", "/", PathKind::Prefix, "canary", 1),
            canary("c.com", "/x", PathKind::Exact, "only-canary", 1),
        ];
        let mut diags = Diagnostics::new();
        let routes: Vec<&RouteCandidate> = routes.iter().collect();
        let (mut maps, _) = build_maps(&routes, &[], &mut diags);
        let canaries = build_canaries(&routes, &mut maps);
        assert!(
            diags.is_empty(),
            "a canary route does not shadow: {diags:?}"
        );
        let show = |v: &[MapEntry]| {
            v.iter()
                .map(|e| format!("{} {}", e.key, e.value))
                .collect::<Vec<_>>()
        };
        assert_eq!(canaries.len(), 2);
        let set_of = |route: &str| {
            canaries
                .iter()
                .find(|c| c.route == route)
                .map(|c| c.set.clone())
                .unwrap()
        };
        let (a, c) = (set_of("canary"), set_of("only-canary"));
        // Regular keys that could beat a canary key are in the canary part too (with `-`);
        // b.com cannot, and the canary routes have no regular entry.
        assert_eq!(
            show(&maps.exact),
            [
                "a.com/api api".to_string(),
                "~a.com/api -".to_string(),
                format!("~c.com/x {c}"),
            ]
        );
        assert_eq!(
            show(&maps.prefix),
            [
                "*.a.com/ wild".to_string(),
                "a.com/ main".to_string(),
                "a.com/api/ api".to_string(),
                "b.com/ b".to_string(),
                format!("~a.com/ {a}"),
                "~a.com/api/ -".to_string(),
            ]
        );
        // Without canary routes, nothing changes.
        let (mut plain, _) = build_maps(&routes[..4], &[], &mut diags);
        let before = plain.clone();
        assert!(build_canaries(&routes[..4], &mut plain).is_empty());
        assert_eq!(plain, before);
    }
}
