//! Reuse of the last run's translation, as one layer around [`super::translate_ingress`] and
//! [`super::assemble_backend`]: a run after changes to Ingresses, EndpointSlices and Gateway
//! API objects alone takes the part of every Ingress that is the same object as before (the
//! store shares an unchanged object as the same `Arc`), and of every HTTP backend registered
//! with the same inputs whose Service's endpoints did not move, and of every HTTPRoute made
//! from the same inputs (`gateway::http::RouteInputs`: the object, what its Gateways made
//! of it, its age ranks, its backend refs as they resolve). It patches the last run's
//! Ingress order, map claims and registration order where only the replaced parts moved, and
//! takes the last HTTPS side whole while every part contributes to it what the one at its
//! rank did. Anything
//! else is made by the pure functions, as a run from scratch makes it; `tests/memo.rs`
//! compares warm pipelines with fresh ones.
//!
//! A translation also says how far it stays valid besides its store ([`Reuse`]): the
//! pipeline redoes only the servers of the backends whose endpoints moved while it holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use super::RunInputs;
use super::backends::ResolvedPort;
use super::class::{ClassFilter, HostOwners};
use super::gateway::http::RouteInputs;
use super::parts::{
    BackendPart, Carried, IngressOrder, IngressPart, Parts, PartsTls, RedirectMap, Registration,
    RegistrationOrder, TlsKept, TlsMain,
};
use super::routes::{RouteCandidate, SortedClaims};
use crate::objects::Key;
use crate::store::Store;

/// What a run may take from the last one: its parts, valid as long as nothing but Ingresses,
/// EndpointSlices and Gateway API objects (read by the HTTPRoutes' parts alone, which are
/// taken only when made from the same inputs) changed since (the caller's check), except the backends of the Services
/// whose endpoints moved.
#[derive(Debug, Clone, Copy)]
pub struct Prior<'p> {
    pub parts: &'p Parts,
    pub moved_endpoints: &'p BTreeSet<Key>,
    /// The Ingresses that changed since (added, changed or removed).
    pub changed_ingresses: &'p BTreeSet<Key>,
}

/// One run's reuse: what it may take from the last run, and the parts it made or took, for
/// the next. A run from scratch has nothing to take and keeps its parts all the same.
#[derive(Debug, Default)]
pub(super) struct Incremental<'p> {
    prior: Option<Prior<'p>>,
    /// What the last run left to patch (see [`Parts::take_carried`]).
    carried: Carried,
    /// The age ranks of the Ingress parts this run made rather than took, ascending.
    replaced_ranks: Vec<usize>,
    /// How far the lookup of the last run's backend parts has gone ([`Prior::backend`]).
    backend_cursor: usize,
    /// Whether every Ingress part so far contributes to the HTTPS side what the part at its
    /// rank in the last run did (see [`super::parts::PartsTls`]).
    tls_same: bool,
    /// Parts made or taken, for the next run.
    kept: Parts,
}

impl<'p> Incremental<'p> {
    /// A run that may take from `prior` and patch what the last run left in `carried`.
    pub(super) fn new(prior: Option<Prior<'p>>, carried: Carried) -> Self {
        Incremental {
            prior,
            carried: if prior.is_some() {
                carried
            } else {
                Carried::default()
            },
            tls_same: prior.is_some_and(|p| p.parts.tls.is_some()),
            ..Incremental::default()
        }
    }

    /// Whether the run takes anything from the last one.
    pub(super) fn takes(&self) -> bool {
        self.prior.is_some()
    }

    /// The Ingresses of the class in the order translation takes them (see
    /// [`IngressOrder`]): the last run's with the changed Ingresses moved, when it holds.
    pub(super) fn ingress_order(&mut self, store: &Store, filter: &ClassFilter) -> IngressOrder {
        match (self.prior, self.carried.ingress_order.take()) {
            (Some(prior), Some(order)) => order.patch(
                prior.changed_ingresses,
                |key| store.ingress(key).cloned(),
                |i| filter.accepts(i),
            ),
            _ => IngressOrder::new(store.ingresses(), |i| filter.accepts(i)),
        }
    }

    /// Kept for the next run to patch.
    pub(super) fn keep_ingress_order(&mut self, order: IngressOrder) {
        self.kept.ingress_order = Some(order);
    }

    /// At most how many Ingresses the run translates: the changed ones, after changes.
    pub(super) fn to_translate_at_most(&self) -> usize {
        self.prior
            .map_or(usize::MAX, |prior| prior.changed_ingresses.len())
    }

