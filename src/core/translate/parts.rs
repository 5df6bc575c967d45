//! Translation parts: what each Ingress contributed (routes, redirects, TLS entries, the
//! backends it registered, its diagnostics) and each HTTP backend as it came out, and the
//! orders a run makes of them. [`super::incremental`] keeps them from one run to the next.
//!
//! A part is what [`super::translate_ingress`] or [`super::assemble_backend`] made for that
//! one Ingress or backend; the run
//! absorbs it into its own state exactly as if the translation had happened there (later
//! registrations of a backend leave the first Ingress' annotations in place, capture slots keep
//! the order routes first asked for them), so the output is the same either way. `tests/memo.rs`
//! compares warm pipelines with fresh ones.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::networking::v1::Ingress;

use super::BackendBuild;
use super::auth::Userlists;
use super::backends::ResolvedPort;
use super::routes::{RedirectClaim, RouteCandidate, SortedClaims};
use super::tls_edge::PassthroughClaim;
use crate::diagnostics::Diagnostic;
use crate::model::{Backend, CertPath, CrtListEntry, FrontendCapture, PemFile, RouteSettings, Tls};
use crate::objects::{Key, ObjectRef};

/// What translating one Ingress (its rules and TLS section; its default backend is not part
/// of it) produced, made from `ingress` at age rank `rank`.
#[derive(Debug, Clone)]
pub struct IngressPart {
    pub(super) ingress: Arc<Ingress>,
    pub(super) rank: usize,
    pub(super) routes: Vec<RouteCandidate>,
    /// Whether a route is a canary (`route-acl`).
    pub(super) has_canary: bool,
    pub(super) redirects: Vec<RedirectClaim>,
    pub(super) tls_entries: Vec<CrtListEntry>,
    pub(super) passthrough: Vec<PassthroughClaim>,
    /// Under `--host-ownership=namespace`, each host the rules name and the namespace it
    /// belonged to when it was refused (`None`: it was this Ingress' own). The part is taken
    /// again only while every verdict holds.
    pub(super) host_verdicts: Vec<(String, Option<Arc<str>>)>,
    /// Shared with the backend parts made from them: a backend registered once is looked
    /// up by the address of its registration.
    pub(super) backends: Vec<Arc<Registration>>,
    pub(super) captures: Vec<FrontendCapture>,
    pub(super) userlists: Userlists,
    pub(super) pem_files: Vec<(CertPath, Arc<str>)>,
    pub(super) diagnostics: Vec<Diagnostic>,
    pub(super) previous_read: Vec<(Key, Option<PemFile>)>,
    pub(super) stable_until: Option<i64>,
    /// Operations of the route hooks, charged again when the part is taken.
    pub(super) operations: u64,
}

impl IngressPart {
    /// This part for an Ingress now at age rank `rank`: the same one when the rank is the
    /// same (the usual case: new Ingresses are the youngest), else a copy with the new rank.
    pub(super) fn at_rank(self: &Arc<Self>, rank: usize) -> Arc<Self> {
        if self.rank == rank {
            return self.clone();
        }
        let mut part = IngressPart::clone(self);
        part.rank = rank;
        for r in &mut part.routes {
            r.rank = rank;
        }
        for r in &mut part.redirects {
            r.rank = rank;
        }
        for p in &mut part.passthrough {
            p.rank = rank;
        }
        Arc::new(part)
    }

    /// Whether this part contributes to the HTTPS side what `other` does: the same crt-list
    /// lines, certificate files, ssl-redirect and passthrough claims (age ranks included).
    pub(super) fn same_tls(&self, other: &IngressPart) -> bool {
        self.tls_entries == other.tls_entries
            && self.pem_files == other.pem_files
            && self.redirects == other.redirects
            && self.passthrough == other.passthrough
    }

    /// Whether it contributes anything to the HTTPS side.
    pub(super) fn has_tls(&self) -> bool {
        !(self.tls_entries.is_empty()
            && self.pem_files.is_empty()
            && self.redirects.is_empty()
            && self.passthrough.is_empty())
    }
}

/// What the Ingress parts contribute to the HTTPS side, gathered in age order: crt-list
/// lines (each once), ssl-redirect and passthrough claims. Their certificate files stay in
/// the parts. A run whose parts contribute what the last run's did takes the last one whole
/// (and with it the TLS settings and the ssl-redirect map made from it): at 10 000 Ingresses,
/// gathering some 3 000 TLS hosts' lines and certificates cost a sixth of a run.
#[derive(Debug, Default)]
pub struct PartsTls {
    pub(super) crt_list: Vec<CrtListEntry>,
    pub(super) redirects: Vec<RedirectClaim>,
    pub(super) passthrough: Vec<PassthroughClaim>,
}

