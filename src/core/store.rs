//! The store: every watched object, indexed by kind and namespace/name.
//!
//! One owner applies changes; readers get an immutable [`Snapshot`]. Maps are ordered so that
//! anything iterating a snapshot does so in the same order on every replica, whatever order the
//! events arrived in. EndpointSlices are indexed by the Service they belong to, so that joining
//! Services to endpoints is a lookup, not a scan.
//!
//! The store also keeps a short journal of what changed, so that a reader that saw it at one
//! [`Mark`] can tell what changed since (see [`Store::changes_since`]): the pipeline uses it to
//! redo only the backends whose endpoints moved.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

use crate::objects::{EndpointSlice, GatewayApi, Key, Kind, Object, Resource, Service, Tcp};

/// An immutable view of the store.
pub type Snapshot = Arc<Store>;

/// How many changes the journal keeps. A reader further behind sees "unknown" and starts over.
const JOURNAL_LEN: usize = 1024;

/// Where a store's history stood: a reader keeps it to ask what changed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Stores built separately never share a history; copies of one store do.
    lineage: u64,
    generation: u64,
}

/// One object inserted, replaced or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: Kind,
    pub key: Key,
    /// For an EndpointSlice: the Service whose endpoints it changed (both the old and the new
    /// one, as two changes, when its Service label moved).
    pub service: Option<Key>,
}

#[derive(Debug, Clone)]
struct Journal {
    lineage: u64,
    generation: u64,
    /// The last changes, each with the generation it made.
    recent: VecDeque<(u64, Change)>,
}

impl Default for Journal {
    fn default() -> Self {
        static LINEAGES: AtomicU64 = AtomicU64::new(1);
        Self {
            lineage: LINEAGES.fetch_add(1, Ordering::Relaxed),
            generation: 0,
            recent: VecDeque::new(),
        }
    }
}

impl Journal {
    fn record(&mut self, kind: Kind, key: &Key, service: Option<Key>) {
        self.generation += 1;
        if self.recent.len() == JOURNAL_LEN {
            self.recent.pop_front();
        }
        self.recent.push_back((
            self.generation,
            Change {
                kind,
                key: key.clone(),
                service,
            },
        ));
    }
}

/// All objects Portcullis reads, indexed for the joins translation needs.
#[derive(Debug, Default, Clone)]
pub struct Store {
    journal: Journal,
    ingresses: BTreeMap<Key, Arc<Ingress>>,
    ingress_classes: BTreeMap<Key, Arc<IngressClass>>,
    services: BTreeMap<Key, Arc<Service>>,
    endpoint_slices: BTreeMap<Key, Arc<EndpointSlice>>,
    /// The EndpointSlices of each Service, sorted (a Service has one or a few: a set's node
    /// took half a KiB each).
    slices_by_service: BTreeMap<Key, Vec<Key>>,
    secrets: BTreeMap<Key, Arc<Secret>>,
    config_maps: BTreeMap<Key, Arc<ConfigMap>>,
    pods: BTreeMap<Key, Arc<Pod>>,
    tcps: BTreeMap<Key, Arc<Tcp>>,
    /// The incumbent's Backend, Defaults and Global resources, by kind (see
    /// [`Store::resources_of`]).
    resources: [BTreeMap<Key, Arc<Resource>>; 3],
    /// Gateway API objects and Namespaces, by kind (see [`Store::gateway_api`]).
    gateway_api: [BTreeMap<Key, Arc<GatewayApi>>; 7],
    /// The address of every object held (see [`Object::address`]), so that [`Store::sync_to`]
    /// recognizes the objects it holds already without looking at their keys.
    addresses: HashSet<usize>,
}

/// The address of a held object, as [`Object::address`] gives it.
fn address_of<T>(o: &Arc<T>) -> usize {
    Arc::as_ptr(o).cast::<()>() as usize
}

/// Inserts `o` under `key` in `map`, keeping `addresses` in step.
fn put<T>(map: &mut BTreeMap<Key, Arc<T>>, addresses: &mut HashSet<usize>, key: Key, o: Arc<T>) {
    addresses.insert(address_of(&o));
    if let Some(old) = map.insert(key, o) {
        addresses.remove(&address_of(&old));
    }
}