    /// The last run's part of this very Ingress object, when the hosts it names still belong
    /// where they did then (`--host-ownership=namespace`: an older Ingress may have come or
    /// gone).
    pub(super) fn ingress(
        &self,
        rank: usize,
        key: &Key,
        ingress: &Arc<Ingress>,
        owners: Option<&HostOwners>,
    ) -> Option<&'p Arc<IngressPart>> {
        let part = self.prior?.ingress(rank, ingress)?;
        let holds = |(host, owner): &(String, Option<Arc<str>>)| {
            let now = owners.and_then(|o| o.foreign(host, &key.namespace));
            now == owner.as_ref()
        };
        part.host_verdicts.iter().all(holds).then_some(part)
    }

    /// The part taken for the Ingress at age rank `rank`: that same part when it kept its
    /// rank, else a copy at the new one.
    pub(super) fn took_ingress(
        &mut self,
        rank: usize,
        part: &Arc<IngressPart>,
    ) -> Arc<IngressPart> {
        if part.rank != rank {
            // Its claims and registrations in the last run's order are at another rank, and
            // so are its HTTPS claims in the last run's (the part now at its old rank may
            // contribute something else).
            self.carried.claims = None;
            self.carried.registrations = None;
            self.tls_same = false;
        }
        self.kept.ingresses_taken += 1;
        self.keep_ingress(rank, part.at_rank(rank), true)
    }

    /// The part made for the Ingress at age rank `rank`; `keep` says whether the next run
    /// may take it (not when a hook call was stopped).
    pub(super) fn made_ingress(
        &mut self,
        rank: usize,
        part: IngressPart,
        keep: bool,
    ) -> Arc<IngressPart> {
        self.replaced_ranks.push(rank);
        if self.tls_same {
            self.tls_same = self.contributes_as_before(rank, &part);
        }
        self.keep_ingress(rank, Arc::new(part), keep)
    }

    fn keep_ingress(
        &mut self,
        rank: usize,
        part: Arc<IngressPart>,
        keep: bool,
    ) -> Arc<IngressPart> {
        debug_assert_eq!(self.kept.ingresses.len(), rank, "parts are kept by rank");
        self.kept.ingresses.push(keep.then(|| part.clone()));
        part
    }

    /// Whether the new `part` at `rank` contributes to the HTTPS side what the last run's
    /// part at that rank did (nothing, when the last run had none there).
    fn contributes_as_before(&self, rank: usize, part: &IngressPart) -> bool {
        let Some(prior) = self.prior else {
            return false;
        };
        match prior.parts.ingresses.get(rank) {
            Some(Some(before)) => before.same_tls(part),
            Some(None) => false,
            None => !part.has_tls(),
        }
    }

    /// The last run's HTTPS side, when every Ingress part of this run (`parts` of them)
    /// contributes to it what the one at its rank did, and the last run's parts beyond
    /// contributed nothing (Ingresses went away at the end).
    fn prior_https(&self, parts: usize) -> Option<&'p TlsKept> {
        let prior = self.prior.filter(|_| self.tls_same)?;
        let dropped_nothing = prior
            .parts
            .ingresses
            .iter()
            .skip(parts)
            .all(|p| p.as_ref().is_some_and(|p| !p.has_tls()));
        prior.parts.tls.as_ref().filter(|_| dropped_nothing)
    }

    /// What the Ingress parts contribute to the HTTPS side ([`PartsTls::gather`]): the last
    /// run's when they contribute the same.
    pub(super) fn parts_tls(&self, parts: &[Arc<IngressPart>]) -> Arc<PartsTls> {
        match self.prior_https(parts.len()) {
            Some(kept) => kept.parts.clone(),
            None => Arc::new(PartsTls::gather(parts)),
        }
    }

    /// The HTTPS side made from `parts_tls` (gathered from `parts`) and `main`: the
    /// ssl-redirect map when `redirects_on` ([`RedirectMap::build`]) and the TLS settings
    /// ([`TlsMain::tls`]), each the last run's when made from the same. Kept for the next run.
    pub(super) fn https(
        &mut self,
        parts: &[Arc<IngressPart>],
        parts_tls: Arc<PartsTls>,
        main: TlsMain,
        redirects_on: bool,
    ) -> &TlsKept {
        let prior = self.prior_https(parts.len());
        let redirects = redirects_on.then(|| match prior.and_then(|k| k.redirects.clone()) {
            Some(kept) => kept,
            None => Arc::new(RedirectMap::build(&parts_tls.redirects)),
        });
        // Thousands of certificate files are not gathered and compared again.
        let tls = match prior.filter(|kept| kept.main == main) {
            Some(kept) => kept.tls.clone(),
            None => Arc::new(main.tls(&parts_tls, parts)),
        };
        self.kept.tls.insert(TlsKept {
            parts: parts_tls,
            main,
            tls,
            redirects,
        })
    }

    /// The sorted map claims of the routes `groups` (one per Ingress part, in age order): the
    /// last run's with the replaced parts' claims moved, when every part taken kept its rank.
    /// Kept for the next run.
    pub(super) fn claims(&mut self, groups: &[&[RouteCandidate]]) -> &SortedClaims {
        let claims = match self.carried.claims.take() {
            Some(claims) => claims.patch(groups, &self.replaced_ranks),
            None => SortedClaims::new(groups),
        };
        self.kept.claims.insert(claims)
    }

    /// The Ingress parts' backend registrations in order, as [`Self::claims`]. Kept for the
    /// next run.
    pub(super) fn registration_order(&mut self, parts: &[Arc<IngressPart>]) -> &RegistrationOrder {
        let order = match self.carried.registrations.take() {
            Some(order) => order.patch(parts, &self.replaced_ranks),
            None => RegistrationOrder::new(parts),
        };
        self.kept.registrations.insert(order)
    }

    /// The last run's part of backend `build.name` when it was assembled from what `build`
    /// holds and its Service's endpoints did not move. Asked for in name order.
    pub(super) fn backend(&mut self, build: &Arc<Registration>) -> Option<&'p Arc<BackendPart>> {
        self.prior?.backend(build, &mut self.backend_cursor)
    }

    /// The part of an HTTP backend, taken (`taken`) or made; `keep` says whether the next
    /// run may take it. Given in name order.
    pub(super) fn keep_backend(&mut self, part: &Arc<BackendPart>, taken: bool, keep: bool) {
        if taken {
            self.kept.backends_taken += 1;
        }
        if keep {
            debug_assert!(
                self.kept
                    .backends
                    .last()
                    .is_none_or(|p| p.build.name < part.build.name)
            );
            self.kept.backends.push(part.clone());
        }
    }

    /// The last run's part of HTTPRoute `key`, when it was made from `inputs`.
    pub(super) fn route(&self, key: &Key, inputs: &RouteInputs) -> Option<&'p Arc<IngressPart>> {
        let (was, part) = self.prior?.parts.routes.get(key)?;
        (was == inputs).then_some(part)
    }

    /// The part taken for an HTTPRoute, at the age rank it had (its inputs hold the rank).
    pub(super) fn took_route(&mut self, rank: usize, part: &Arc<IngressPart>) -> Arc<IngressPart> {
        debug_assert_eq!(part.rank, rank);
        self.kept.routes_taken += 1;
        self.keep_ingress(rank, part.clone(), true)
    }

    /// Keeps an HTTPRoute's part, made from `inputs`, for the next run; a part taken keeps
    /// its inputs from the last run.
    pub(super) fn keep_route(&mut self, key: Key, inputs: RouteInputs, part: &Arc<IngressPart>) {
        self.kept.routes.insert(key, (inputs, part.clone()));
    }

    /// The parts this run made or took, for the next.
    pub(super) fn into_parts(self) -> Parts {
        self.kept
    }
}