impl PartsTls {
    pub(super) fn gather(parts: &[Arc<IngressPart>]) -> Self {
        let mut gathered = PartsTls::default();
        // The crt-list in Ingress age order (oldest first, then spec.tls order), without
        // repeats: a new Ingress appends rather than taking over the first line, which
        // HAProxy serves to clients without SNI and cannot replace without a reload.
        let mut seen = std::collections::HashSet::new();
        for part in parts {
            for entry in &part.tls_entries {
                if seen.insert(entry) {
                    gathered.crt_list.push(entry.clone());
                }
            }
            gathered.redirects.extend(part.redirects.iter().cloned());
            gathered
                .passthrough
                .extend(part.passthrough.iter().cloned());
        }
        gathered
    }

    /// The certificate files of `parts` (which these were gathered from), by path.
    pub(super) fn pem_files(parts: &[Arc<IngressPart>]) -> BTreeMap<&CertPath, &Arc<str>> {
        let mut files = BTreeMap::new();
        for (path, content) in parts.iter().flat_map(|p| &p.pem_files) {
            files.entry(path).or_insert(content);
        }
        files
    }
}

/// The HTTPS side of a run, for the next one to take when nothing it came from changed.
#[derive(Debug)]
pub(super) struct TlsKept {
    pub(super) parts: Arc<PartsTls>,
    /// What besides the parts went into `tls`.
    pub(super) main: TlsMain,
    pub(super) tls: Arc<Tls>,
    /// The ssl-redirect map made from `parts.redirects`, when redirects were on.
    pub(super) redirects: Option<Arc<RedirectMap>>,
}

/// What besides the Ingress parts makes the TLS settings: the default certificate, the
/// certificate files the run itself read (default certificate, TCP objects), the files
/// haproxy.cfg names directly and the HTTPS bind's settings.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TlsMain {
    pub(super) default_certificate: Option<CrtListEntry>,
    pub(super) pem_files: BTreeMap<CertPath, Arc<str>>,
    pub(super) static_files: BTreeMap<CertPath, Arc<str>>,
    pub(super) alpn: Vec<String>,
    pub(super) strict_sni: bool,
    pub(super) client_auth: Option<crate::model::ClientAuth>,
}

impl TlsMain {
    /// The TLS settings of `parts` (gathered from `ingress_parts`) and these.
    pub(super) fn tls(&self, parts: &PartsTls, ingress_parts: &[Arc<IngressPart>]) -> Tls {
        // The default certificate (if any) comes first.
        let crt_list = self
            .default_certificate
            .iter()
            .chain(&parts.crt_list)
            .cloned()
            .collect();
        let mut pem_files = PartsTls::pem_files(ingress_parts);
        for (path, content) in &self.pem_files {
            pem_files.entry(path).or_insert(content);
        }
        let files = |files: BTreeMap<&CertPath, &Arc<str>>| {
            files
                .into_iter()
                .map(|(path, content)| PemFile {
                    path: path.clone(),
                    content: content.clone(),
                })
                .collect()
        };
        Tls {
            pem_files: files(pem_files),
            crt_list,
            alpn: self.alpn.clone(),
            strict_sni: self.strict_sni,
            client_auth: self.client_auth.clone(),
            static_files: files(self.static_files.iter().collect()),
        }
    }
}

/// The ssl-redirect map: an entry per redirected host, the codes in use, and what was wrong.
#[derive(Debug, Default)]
pub(super) struct RedirectMap {
    pub(super) entries: Vec<crate::model::MapEntry>,
    pub(super) codes: Vec<u16>,
    pub(super) ported: Vec<crate::model::RedirectPort>,
    pub(super) diagnostics: Vec<Diagnostic>,
}

impl RedirectMap {
    /// The map of the Ingress parts' ssl-redirect claims ([`PartsTls::redirects`]).
    pub(super) fn build(claims: &[RedirectClaim]) -> Self {
        let mut diags = crate::diagnostics::Diagnostics::new();
        let (entries, codes, ported) = super::routes::redirect_map(claims, &mut diags);
        RedirectMap {
            entries,
            codes,
            ported,
            diagnostics: diags.into_sorted(),
        }
    }
}

/// A backend an Ingress registered, with the route policies its paths put on it. Kept in a
/// flat list: route settings are large (half a kilobyte), and a tree's node holds room for
/// eleven.
#[derive(Debug, Clone)]
pub struct Registration {
    pub(super) name: String,
    pub(super) service: Key,
    pub(super) port: ResolvedPort,
    pub(super) ingress: Option<(ObjectRef, Arc<BTreeMap<String, String>>)>,
    pub(super) policies: Box<[(String, Arc<RouteSettings>)]>,
}

