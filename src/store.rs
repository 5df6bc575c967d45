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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

use crate::objects::{Key, Kind, Object, Tcp};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

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
    slices_by_service: BTreeMap<Key, BTreeSet<Key>>,
    secrets: BTreeMap<Key, Arc<Secret>>,
    config_maps: BTreeMap<Key, Arc<ConfigMap>>,
    pods: BTreeMap<Key, Arc<Pod>>,
    tcps: BTreeMap<Key, Arc<Tcp>>,
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
        match object {
            Object::Ingress(o) => {
                self.ingresses.insert(key, o);
            }
            Object::IngressClass(o) => {
                self.ingress_classes.insert(key, o);
            }
            Object::Service(o) => {
                self.services.insert(key, o);
            }
            Object::EndpointSlice(o) => {
                self.unindex_slice(&key);
                if let Some(service) = slice_service(&key, &o) {
                    self.slices_by_service
                        .entry(service)
                        .or_default()
                        .insert(key.clone());
                }
                self.endpoint_slices.insert(key, o);
            }
            Object::Secret(o) => {
                self.secrets.insert(key, o);
            }
            Object::ConfigMap(o) => {
                self.config_maps.insert(key, o);
            }
            Object::Pod(o) => {
                self.pods.insert(key, o);
            }
            Object::Tcp(o) => {
                self.tcps.insert(key, o);
            }
        }
    }

    /// Makes the store hold exactly `objects` (unique by kind and key), changing only what
    /// differs: an object equal to the one held is left alone, so the journal names only what
    /// changed (a manifest file rewritten with one object changed changes one object).
    pub fn sync_to(&mut self, objects: Vec<Object>) {
        let mut wanted: BTreeMap<Kind, BTreeSet<Key>> = BTreeMap::new();
        for object in objects {
            let (kind, key) = (object.kind(), object.key());
            if !self.holds(&object, &key) {
                self.upsert(object);
            }
            wanted.entry(kind).or_default().insert(key);
        }
        let none = BTreeSet::new();
        let mut gone = Vec::new();
        for kind in Kind::ALL {
            let keep = wanted.get(&kind).unwrap_or(&none);
            gone.extend(
                self.keys(kind)
                    .filter(|k| !keep.contains(*k))
                    .map(|k| (kind, k.clone())),
            );
        }
        for (kind, key) in gone {
            self.delete(kind, &key);
        }
    }

    /// Whether `object` is (equal to) the one held under `key`.
    fn holds(&self, object: &Object, key: &Key) -> bool {
        fn same<T: PartialEq>(map: &BTreeMap<Key, Arc<T>>, key: &Key, o: &Arc<T>) -> bool {
            map.get(key)
                .is_some_and(|held| Arc::ptr_eq(held, o) || **held == **o)
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
        }
    }

    /// The keys held of one kind.
    fn keys(&self, kind: Kind) -> Box<dyn Iterator<Item = &Key> + '_> {
        match kind {
            Kind::Ingress => Box::new(self.ingresses.keys()),
            Kind::IngressClass => Box::new(self.ingress_classes.keys()),
            Kind::Service => Box::new(self.services.keys()),
            Kind::EndpointSlice => Box::new(self.endpoint_slices.keys()),
            Kind::Secret => Box::new(self.secrets.keys()),
            Kind::ConfigMap => Box::new(self.config_maps.keys()),
            Kind::Pod => Box::new(self.pods.keys()),
            Kind::Tcp => Box::new(self.tcps.keys()),
        }
    }

    /// Removes an object; removing one that is not there is not an error.
    pub fn delete(&mut self, kind: Kind, key: &Key) {
        let service = (kind == Kind::EndpointSlice)
            .then(|| self.endpoint_slices.get(key))
            .flatten()
            .and_then(|o| slice_service(key, o));
        self.journal.record(kind, key, service);
        match kind {
            Kind::Ingress => drop(self.ingresses.remove(key)),
            Kind::IngressClass => drop(self.ingress_classes.remove(key)),
            Kind::Service => drop(self.services.remove(key)),
            Kind::EndpointSlice => {
                self.unindex_slice(key);
                self.endpoint_slices.remove(key);
            }
            Kind::Secret => drop(self.secrets.remove(key)),
            Kind::ConfigMap => drop(self.config_maps.remove(key)),
            Kind::Pod => drop(self.pods.remove(key)),
            Kind::Tcp => drop(self.tcps.remove(key)),
        }
    }

    fn unindex_slice(&mut self, key: &Key) {
        let Some(old) = self.endpoint_slices.get(key) else {
            return;
        };
        if let Some(service) = slice_service(key, old) {
            if let Some(set) = self.slices_by_service.get_mut(&service) {
                set.remove(key);
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

    pub fn service(&self, key: &Key) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// The EndpointSlices of a Service, in name order.
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
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn slice_service(key: &Key, slice: &EndpointSlice) -> Option<Key> {
    let labels = slice.metadata.labels.as_ref()?;
    let name = labels.get(SERVICE_NAME_LABEL)?;
    Some(Key::new(key.namespace.clone(), name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, service: &str) -> Object {
        Object::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "ns",
                         "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4", "endpoints": []
        }))
        .unwrap()
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
}