impl<'p> Prior<'p> {
    /// The part made from this very Ingress object, which is now at age rank `rank`.
    fn ingress(self, rank: usize, ingress: &Arc<Ingress>) -> Option<&'p Arc<IngressPart>> {
        let ingresses = &self.parts.ingresses;
        let made_from = |rank: usize| {
            ingresses
                .get(rank)
                .and_then(Option::as_ref)
                .filter(|p| Arc::ptr_eq(&p.ingress, ingress))
        };
        if let Some(part) = made_from(rank) {
            return Some(part);
        }
        // The Ingress at this rank in the last run, changed: no other part was made from
        // this object (and the index below is not needed).
        let same_name = |p: &Arc<IngressPart>| {
            p.ingress.metadata.name == ingress.metadata.name
                && p.ingress.metadata.namespace == ingress.metadata.namespace
        };
        if ingresses
            .get(rank)
            .and_then(Option::as_ref)
            .is_some_and(same_name)
        {
            return None;
        }
        // Another rank: an older Ingress came or went.
        let ranks = self.parts.ingress_ranks.get_or_init(|| {
            ingresses
                .iter()
                .enumerate()
                .filter_map(|(rank, p)| Some((Arc::as_ptr(&p.as_ref()?.ingress) as usize, rank)))
                .collect::<HashMap<_, _>>()
        });
        made_from(*ranks.get(&(Arc::as_ptr(ingress) as usize))?)
    }

    /// The part of backend `build.name` when it was assembled from what `build` holds and
    /// its Service's endpoints did not move. Names are asked for in ascending order: `cursor`
    /// (0 for the first) keeps the place reached in the parts, which are in that order too.
    fn backend(
        self,
        build: &Arc<Registration>,
        cursor: &mut usize,
    ) -> Option<&'p Arc<BackendPart>> {
        let backends = &self.parts.backends;
        // The usual case: the next part was made from this very registration (of an Ingress
        // part taken from the last run), so neither the names nor the contents are read.
        let same = backends
            .get(*cursor)
            .is_some_and(|p| Arc::ptr_eq(&p.build, build));
        if !same {
            let name = build.name.as_str();
            while backends
                .get(*cursor)
                .is_some_and(|p| p.build.name.as_str() < name)
            {
                *cursor += 1;
            }
        }
        let part = backends
            .get(*cursor)
            .filter(|p| same || (p.build.name == build.name && p.build.matches(build)))?;
        // Names are asked for in ascending order: this part is not asked for again.
        *cursor += 1;
        let moved =
            !self.moved_endpoints.is_empty() && self.moved_endpoints.contains(&build.service);
        (!moved).then_some(part)
    }
}

