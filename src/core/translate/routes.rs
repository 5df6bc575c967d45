//! Routes become map entries, with Kubernetes path semantics.
//!
//! Keys are host + path. Exact paths go to the exact map. A Prefix path `/foo` matches `/foo`
//! itself (exact map) and everything under `/foo/` (prefix map, longest match): element-wise,
//! so `/foobar` does not match. ImplementationSpecific paths are plain string prefixes.
//! Where two routes produce the same key, the more specific kind wins, then the older Ingress;
//! the loser is reported.
//!
//! A path whose Service (or Service port) does not exist keeps its place: it claims its keys
//! like any other, with [`UNAVAILABLE_BACKEND`] as the value, so that its requests answer 503
//! instead of falling through to a shorter prefix of the host (another backend's content).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{AclCondition, CanaryRoute, MapEntry, RedirectPort, RouteMaps, same_str};
use crate::objects::ObjectRef;

/// The built-in backend that answers 500: where the requests of a Gateway API backend ref that
/// does not resolve go (the Gateway API's rule for them), rendered while some route leads to it.
pub const INVALID_BACKEND: &str = "portcullis_invalid_backend";

/// The built-in backend that answers 503, the map value of a path whose Service or Service
/// port does not exist (or that names a resource backend). No Service backend can be named
/// so: their names end with a port number.
pub const UNAVAILABLE_BACKEND: &str = "portcullis_unavailable";

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
    pub value: Arc<str>,
    /// Age rank of the Ingress (0 = oldest).
    pub rank: usize,
    /// Shared by the routes of one Ingress (kept from run to run: see `translate::parts`).
    pub ingress: Arc<ObjectRef>,
    pub field: String,
    /// `route-acl` of the Service: a canary route, taken only when the condition holds. It
    /// makes no entry of its own in the regular part of the maps (see [`build_canaries`]).
    pub canary: Option<Box<Canary>>,
}

/// The conditions under which a canary route is taken: all of them must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Canary {
    pub condition: AclCondition,
    pub and: Vec<AclCondition>,
}

impl Canary {
    /// One condition (`route-acl`).
    pub fn one(condition: AclCondition) -> Self {
        Canary {
            condition,
            and: Vec::new(),
        }
    }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectClaim {
    pub host: String,
    pub code: u16,
    /// `ssl-redirect-port`; none: the scheme's default port.
    pub port: Option<u16>,
    /// Age rank of the Ingress (0 = oldest).
    pub rank: usize,
    pub ingress: ObjectRef,
}

/// Map keys and the routes claiming them, with their specificity and age rank.
type Claims<'a> = BTreeMap<(Table, String), Vec<(u8, usize, &'a RouteCandidate)>>;

/// One regular route's claim on a map key. The route is `groups[group][route]` of the groups
/// the claims were made from (each Ingress' routes are a group, in age order).
#[derive(Debug, Clone, PartialEq, Eq)]
struct MapClaim {
    table: Table,
    specificity: u8,
    group: u32,
    route: u32,
    /// The key's first eight bytes as a number (zeros after a shorter key, which holds no
    /// NUL): ordering by it, then by the key, is ordering by the key, and most comparisons
    /// of the sort end at the number.
    prefix: u64,
    /// A hash of the key: claims on different keys (most neighbours) differ in it, so the
    /// keys' bytes are not read to tell them apart.
    hash: u64,
    key: Arc<str>,
    /// The route's map value: the winning claim's entry is made without reading the route.
    value: Arc<str>,
}

/// The claims of the regular (not canary) routes on map keys, sorted by key and then
/// precedence: the more specific kind, the older Ingress, the lower field. Kept from one run
/// to the next, so that a run after a few Ingresses changed re-sorts only their claims
/// ([`SortedClaims::patch`]) instead of some 60 000 at 10 000 Ingresses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SortedClaims(Vec<MapClaim>);

/// How a claim ranks against another: by key, then precedence.
fn claim_order(groups: &[&[RouteCandidate]], a: &MapClaim, b: &MapClaim) -> std::cmp::Ordering {
    let route = |c: &MapClaim| &groups[c.group as usize][c.route as usize];
    (a.table, a.prefix)
        .cmp(&(b.table, b.prefix))
        .then_with(|| a.key.cmp(&b.key))
        .then_with(|| a.specificity.cmp(&b.specificity))
        .then_with(|| {
            let (ra, rb) = (route(a), route(b));
            (ra.rank, &ra.field).cmp(&(rb.rank, &rb.field))
        })
}