/// Removes `key` from `map`, keeping `addresses` in step.
fn take<T>(map: &mut BTreeMap<Key, Arc<T>>, addresses: &mut HashSet<usize>, key: &Key) {
    if let Some(old) = map.remove(key) {
        addresses.remove(&address_of(&old));
    }
}

impl Store {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a store from a list of objects; later objects replace earlier ones.
    pub fn from_objects(objects: impl IntoIterator<Item = Object>) -> Self {
        let mut store = Self::new();
        for o in objects {
            store.upsert(o);
        }
        store
    }

    /// Inserts or replaces an object.
    pub fn upsert(&mut self, object: Object) {
        let key = object.key();
        let kind = object.kind();
        if let Object::EndpointSlice(slice) = &object {
            let old = self
                .endpoint_slices
                .get(&key)
                .and_then(|o| slice_service(&key, o));
            let new = slice_service(&key, slice);
            if old.is_some() && old != new {
                self.journal.record(kind, &key, old);
            }
            self.journal.record(kind, &key, new);
        } else {
            self.journal.record(kind, &key, None);
        }
        let a = &mut self.addresses;
        match object {
            Object::Ingress(o) => put(&mut self.ingresses, a, key, o),
            Object::IngressClass(o) => put(&mut self.ingress_classes, a, key, o),
            Object::Service(o) => put(&mut self.services, a, key, o),
            Object::EndpointSlice(o) => {
                self.unindex_slice(&key);
                if let Some(service) = slice_service(&key, &o) {
                    let slices = self.slices_by_service.entry(service).or_default();
                    if let Err(at) = slices.binary_search(&key) {
                        // Most Services have one slice: no room for four (a push's first
                        // growth).
                        slices.reserve_exact(1);
                        slices.insert(at, key.clone());
                    }
                }
                put(&mut self.endpoint_slices, &mut self.addresses, key, o);
            }
            Object::Secret(o) => put(&mut self.secrets, a, key, o),
            Object::ConfigMap(o) => put(&mut self.config_maps, a, key, o),
            Object::Pod(o) => put(&mut self.pods, a, key, o),
            Object::Tcp(o) => put(&mut self.tcps, a, key, o),
            Object::Resource(o) => {
                let at = resource_index(o.kind);
                put(&mut self.resources[at], a, key, o);
            }
            Object::GatewayApi(o) => {
                let at = gateway_index(o.kind());
                put(&mut self.gateway_api[at], a, key, o);
            }
        }
    }

    /// Makes the store hold exactly `objects` (of the same kind and key, the last wins, as in
    /// [`Store::from_objects`]), changing only what differs: an object equal to the one held is left alone, so the journal names only what
    /// changed (a manifest file rewritten with one object changed changes one object).
    pub fn sync_to(&mut self, objects: Vec<Object>) {
        // The store entries the objects are (by address): an object held already (the same
        // `Arc`, as a parse cache gives for an unchanged file) costs one lookup, not a key.
        let mut covered: HashSet<usize> = HashSet::with_capacity(objects.len());
        for object in objects {
            covered.insert(self.upsert_if_changed(object));
        }
        // An object replaced by a later one of the same kind and key is no entry any more.
        let kept = covered
            .iter()
            .filter(|a| self.addresses.contains(a))
            .count();
        if kept == self.addresses.len() {
            return;
        }
        let mut gone = Vec::new();
        for kind in Kind::ALL {
            gone.extend(
                self.entries(kind)
                    .filter(|(_, address)| !covered.contains(address))
                    .map(|(key, _)| (kind, key.clone())),
            );
        }
        for (kind, key) in gone {
            self.delete(kind, &key);
        }
    }