/// How far a translation stays valid besides its store: which backends follow which Service's
/// endpoints, until when its time-dependent messages hold, and which previous certificates it
/// read.
#[derive(Debug, Clone, Default)]
pub struct Reuse {
    /// Service → the backends (name, port) whose servers are its endpoints.
    pub endpoint_users: EndpointUsers,
    /// Whether the run knew the time, and the first second at which a certificate expiry
    /// message would read differently.
    pub knew_time: bool,
    pub stable_until: Option<i64>,
    /// The previous certificates the run consulted (for invalid Secrets), as they were.
    pub previous_read: Vec<(Key, Option<crate::model::PemFile>)>,
    /// The resolver's answers the run used.
    pub external_names: Option<Arc<super::exposure::ResolvedNames>>,
    /// The refused certificates the run left out.
    pub refused_certificates: Arc<BTreeMap<crate::model::CertPath, String>>,
    /// The refused TLS keys the run left out.
    pub refused_tls_keys: Arc<crate::policy::global_keys::RefusedTlsKeys>,
}

/// The backends whose servers are a Service's endpoints. Plain lists, searched in one pass
/// for the Services whose endpoints moved: a tree by Service (or a sort) made on every run cost
/// more at 10 000 Services than the rest of a run after an Ingress change, where the pass
/// costs well under a millisecond on the endpoint path. HTTP backends are held as their parts,
/// which the run keeps anyway.
#[derive(Debug, Clone, Default)]
pub struct EndpointUsers {
    http: Vec<Arc<BackendPart>>,
    /// The others (TCP backends): (Service, backend name, port).
    other: Vec<(Key, String, ResolvedPort)>,
}

impl EndpointUsers {
    pub(super) fn add(&mut self, service: &Key, name: &str, port: &ResolvedPort) {
        self.other
            .push((service.clone(), name.to_string(), port.clone()));
    }

    pub(super) fn add_part(&mut self, part: &Arc<BackendPart>) {
        self.http.push(part.clone());
    }

    pub fn is_empty(&self) -> bool {
        self.http.is_empty() && self.other.is_empty()
    }

    /// The backends (Service, name, port) of the Services in `services`.
    pub fn of<'u>(
        &'u self,
        services: &'u BTreeSet<Key>,
    ) -> impl Iterator<Item = (&'u Key, &'u str, &'u ResolvedPort)> {
        let http = self
            .http
            .iter()
            .map(|p| (&p.build.service, p.build.name.as_str(), &p.build.port));
        let other = self
            .other
            .iter()
            .map(|(service, name, port)| (service, name.as_str(), port));
        // A few Services (the usual case) are compared one by one: most backends differ from
        // each at the length of a name, before any tree search.
        let few: Option<Vec<&Key>> = (services.len() <= 16).then(|| services.iter().collect());
        http.chain(other).filter(move |(service, _, _)| match &few {
            Some(keys) => keys.contains(service),
            None => services.contains(*service),
        })
    }
}

impl Reuse {
    /// Whether a run with `inputs` would say and use exactly what this one did, store aside.
    pub fn holds_for(&self, inputs: &RunInputs) -> bool {
        let time_holds = match (inputs.now_unix, self.stable_until) {
            (Some(now), Some(until)) => self.knew_time && now < until,
            (now, None) => now.is_some() == self.knew_time,
            (None, Some(_)) => false,
        };
        time_holds
            && self.external_names == inputs.external_names
            && self.refused_certificates == inputs.refused_certificates
            && self.refused_tls_keys == inputs.refused_tls_keys
            && self
                .previous_read
                .iter()
                .all(|(key, pem)| inputs.previous_certificates.get(key) == pem.as_ref())
    }
}