impl Registration {
    pub(super) fn from_build(name: String, build: BackendBuild) -> Self {
        Registration {
            name,
            service: build.service,
            port: build.port,
            ingress: build.ingress,
            policies: build.policies.into_iter().collect(),
        }
    }

    /// The backend `first` and the later registrations of its name make, in order: the
    /// Service port of the first, the first Ingress' annotations, each route policy from the
    /// first registration that has it (as registering them one by one into a table would).
    pub(super) fn merged<'r>(
        first: &Registration,
        registrations: impl Iterator<Item = &'r Registration>,
    ) -> Self {
        let mut ingress = first.ingress.clone();
        let mut policies: BTreeMap<String, Arc<RouteSettings>> =
            first.policies.iter().cloned().collect();
        for registration in registrations {
            if ingress.is_none() {
                ingress.clone_from(&registration.ingress);
            }
            for (id, settings) in &registration.policies {
                policies
                    .entry(id.clone())
                    .or_insert_with(|| settings.clone());
            }
        }
        Registration {
            name: first.name.clone(),
            service: first.service.clone(),
            port: first.port.clone(),
            ingress,
            policies: policies.into_iter().collect(),
        }
    }

    /// The backend being assembled from this registration.
    pub(super) fn to_build(&self) -> BackendBuild {
        BackendBuild {
            service: self.service.clone(),
            port: self.port.clone(),
            ingress: self.ingress.clone(),
            policies: self.policies.iter().cloned().collect(),
        }
    }

    /// Whether `other` holds what this was made from (the name aside). Cheap for a backend
    /// that did not change: its first Ingress' annotations and its route settings are the
    /// same shared values, compared by address first.
    pub(super) fn matches(&self, other: &Registration) -> bool {
        std::ptr::eq(self, other)
            || self.service == other.service
                && self.port == other.port
                && self.ingress == other.ingress
                && self.policies == other.policies
    }
}

/// One HTTP backend as it came out of `build`: the backend (shared with the model), its
/// diagnostics and the files its server TLS settings name.
#[derive(Debug)]
pub struct BackendPart {
    pub(super) build: Arc<Registration>,
    pub(super) backend: Arc<Backend>,
    pub(super) diagnostics: Vec<Diagnostic>,
    pub(super) static_files: Vec<(CertPath, Arc<str>)>,
    /// Whether its servers follow its Service's endpoints (see `Reuse::endpoint_users`).
    pub(super) follows_endpoints: bool,
    /// Operations of the backend hook, charged again when the part is taken.
    pub(super) operations: u64,
}

/// The parts a run made or took, for the next run.
#[derive(Debug, Default)]
pub struct Parts {
    /// Each Ingress' part by its age rank (`None`: not kept). Looked up by rank first: an
    /// Ingress keeps its rank unless an older one came or went.
    pub(super) ingresses: Vec<Option<Arc<IngressPart>>>,
    /// Ranks by the address of the Ingress object a part was made from (kept alive by the
    /// part, so not reused), made when a lookup by rank first misses.
    pub(super) ingress_ranks: OnceLock<HashMap<usize, usize>>,
    /// How many Ingress and backend parts the run that made these took from the run before.
    pub(super) ingresses_taken: usize,
    pub(super) backends_taken: usize,
    /// HTTP backend parts in name order: a run takes them in that order too.
    pub(super) backends: Vec<Arc<BackendPart>>,
    /// The sorted map claims of the run's routes, for the next run that takes these parts
    /// (it takes them: see [`Parts::take_carried`]).
    pub(super) claims: Option<SortedClaims>,
    /// The run's Ingresses in age order, for the next run to patch (taken the same way).
    pub(super) ingress_order: Option<IngressOrder>,
    /// The Ingress parts' backend registrations in order (taken the same way).
    pub(super) registrations: Option<RegistrationOrder>,
    /// The run's HTTPS side (see [`PartsTls`]).
    pub(super) tls: Option<TlsKept>,
    /// Each HTTPRoute's part with what it was made from.
    pub(super) routes: BTreeMap<Key, (super::gateway::http::RouteInputs, Arc<IngressPart>)>,
    /// How many HTTPRoute parts the run that made these took from the run before.
    pub(super) routes_taken: usize,
}