    /// The address of the object held under `key` when it is equal to `object`.
    /// Upserts `object` unless the store holds it or an equal one under its key, so that the
    /// journal names only real changes. Returns the address of the object then held.
    pub fn upsert_if_changed(&mut self, object: Object) -> usize {
        let address = object.address();
        if self.addresses.contains(&address) {
            return address;
        }
        if let Some(held) = self.held_equal(&object, &object.key()) {
            return held;
        }
        self.upsert(object);
        address
    }

    /// Whether an object of `kind` is held under `key`.
    pub fn holds(&self, kind: Kind, key: &Key) -> bool {
        match kind {
            Kind::Ingress => self.ingresses.contains_key(key),
            Kind::IngressClass => self.ingress_classes.contains_key(key),
            Kind::Service => self.services.contains_key(key),
            Kind::EndpointSlice => self.endpoint_slices.contains_key(key),
            Kind::Secret => self.secrets.contains_key(key),
            Kind::ConfigMap => self.config_maps.contains_key(key),
            Kind::Pod => self.pods.contains_key(key),
            Kind::Tcp => self.tcps.contains_key(key),
            Kind::Backend | Kind::Defaults | Kind::Global => {
                self.resources[resource_index(kind)].contains_key(key)
            }
            _ => self.gateway_api[gateway_index(kind)].contains_key(key),
        }
    }

    /// The object of `kind` held under `key`.
    pub fn get(&self, kind: Kind, key: &Key) -> Option<Object> {
        match kind {
            Kind::Ingress => self.ingresses.get(key).cloned().map(Object::Ingress),
            Kind::IngressClass => self
                .ingress_classes
                .get(key)
                .cloned()
                .map(Object::IngressClass),
            Kind::Service => self.services.get(key).cloned().map(Object::Service),
            Kind::EndpointSlice => self
                .endpoint_slices
                .get(key)
                .cloned()
                .map(Object::EndpointSlice),
            Kind::Secret => self.secrets.get(key).cloned().map(Object::Secret),
            Kind::ConfigMap => self.config_maps.get(key).cloned().map(Object::ConfigMap),
            Kind::Pod => self.pods.get(key).cloned().map(Object::Pod),
            Kind::Tcp => self.tcps.get(key).cloned().map(Object::Tcp),
            Kind::Backend | Kind::Defaults | Kind::Global => self.resources[resource_index(kind)]
                .get(key)
                .cloned()
                .map(Object::Resource),
            _ => self.gateway_api[gateway_index(kind)]
                .get(key)
                .cloned()
                .map(Object::GatewayApi),
        }
    }

    /// Whether the store holds `object`, or one equal to it, under its key.
    pub fn holds_equal(&self, object: &Object) -> bool {
        self.held_equal(object, &object.key()).is_some()
    }

    fn held_equal(&self, object: &Object, key: &Key) -> Option<usize> {
        fn same<T: PartialEq>(map: &BTreeMap<Key, Arc<T>>, key: &Key, o: &Arc<T>) -> Option<usize> {
            map.get(key)
                .filter(|held| Arc::ptr_eq(held, o) || ***held == **o)
                .map(address_of)
        }
        match object {
            Object::Ingress(o) => same(&self.ingresses, key, o),
            Object::IngressClass(o) => same(&self.ingress_classes, key, o),
            Object::Service(o) => same(&self.services, key, o),
            Object::EndpointSlice(o) => same(&self.endpoint_slices, key, o),
            Object::Secret(o) => same(&self.secrets, key, o),
            Object::ConfigMap(o) => same(&self.config_maps, key, o),
            Object::Pod(o) => same(&self.pods, key, o),
            Object::Tcp(o) => same(&self.tcps, key, o),
            Object::Resource(o) => same(&self.resources[resource_index(o.kind)], key, o),
            Object::GatewayApi(o) => same(&self.gateway_api[gateway_index(o.kind())], key, o),
        }
    }