impl SortedClaims {
    /// The claims of every regular route of `groups`.
    pub fn new(groups: &[&[RouteCandidate]]) -> Self {
        let mut claims = Vec::with_capacity(groups.iter().map(|g| g.len()).sum::<usize>() * 2);
        for group in 0..groups.len() {
            push_claims(groups, group, &mut claims);
        }
        claims.sort_unstable_by(|a, b| claim_order(groups, a, b));
        // Kept from run to run; the capacity was a bound (two claims a route). A little room
        // is left for `patch`, which merges in place: a new path's claims then do not move
        // the 60 000 others to a larger allocation beside the old one.
        claims.shrink_to(claims.len() + claims.len() / 64 + 16);
        SortedClaims(claims)
    }

    /// These claims, made from earlier groups, for `groups`: the claims of the groups
    /// `replaced` (ascending indexes) made again, and those of groups beyond the end dropped.
    /// Every other group must hold the routes it held when these claims were made, at the
    /// same index and age rank (the caller's check); then the result is what
    /// [`SortedClaims::new`] gives, at the cost of sorting the replaced groups' claims alone.
    pub fn patch(self, groups: &[&[RouteCandidate]], replaced: &[usize]) -> Self {
        let mut stale = vec![false; groups.len()];
        for &group in replaced {
            stale[group] = true;
        }
        let mut kept = self.0;
        kept.retain(|c| stale.get(c.group as usize) == Some(&false));
        let mut fresh = Vec::new();
        for &group in replaced {
            push_claims(groups, group, &mut fresh);
        }
        // Any fresh claim serves as a placeholder for the slots the merge below fills.
        let Some(last) = fresh.last().cloned() else {
            return SortedClaims(kept);
        };
        fresh.sort_unstable_by(|a, b| claim_order(groups, a, b));
        // Merged in place from the back, the largest first: the kept claims above each fresh
        // one move up by the fresh ones still to place (a copy of the claims took 3.8 MB
        // beside them at 10 000 Ingresses). Each placeholder slot is overwritten once.
        let mut below = kept.len();
        let mut free = below + fresh.len();
        kept.resize(free, last);
        while let Some(claim) = fresh.pop() {
            while below > 0 && claim_order(groups, &kept[below - 1], &claim).is_gt() {
                kept.swap(below - 1, free - 1);
                below -= 1;
                free -= 1;
            }
            kept[free - 1] = claim;
            free -= 1;
        }
        SortedClaims(kept)
    }
}

/// FNV-1a: a few instructions a byte, and no dependency.
pub(super) fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn push_claims(groups: &[&[RouteCandidate]], group: usize, claims: &mut Vec<MapClaim>) {
    let group_index = u32::try_from(group).unwrap_or(u32::MAX);
    for (index, route) in groups[group].iter().enumerate() {
        if route.canary.is_some() {
            continue;
        }
        entries(route, |table, key, specificity| {
            let mut first = [0u8; 8];
            let n = key.len().min(8);
            first[..n].copy_from_slice(&key.as_bytes()[..n]);
            claims.push(MapClaim {
                table,
                specificity,
                group: group_index,
                route: u32::try_from(index).unwrap_or(u32::MAX),
                prefix: u64::from_be_bytes(first),
                hash: key_hash(&key),
                key: key.into(),
                value: route.value.clone(),
            });
        });
    }
}

/// What the regular keys need of the frontends: the lookup steps for the kinds of host they
/// have besides exact ones, and the built-in 503 backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupNeeds {
    /// Some key's host is a wildcard (`*.`).
    pub wildcard: bool,
    /// Some key has no host (it starts with the path's `/`).
    pub none: bool,
    /// Some key leads to the Gateway API's built-in 500 backend.
    pub invalid: bool,
    /// Some key leads to [`UNAVAILABLE_BACKEND`].
    pub unavailable: bool,
}