impl Parts {
    /// Drops the parts of the backends `names`, whose servers moved since they were made.
    pub fn forget_backends<'n>(&mut self, names: impl Iterator<Item = &'n str>) {
        for name in names {
            if let Ok(at) = self
                .backends
                .binary_search_by(|p| p.build.name.as_str().cmp(name))
            {
                self.backends.remove(at);
            }
        }
    }

    /// How many HTTPRoute parts the run that made these took from the run before it.
    pub fn routes_taken(&self) -> usize {
        self.routes_taken
    }

    /// How many Ingress parts the run that made these took from the run before it.
    pub fn ingresses_taken(&self) -> usize {
        self.ingresses_taken
    }

    /// How many HTTP backend parts the run that made these took from the run before it.
    pub fn backends_taken(&self) -> usize {
        self.backends_taken
    }

    /// What the next run patches rather than makes again: the sorted map claims and the
    /// Ingress order of the run that made these parts. Taken, not copied (some 60 000 keys and
    /// 10 000 Ingresses at N = 10 000); a run that finds none makes them whole.
    pub fn take_carried(&mut self) -> Carried {
        Carried {
            claims: self.claims.take(),
            ingress_order: self.ingress_order.take(),
            registrations: self.registrations.take(),
        }
    }
}

/// See [`Parts::take_carried`].
#[derive(Debug, Default)]
pub struct Carried {
    pub(super) claims: Option<SortedClaims>,
    pub(super) ingress_order: Option<IngressOrder>,
    pub(super) registrations: Option<RegistrationOrder>,
}

/// The Ingress parts' backend registrations by name, then in the order they happened (age
/// rank, then place in the part). Sorting them on every run read the 10 000 names many times
/// over; a run whose parts kept their ranks moves only the replaced parts' registrations.
#[derive(Debug, Default)]
pub struct RegistrationOrder(Vec<Slot>);

/// The `index`th registration of the part at rank `part`, and a hash of its name (most
/// neighbours differ in it, so grouping by name reads few names).
#[derive(Debug, Clone, Copy)]
struct Slot {
    part: u32,
    index: u32,
    hash: u64,
}

/// A registration in the run's order, with the hash of its name.
pub(super) type InOrder<'r> = (u64, &'r Arc<Registration>);

impl RegistrationOrder {
    pub(super) fn new(parts: &[Arc<IngressPart>]) -> Self {
        let mut slots: Vec<Slot> = (0..parts.len()).flat_map(|p| slots_of(parts, p)).collect();
        slots.sort_unstable_by(|a, b| slot_order(parts, a, b));
        RegistrationOrder(slots)
    }

    /// This order, made for earlier parts, for `parts`: the registrations of the parts at
    /// ranks `replaced` (ascending) put in again, those of parts beyond the end dropped.
    /// Every other part must be the one it was at its rank (the caller's check); then the
    /// result is what [`Self::new`] gives, reading only the replaced parts' names and a few
    /// others.
    pub(super) fn patch(mut self, parts: &[Arc<IngressPart>], replaced: &[usize]) -> Self {
        let mut stale = vec![false; parts.len()];
        for &rank in replaced {
            stale[rank] = true;
        }
        self.0
            .retain(|s| stale.get(s.part as usize) == Some(&false));
        let mut fresh: Vec<Slot> = replaced.iter().flat_map(|&p| slots_of(parts, p)).collect();
        if fresh.is_empty() {
            return self;
        }
        fresh.sort_unstable_by(|a, b| slot_order(parts, a, b));
        let mut merged = Vec::with_capacity(self.0.len() + fresh.len());
        let mut at = 0;
        for slot in fresh {
            let place = self.0[at..].partition_point(|s| slot_order(parts, s, &slot).is_lt()) + at;
            merged.extend_from_slice(&self.0[at..place]);
            merged.push(slot);
            at = place;
        }
        merged.extend_from_slice(&self.0[at..]);
        RegistrationOrder(merged)
    }

    /// Every registration of the run in order: these and `directs` (default backends, each
    /// with the number of parts before it, in the order they happened) merged.
    pub(super) fn with_directs<'r>(
        &self,
        parts: &'r [Arc<IngressPart>],
        directs: &'r [(usize, Arc<Registration>)],
    ) -> Vec<InOrder<'r>> {
        let of = |s: &Slot| (s.hash, &parts[s.part as usize].backends[s.index as usize]);
        let mut sorted: Vec<(usize, &(usize, Arc<Registration>))> =
            directs.iter().enumerate().collect();
        sorted.sort_by(|(i, (ra, a)), (j, (rb, b))| {
            (a.name.as_str(), ra, i).cmp(&(b.name.as_str(), rb, j))
        });
        let mut out = Vec::with_capacity(self.0.len() + directs.len());
        let mut at = 0;
        for (_, (before, direct)) in sorted {
            // A default backend registered before the part at rank `before` comes before that
            // part's registrations of the same name, after the earlier parts'.
            let key = (direct.name.as_str(), *before, 0);
            let place = self.0[at..].partition_point(|s| {
                (of(s).1.name.as_str(), s.part as usize, s.index as usize + 1) < key
            }) + at;
            out.extend(self.0[at..place].iter().map(of));
            out.push((super::routes::key_hash(&direct.name), direct));
            at = place;
        }
        out.extend(self.0[at..].iter().map(of));
        out
    }
}