    /// The keys and addresses of the objects held of one kind.
    fn entries(&self, kind: Kind) -> Box<dyn Iterator<Item = (&Key, usize)> + '_> {
        fn of<T>(map: &BTreeMap<Key, Arc<T>>) -> Box<dyn Iterator<Item = (&Key, usize)> + '_> {
            Box::new(map.iter().map(|(k, o)| (k, address_of(o))))
        }
        match kind {
            Kind::Ingress => of(&self.ingresses),
            Kind::IngressClass => of(&self.ingress_classes),
            Kind::Service => of(&self.services),
            Kind::EndpointSlice => of(&self.endpoint_slices),
            Kind::Secret => of(&self.secrets),
            Kind::ConfigMap => of(&self.config_maps),
            Kind::Pod => of(&self.pods),
            Kind::Tcp => of(&self.tcps),
            Kind::Backend | Kind::Defaults | Kind::Global => {
                of(&self.resources[resource_index(kind)])
            }
            _ => of(&self.gateway_api[gateway_index(kind)]),
        }
    }

    /// Removes an object; removing one that is not there is not an error.
    pub fn delete(&mut self, kind: Kind, key: &Key) {
        let service = (kind == Kind::EndpointSlice)
            .then(|| self.endpoint_slices.get(key))
            .flatten()
            .and_then(|o| slice_service(key, o));
        self.journal.record(kind, key, service);
        let a = &mut self.addresses;
        match kind {
            Kind::Ingress => take(&mut self.ingresses, a, key),
            Kind::IngressClass => take(&mut self.ingress_classes, a, key),
            Kind::Service => take(&mut self.services, a, key),
            Kind::EndpointSlice => {
                self.unindex_slice(key);
                take(&mut self.endpoint_slices, &mut self.addresses, key);
            }
            Kind::Secret => take(&mut self.secrets, a, key),
            Kind::ConfigMap => take(&mut self.config_maps, a, key),
            Kind::Pod => take(&mut self.pods, a, key),
            Kind::Tcp => take(&mut self.tcps, a, key),
            Kind::Backend | Kind::Defaults | Kind::Global => {
                take(&mut self.resources[resource_index(kind)], a, key);
            }
            _ => take(&mut self.gateway_api[gateway_index(kind)], a, key),
        }
    }

    fn unindex_slice(&mut self, key: &Key) {
        let Some(old) = self.endpoint_slices.get(key) else {
            return;
        };
        if let Some(service) = slice_service(key, old) {
            if let Some(set) = self.slices_by_service.get_mut(&service) {
                if let Ok(at) = set.binary_search(key) {
                    set.remove(at);
                }
                if set.is_empty() {
                    self.slices_by_service.remove(&service);
                }
            }
        }
    }

    /// Where this store's history stands now.
    pub fn mark(&self) -> Mark {
        Mark {
            lineage: self.journal.lineage,
            generation: self.journal.generation,
        }
    }

    /// Every change made since `mark`, oldest first; `None` when that is unknown (another
    /// store, or further back than the journal reaches).
    pub fn changes_since(&self, mark: Mark) -> Option<impl Iterator<Item = &Change>> {
        if mark.lineage != self.journal.lineage || mark.generation > self.journal.generation {
            return None;
        }
        let oldest_kept = self
            .journal
            .recent
            .front()
            .map_or(self.journal.generation + 1, |(g, _)| *g);
        if mark.generation + 1 < oldest_kept {
            return None;
        }
        Some(
            self.journal
                .recent
                .iter()
                .filter(move |(g, _)| *g > mark.generation)
                .map(|(_, c)| c),
        )
    }

    /// An immutable copy for readers. Objects are shared, only the indexes are copied.
    pub fn snapshot(&self) -> Snapshot {
        Arc::new(self.clone())
    }

    pub fn ingresses(&self) -> impl Iterator<Item = (&Key, &Arc<Ingress>)> {
        self.ingresses.iter()
    }

    pub fn ingress_classes(&self) -> impl Iterator<Item = (&Key, &Arc<IngressClass>)> {
        self.ingress_classes.iter()
    }

    pub fn ingress(&self, key: &Key) -> Option<&Arc<Ingress>> {
        self.ingresses.get(key)
    }

    pub fn service(&self, key: &Key) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// The EndpointSlices of a Service, in name order.
    pub fn services(&self) -> impl Iterator<Item = (&Key, &Arc<Service>)> {
        self.services.iter()
    }

    pub fn endpoint_slices(&self) -> impl Iterator<Item = (&Key, &Arc<EndpointSlice>)> {
        self.endpoint_slices.iter()
    }

    pub fn endpoint_slices_of(&self, service: &Key) -> impl Iterator<Item = &Arc<EndpointSlice>> {
        self.slices_by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|k| self.endpoint_slices.get(k))
    }

    pub fn secret(&self, key: &Key) -> Option<&Arc<Secret>> {
        self.secrets.get(key)
    }

    pub fn config_map(&self, key: &Key) -> Option<&Arc<ConfigMap>> {
        self.config_maps.get(key)
    }

    pub fn pods(&self) -> impl Iterator<Item = (&Key, &Arc<Pod>)> {
        self.pods.iter()
    }

    pub fn tcps(&self) -> impl Iterator<Item = (&Key, &Arc<Tcp>)> {
        self.tcps.iter()
    }

    /// The incumbent's resource of `kind` (`Backend`, `Defaults` or `Global`) under `key`.
    pub fn resource(&self, kind: Kind, key: &Key) -> Option<&Arc<Resource>> {
        self.resources_of(kind).get(key)
    }

    /// Every resource of `kind` (`Backend`, `Defaults` or `Global`) held, by key.
    pub fn resources_of(&self, kind: Kind) -> &BTreeMap<Key, Arc<Resource>> {
        &self.resources[resource_index(kind)]
    }

    /// Every Gateway API object of `kind` (one of [`Kind::GATEWAY_API`]) held, by key.
    pub fn gateway_api(&self, kind: Kind) -> &BTreeMap<Key, Arc<GatewayApi>> {
        &self.gateway_api[gateway_index(kind)]
    }

    /// Number of objects held, all kinds together.
    pub fn len(&self) -> usize {
        self.ingresses.len()
            + self.ingress_classes.len()
            + self.services.len()
            + self.endpoint_slices.len()
            + self.secrets.len()
            + self.config_maps.len()
            + self.pods.len()
            + self.tcps.len()
            + self.resources.iter().map(BTreeMap::len).sum::<usize>()
            + self.gateway_api.iter().map(BTreeMap::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which of [`Store`]'s Gateway API maps holds `kind` (callers pass one of
/// [`Kind::GATEWAY_API`]).
fn gateway_index(kind: Kind) -> usize {
    match kind {
        Kind::GatewayClass => 0,
        Kind::Gateway => 1,
        Kind::HttpRoute => 2,
        Kind::ReferenceGrant => 3,
        Kind::TlsRoute => 5,
        Kind::TcpRoute => 6,
        _ => 4,
    }
}

/// Which of [`Store`]'s resource maps holds `kind` (`Backend`, `Defaults` or `Global`; callers
/// pass no other kind).
fn resource_index(kind: Kind) -> usize {
    match kind {
        Kind::Defaults => 1,
        Kind::Global => 2,
        _ => 0,
    }
}

fn slice_service(key: &Key, slice: &EndpointSlice) -> Option<Key> {
    let name = slice.service.as_ref()?;
    Some(Key::new(key.namespace.clone(), name.clone()))
}

/// An EndpointSlice `ns/<name>` of Service `ns/<service>` on port 8080 with one ready
/// endpoint per address, for tests.
#[cfg(test)]
pub(crate) fn test_slice(name: &str, service: &str, addresses: &[&str]) -> Object {
    let endpoints: Vec<serde_json::Value> = addresses
        .iter()
        .map(|a| serde_json::json!({"addresses": [a]}))
        .collect();
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns",
                     "labels": {crate::objects::SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4", "ports": [{"port": 8080}], "endpoints": endpoints
    });
    Object::from_value(slice).expect("a valid EndpointSlice")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, service: &str) -> Object {
        test_slice(name, service, &[])
    }

    #[test]
    fn slices_are_indexed_by_service_and_reindexed_on_change() {
        let mut store = Store::from_objects([slice("a-1", "a"), slice("a-2", "a")]);
        let a = Key::new("ns", "a");
        let b = Key::new("ns", "b");
        assert_eq!(store.endpoint_slices_of(&a).count(), 2);
        store.upsert(slice("a-2", "b"));
        assert_eq!(store.endpoint_slices_of(&a).count(), 1);
        assert_eq!(store.endpoint_slices_of(&b).count(), 1);
        store.delete(Kind::EndpointSlice, &Key::new("ns", "a-2"));
        assert_eq!(store.endpoint_slices_of(&b).count(), 0);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn the_journal_names_what_changed_since_a_mark() {
        let mut store = Store::from_objects([slice("a-1", "a")]);
        let mark = store.mark();
        assert_eq!(store.changes_since(mark).unwrap().count(), 0);
        store.upsert(slice("a-1", "b"));
        store.delete(Kind::EndpointSlice, &Key::new("ns", "a-1"));
        let services: Vec<Option<Key>> = store
            .changes_since(mark)
            .unwrap()
            .map(|c| c.service.clone())
            .collect();
        let (a, b) = (Key::new("ns", "a"), Key::new("ns", "b"));
        assert_eq!(services, [Some(a), Some(b.clone()), Some(b)]);
        // A copy shares the history; another store does not.
        assert!(store.clone().changes_since(mark).is_some());
        assert!(Store::new().changes_since(mark).is_none());
        // Further back than the journal reaches is unknown.
        for _ in 0..JOURNAL_LEN {
            store.upsert(slice("a-2", "a"));
        }
        assert!(store.changes_since(mark).is_none());
        assert_eq!(store.changes_since(store.mark()).unwrap().count(), 0);
    }

    #[test]
    fn syncing_changes_only_what_differs() {
        let a1 = slice("a-1", "a");
        let mut store = Store::from_objects([a1.clone(), slice("a-2", "a")]);
        let mark = store.mark();
        store.sync_to(vec![a1.clone(), slice("a-3", "a")]);
        let changed: Vec<String> = store
            .changes_since(mark)
            .unwrap()
            .map(|c| c.key.name.clone())
            .collect();
        assert_eq!(changed, ["a-3", "a-2"]);
        assert_eq!(store.len(), 2);
        let mark = store.mark();
        store.sync_to(vec![a1, slice("a-3", "a")]);
        // The same content parsed again is left alone.
        assert_eq!(store.changes_since(mark).unwrap().count(), 0);
        store.sync_to(vec![slice("a-3", "b")]);
        assert_eq!(store.changes_since(mark).unwrap().count(), 3);
    }

    /// Whatever objects are held and however the list repeats them, syncing to a list holds
    /// what a store built from that list holds (the last of the same kind and key wins).
    #[test]
    fn syncing_holds_what_building_from_the_list_holds() {
        let (a, b) = (Key::new("ns", "a"), Key::new("ns", "b"));
        let names = |store: &Store, service: &Key| -> Vec<String> {
            store
                .endpoint_slices_of(service)
                .map(|s| s.metadata.name.clone().unwrap_or_default())
                .collect()
        };
        let (a1, a1_to_b, a2) = (slice("a-1", "a"), slice("a-1", "b"), slice("a-2", "a"));
        let lists: [Vec<Object>; 6] = [
            vec![a1.clone(), a2.clone()],
            vec![a1.clone(), a1_to_b.clone()],
            vec![a1_to_b, a1.clone(), a2.clone()],
            vec![slice("a-1", "a"), a2.clone(), a2.clone()],
            vec![a2],
            vec![],
        ];
        let mut store = Store::from_objects([a1, slice("a-3", "b")]);
        for _ in 0..2 {
            for list in &lists {
                store.sync_to(list.clone());
                let built = Store::from_objects(list.clone());
                assert_eq!(store.len(), built.len(), "{list:?}");
                for service in [&a, &b] {
                    assert_eq!(names(&store, service), names(&built, service), "{list:?}");
                }
                assert_eq!(store.addresses.len(), store.len());
            }
        }
    }
}