/// Builds the routing maps from `claims`, the sorted claims of the routes of `groups`, and
/// says what their keys need of the frontends.
pub fn build_maps(
    groups: &[&[RouteCandidate]],
    claims: &SortedClaims,
    diags: &mut Diagnostics,
) -> (RouteMaps, LookupNeeds) {
    let route = |c: &MapClaim| &groups[c.group as usize][c.route as usize];
    // Sized once: as many entries as claims, but for keys claimed more than once.
    let exact = claims.0.iter().filter(|c| c.table == Table::Exact).count();
    let mut maps = RouteMaps {
        exact: Vec::with_capacity(exact),
        prefix: Vec::with_capacity(claims.0.len() - exact),
        ..RouteMaps::default()
    };
    let mut kinds = LookupNeeds::default();
    let mut rest = claims.0.as_slice();
    while let Some(first) = rest.first() {
        // A host is a DNS name or `*.` and one: a key's first byte tells its kind, and the
        // claim holds it (no key is read from memory).
        match first.prefix.to_be_bytes()[0] {
            b'*' => kinds.wildcard = true,
            b'/' => kinds.none = true,
            _ => {}
        }
        let same = rest[1..]
            .iter()
            .position(|c| {
                (c.table, c.prefix, c.hash) != (first.table, first.prefix, first.hash)
                    || !same_str(&c.key, &first.key)
            })
            .map_or(rest.len(), |n| n + 1);
        let (claimants, tail) = rest.split_at(same);
        rest = tail;
        // Routes are read only where several claim a key (their values are in the claims).
        if claimants.len() > 1 {
            let winner = route(first);
            for loser in claimants[1..].iter().map(route) {
                if loser.value == winner.value || loser.ingress == winner.ingress {
                    continue;
                }
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
        // A length first: most values are longer or shorter.
        kinds.unavailable |=
            first.value.len() == UNAVAILABLE_BACKEND.len() && &*first.value == UNAVAILABLE_BACKEND;
        kinds.invalid |= &*first.value == INVALID_BACKEND;
        let entry = MapEntry {
            key: first.key.clone(),
            value: first.value.clone(),
        };
        match first.table {
            Table::Exact => maps.exact.push(entry),
            Table::Prefix => maps.prefix.push(entry),
        }
    }
    (maps, kinds)
}

/// The ssl-redirect map of `redirects` (host → code, or `code:port` with `ssl-redirect-port`;
/// the oldest Ingress' choice winning), the codes in use without a port, those with one, and
/// the conflicts, reported on the younger Ingresses.
pub fn redirect_map(
    redirects: &[RedirectClaim],
    diags: &mut Diagnostics,
) -> (Vec<MapEntry>, Vec<u16>, Vec<RedirectPort>) {
    type Claim<'r> = (usize, u16, Option<u16>, &'r ObjectRef);
    let mut by_host: BTreeMap<&str, Vec<Claim<'_>>> = BTreeMap::new();
    for r in redirects {
        by_host
            .entry(&r.host)
            .or_default()
            .push((r.rank, r.code, r.port, &r.ingress));
    }
    let mut codes = BTreeSet::new();
    let mut ported = BTreeSet::new();
    let mut entries = Vec::with_capacity(by_host.len());
    for (host, mut claims) in by_host {
        claims.sort();
        let (_, code, port, winner) = claims[0];
        for (_, other_code, other_port, ingress) in &claims[1..] {
            if *ingress == winner {
                continue;
            }
            if *other_code != code {
                diags.object(
                    Severity::Warning,
                    ingress,
                    "annotation ssl-redirect-code",
                    format!("host {host} already redirects with code {code} (set by {winner})"),
                );
            }
            if *other_port != port {
                let to =
                    port.map_or_else(|| "the default port".to_string(), |p| format!("port {p}"));
                diags.object(
                    Severity::Warning,
                    ingress,
                    "annotation ssl-redirect-port",
                    format!("host {host} already redirects to {to} (set by {winner})"),
                );
            }
        }
        let value = match port {
            None => {
                codes.insert(code);
                code.to_string()
            }
            Some(port) => {
                let target = RedirectPort { code, port };
                ported.insert(target);
                target.map_value()
            }
        };
        entries.push(MapEntry {
            key: host.into(),
            value: value.into(),
        });
    }
    (
        entries,
        codes.into_iter().collect(),
        ported.into_iter().collect(),
    )
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
    let index = CanaryIndex::new(&canary_keys);
    let mut claims: Claims<'_> = BTreeMap::new();
    for route in routes.iter().copied() {
        entries(route, |table, key, specificity| {
            if route.canary.is_none() {
                let overlaps = index.overlaps(&route.host, &key[route.host.len()..]);
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
        let mut alternatives: Vec<(&Canary, &str)> = Vec::new();
        for (_, _, route) in claimants.iter().filter(|(s, _, _)| *s == best) {
            if let Some(canary) = &route.canary {
                let alternative = (canary.as_ref(), &*route.value);
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
                    .map(|(canary, route)| CanaryRoute {
                        set: set.clone(),
                        route: route.to_string(),
                        condition: canary.condition.clone(),
                        and: canary.and.clone(),
                    })
                    .collect()
            });
            set
        };
        let entry = MapEntry {
            key: format!("{CANARY_KEY_PREFIX}{key}").into(),
            value: value.into(),
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
/// The canary keys (host, path) by host, and the hosts by the wildcard that covers them, so
/// that a route looks only at the canaries of the hosts it overlaps (see `hosts_overlap`),
/// not at every canary.
struct CanaryIndex<'k> {
    keys: &'k [(&'k str, String)],
    by_host: HashMap<&'k str, Vec<&'k str>>,
    by_wildcard: HashMap<String, Vec<&'k str>>,
}

impl<'k> CanaryIndex<'k> {
    fn new(keys: &'k [(&'k str, String)]) -> Self {
        let mut by_host: HashMap<&str, Vec<&str>> = HashMap::new();
        let mut by_wildcard: HashMap<String, Vec<&str>> = HashMap::new();
        for (host, path) in keys {
            let paths = by_host.entry(host).or_default();
            if paths.is_empty() && !host.is_empty() && !host.starts_with("*.") {
                by_wildcard.entry(wildcard_of(host)).or_default().push(host);
            }
            paths.push(path.as_str());
        }
        CanaryIndex {
            keys,
            by_host,
            by_wildcard,
        }
    }

    /// Whether a canary's key overlaps `host` and `path` (one path a prefix of the other).
    fn overlaps(&self, host: &str, path: &str) -> bool {
        let on = |canary: &&str| path.starts_with(canary) || canary.starts_with(path);
        if host.is_empty() {
            return self.keys.iter().any(|(_, p)| on(&p.as_str()));
        }
        let wildcard = wildcard_of(host);
        let covered = self.by_wildcard.get(host).into_iter().flatten().copied();
        [host, "", wildcard.as_str()]
            .into_iter()
            .chain(covered)
            .filter_map(|h| self.by_host.get(h))
            .any(|paths| paths.iter().any(on))
    }
}

#[cfg(test)]
fn hosts_overlap(a: &str, b: &str) -> bool {
    a == b || a.is_empty() || b.is_empty() || wildcard_of(a) == b || wildcard_of(b) == a
}

/// The wildcard host that covers `host` (`a.example.com` → `*.example.com`); a wildcard
/// covers itself.
fn wildcard_of(host: &str) -> String {
    if host.starts_with("*.") {
        host.to_string()
    } else {
        host.split_once('.')
            .map_or_else(|| "*".to_string(), |(_, rest)| format!("*.{rest}"))
    }
}

/// `a` + the first 10 hex digits of the SHA-256 of the set's conditions and routes.
fn canary_set_id(alternatives: &[(&Canary, &str)]) -> String {
    // One condition hashes as `route-acl` always has: `[condition, route]`.
    let parts: Vec<serde_json::Value> = alternatives
        .iter()
        .map(|(c, route)| {
            if c.and.is_empty() {
                serde_json::json!([c.condition, route])
            } else {
                serde_json::json!([c.condition, c.and, route])
            }
        })
        .collect();
    let json = serde_json::to_string(&parts).unwrap_or_default();
    let digest = Sha256::digest(json.as_bytes());
    let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    format!("a{hex}")
}

/// How messages name a rule's host.
pub fn host_name(host: &str) -> String {
    if host.is_empty() {
        "the empty host (rules without one)".to_string()
    } else {
        format!("host {host}")
    }
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

    #[test]
    fn the_canary_index_finds_what_comparing_every_canary_finds() {
        let hosts = [
            "",
            "a.example.com",
            "b.example.com",
            "*.example.com",
            "x.a.example.com",
            "*.a.example.com",
            "example.com",
            "other.org",
            "localhost",
        ];
        let paths = ["/", "/api", "/api/v1", "/web", "/apiary"];
        // Every subset of hosts in turn holds canaries, at two paths.
        for mask in 0..(1_u32 << hosts.len()) {
            let keys: Vec<(&str, String)> = hosts
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .flat_map(|(i, h)| {
                    [
                        (*h, paths[i % paths.len()].to_string()),
                        (*h, "/api/v1".to_string()),
                    ]
                })
                .collect();
            let index = CanaryIndex::new(&keys);
            for host in hosts {
                for path in paths {
                    let plain = keys.iter().any(|(h, p)| {
                        hosts_overlap(host, h)
                            && (path.starts_with(p.as_str()) || p.starts_with(path))
                    });
                    assert_eq!(
                        index.overlaps(host, path),
                        plain,
                        "{host}{path} in {keys:?}"
                    );
                }
            }
        }
    }

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
        let groups = [&routes[..]];
        let (maps, _) = build_maps(&groups, &SortedClaims::new(&groups), &mut diags);
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
    fn host_kinds_follow_the_regular_keys() {
        let kinds = |routes: &[RouteCandidate]| {
            let groups = [routes];
            build_maps(
                &groups,
                &SortedClaims::new(&groups),
                &mut Diagnostics::new(),
            )
            .1
        };
        let mut routes = vec![
            route("a.com", "/", PathKind::Prefix, "a", 0),
            route("b.com", "/x", PathKind::Exact, "b", 0),
        ];
        assert_eq!(kinds(&routes), LookupNeeds::default());
        // A canary route makes no regular key: its wildcard host needs no regular step.
        let mut canary = route("*.a.com", "/", PathKind::Prefix, "c", 1);
        canary.canary = Some(Box::new(Canary::one(
            crate::values::parse_route_acl("cookie(staging) -m found").unwrap(),
        )));
        routes.push(canary);
        assert_eq!(kinds(&routes), LookupNeeds::default());
        routes.push(route("*.b.com", "/x", PathKind::Exact, "w", 0));
        let wildcard = LookupNeeds {
            wildcard: true,
            ..LookupNeeds::default()
        };
        assert_eq!(kinds(&routes), wildcard);
        routes.push(route("", "/api", PathKind::ImplementationSpecific, "n", 0));
        let both = LookupNeeds {
            wildcard: true,
            none: true,
            ..LookupNeeds::default()
        };
        assert_eq!(kinds(&routes), both);
        // In the exact map alone (an Exact path), and a key claimed twice, count the same.
        let only_exact = [
            route("", "/x", PathKind::Exact, "n", 0),
            route("", "/x", PathKind::Exact, "m", 1),
        ];
        let none = LookupNeeds {
            none: true,
            ..LookupNeeds::default()
        };
        assert_eq!(kinds(&only_exact), none);
    }

    #[test]
    fn an_unavailable_path_keeps_its_keys_and_needs_the_503_backend() {
        let build = |routes: &[RouteCandidate]| {
            let groups = [routes];
            build_maps(
                &groups,
                &SortedClaims::new(&groups),
                &mut Diagnostics::new(),
            )
        };
        let show = |v: &[MapEntry]| {
            v.iter()
                .map(|e| format!("{} {}", e.key, e.value))
                .collect::<Vec<_>>()
        };
        // /admin's Service is missing: /admin and /admin/... answer 503, not the host's `/`.
        let routes = [
            route("a.com", "/", PathKind::Prefix, "site", 0),
            route("a.com", "/admin", PathKind::Prefix, UNAVAILABLE_BACKEND, 0),
        ];
        let (maps, needs) = build(&routes);
        assert_eq!(show(&maps.exact), ["a.com/admin portcullis_unavailable"]);
        assert_eq!(
            show(&maps.prefix),
            ["a.com/ site", "a.com/admin/ portcullis_unavailable"]
        );
        assert!(needs.unavailable);
        // It takes part in precedence as any path: an older Ingress' path to a Service
        // keeps the key, and then nothing leads to the 503 backend.
        let shadowed = [
            route("a.com", "/admin", PathKind::Prefix, "admin", 0),
            route("a.com", "/admin", PathKind::Prefix, UNAVAILABLE_BACKEND, 1),
        ];
        let (maps, needs) = build(&shadowed);
        assert_eq!(show(&maps.exact), ["a.com/admin admin"]);
        assert!(!needs.unavailable);
    }

    #[test]
    fn canary_routes_get_the_canary_part_of_the_maps() {
        let condition = crate::values::parse_route_acl("cookie(staging) -m found").unwrap();
        let canary = |host: &str, path: &str, kind: PathKind, value: &str, rank: usize| {
            let mut r = route(host, path, kind, value, rank);
            r.canary = Some(Box::new(Canary::one(condition.clone())));
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
        let groups = [&routes[..]];
        let (mut maps, _) = build_maps(&groups, &SortedClaims::new(&groups), &mut diags);
        let routes: Vec<&RouteCandidate> = routes.iter().collect();
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
        let regular: Vec<RouteCandidate> = routes[..4].iter().map(|r| (*r).clone()).collect();
        let groups = [&regular[..]];
        let (mut plain, _) = build_maps(&groups, &SortedClaims::new(&groups), &mut diags);
        let before = plain.clone();
        assert!(build_canaries(&routes[..4], &mut plain).is_empty());
        assert_eq!(plain, before);
    }

    /// A route of Ingress `group` from small numbers: few hosts and paths, so that routes
    /// of different Ingresses claim the same keys.
    fn small_route(
        group: usize,
        index: usize,
        (host, path, kind, value): (u8, u8, u8, u8),
    ) -> RouteCandidate {
        let mut r = route(
            ["", "a.com", "*.a.com", "b.com"][usize::from(host % 4)],
            ["/", "/x", "/x/", "/xy"][usize::from(path % 4)],
            [
                PathKind::Exact,
                PathKind::Prefix,
                PathKind::ImplementationSpecific,
            ][usize::from(kind % 3)],
            ["s1", "s2", "s3"][usize::from(value % 3)],
            group,
        );
        r.field = format!("spec.rules[0].http.paths[{index}]");
        r
    }

    fn small_groups(specs: &[Vec<(u8, u8, u8, u8)>]) -> Vec<Vec<RouteCandidate>> {
        specs
            .iter()
            .enumerate()
            .map(|(g, routes)| {
                routes
                    .iter()
                    .enumerate()
                    .map(|(i, spec)| small_route(g, i, *spec))
                    .collect()
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..proptest::prelude::ProptestConfig::default() })]
        /// Patching the last run's claims after some Ingresses were replaced, the youngest
        /// removed and new ones added gives the claims, maps and warnings of sorting them all.
        #[test]
        fn patched_claims_are_the_claims_sorted_again(
            before in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<(u8, u8, u8, u8)>(), 0..4), 0..8),
            replace in proptest::collection::vec(proptest::prelude::any::<(proptest::sample::Index, Vec<(u8, u8, u8, u8)>)>(), 0..3),
            removed in 0usize..3,
            added in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<(u8, u8, u8, u8)>(), 0..4), 0..3),
        ) {
            let old_groups = small_groups(&before);
            let old: Vec<&[RouteCandidate]> = old_groups.iter().map(Vec::as_slice).collect();
            let claims = SortedClaims::new(&old);

            let mut after = before.clone();
            after.truncate(before.len().saturating_sub(removed));
            let mut replaced = std::collections::BTreeSet::new();
            if !after.is_empty() {
                for (index, routes) in &replace {
                    let g = index.index(after.len());
                    after[g].clone_from(routes);
                    after[g].truncate(4);
                    replaced.insert(g);
                }
            }
            for routes in added {
                replaced.insert(after.len());
                after.push(routes);
            }
            let new_groups = small_groups(&after);
            let new: Vec<&[RouteCandidate]> = new_groups.iter().map(Vec::as_slice).collect();
            let replaced: Vec<usize> = replaced.into_iter().collect();

            let patched = claims.patch(&new, &replaced);
            let sorted = SortedClaims::new(&new);
            proptest::prop_assert_eq!(&patched, &sorted);
            let (mut d1, mut d2) = (Diagnostics::new(), Diagnostics::new());
            let maps = build_maps(&new, &patched, &mut d1);
            let expected = build_maps(&new, &sorted, &mut d2);
            proptest::prop_assert_eq!(maps, expected);
            proptest::prop_assert_eq!(d1.into_sorted(), d2.into_sorted());
        }
    }
}