fn slots_of(parts: &[Arc<IngressPart>], part: usize) -> impl Iterator<Item = Slot> + '_ {
    parts[part]
        .backends
        .iter()
        .enumerate()
        .map(move |(index, r)| Slot {
            part: u32::try_from(part).unwrap_or(u32::MAX),
            index: u32::try_from(index).unwrap_or(u32::MAX),
            hash: super::routes::key_hash(&r.name),
        })
}

/// By name, then age rank, then place in the part.
fn slot_order(parts: &[Arc<IngressPart>], a: &Slot, b: &Slot) -> std::cmp::Ordering {
    let name = |s: &Slot| {
        parts[s.part as usize].backends[s.index as usize]
            .name
            .as_str()
    };
    (name(a), a.part, a.index).cmp(&(name(b), b.part, b.index))
}

/// The Ingresses of the class in the order translation takes them: oldest first, then by
/// namespace and name (where two claim the same thing, the older one wins). Listing and
/// ordering them reads every Ingress object (its class, its creation time): a tenth of a run
/// after an Ingress change at 10 000 Ingresses. A run whose changes since the last are
/// Ingresses and EndpointSlices alone moves only the changed Ingresses in the last order.
#[derive(Debug, Default)]
pub struct IngressOrder(Vec<Ordered>);

#[derive(Debug)]
pub(super) struct Ordered {
    pub(super) created: Option<k8s_openapi::jiff::Timestamp>,
    /// A hash of the key: the changed Ingresses are found without reading every key.
    hash: u64,
    pub(super) key: Key,
    pub(super) ingress: Arc<Ingress>,
}

/// The FNV hash of the map keys (`routes::key_hash`) over the namespace and the name; a
/// collision costs a comparison.
fn key_hash(key: &Key) -> u64 {
    super::routes::key_hash(&key.namespace) ^ super::routes::key_hash(&key.name).rotate_left(32)
}

impl IngressOrder {
    /// The Ingresses of `ingresses` (by key, as the store lists them) that `accepts`.
    pub(super) fn new<'s>(
        ingresses: impl Iterator<Item = (&'s Key, &'s Arc<Ingress>)>,
        accepts: impl Fn(&Ingress) -> bool,
    ) -> Self {
        let mut order: Vec<Ordered> = ingresses
            .filter(|(_, i)| accepts(i))
            .map(|(key, ingress)| Ordered::new(key, ingress))
            .collect();
        // Listed by key: a stable sort on the age alone gives the order (one pass when most
        // have the same age).
        order.sort_by_key(|o| o.created);
        IngressOrder(order)
    }

    /// This order, made from a store, for the store after the Ingresses `changed` changed:
    /// `now` gives each one's object, if it is there now. The result is what [`Self::new`]
    /// gives for the new store when nothing else that decides the order (the class filter)
    /// changed.
    pub(super) fn patch(
        mut self,
        changed: &BTreeSet<Key>,
        now: impl Fn(&Key) -> Option<Arc<Ingress>>,
        accepts: impl Fn(&Ingress) -> bool,
    ) -> Self {
        if changed.is_empty() {
            return self;
        }
        let hashes: Vec<u64> = changed.iter().map(key_hash).collect();
        self.0
            .retain(|o| !(hashes.contains(&o.hash) && changed.contains(&o.key)));
        for key in changed {
            let Some(ingress) = now(key).filter(|i| accepts(i)) else {
                continue;
            };
            let new = Ordered::new(key, &ingress);
            let at = self
                .0
                .partition_point(|o| (o.created, &o.key) < (new.created, &new.key));
            self.0.insert(at, new);
        }
        self
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Ordered> {
        self.0.iter()
    }
}

impl Ordered {
    fn new(key: &Key, ingress: &Arc<Ingress>) -> Self {
        Ordered {
            created: ingress.metadata.creation_timestamp.as_ref().map(|t| t.0),
            hash: key_hash(key),
            key: key.clone(),
            ingress: ingress.clone(),
        }
    }
}
