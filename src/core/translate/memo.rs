//! Results of the pure steps of translation, kept from one run to the next by what they read:
//! the server slots of a backend (by the Service's EndpointSlices, the port and the slot
//! block) and the certificate file of a TLS Secret (by the Secret). The store shares unchanged
//! objects between runs, so "what they read" is compared by address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Secret;

use super::backends::ResolvedPort;
use super::tls;
use crate::model::{PemFile, ServerSlots};
use crate::objects::{EndpointSlice, Key};
use crate::store::Store;

/// Kept by the pipeline across runs; entries a run did not use are dropped after the next.
/// In shards by key: the two workers of a cold run look up and add 10 000 entries each, and
/// one lock made them wait for each other.
#[derive(Debug, Default)]
pub struct Memo {
    shards: [Mutex<Inner>; SHARDS],
}

const SHARDS: usize = 16;

#[derive(Debug, Default)]
struct Inner {
    run: u64,
    /// By Service: the backends' slots, each with its port, slot block and the slices read.
    servers: HashMap<Key, Vec<Servers>>,
    certificates: HashMap<Key, Certificate>,
}

#[derive(Debug)]
struct Servers {
    port: ResolvedPort,
    slots_block: u32,
    slices: Vec<Arc<EndpointSlice>>,
    servers: Arc<ServerSlots>,
    used: u64,
}

/// A Secret's certificate file, or why it has none, and the leaf's `notAfter`.
type CertificateFile = (Result<PemFile, String>, Option<i64>);

#[derive(Debug)]
struct Certificate {
    secret: Arc<Secret>,
    file: CertificateFile,
    used: u64,
}

impl Memo {
    /// The shard of `key`, locked.
    fn shard(&self, key: &Key) -> std::sync::MutexGuard<'_, Inner> {
        use std::hash::BuildHasher;
        let hash = foldhash::fast::FixedState::default().hash_one(key);
        self.shards[(hash % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a translation: forgets what neither the previous run nor this one used.
    pub fn begin_run(&self) {
        for shard in &self.shards {
            let mut inner = shard.lock().unwrap_or_else(PoisonError::into_inner);
            inner.run += 1;
            let keep_from = inner.run - 1;
            inner.servers.retain(|_, list| {
                list.retain(|s| s.used >= keep_from);
                !list.is_empty()
            });
            inner.certificates.retain(|_, c| c.used >= keep_from);
        }
    }

    /// How many server slot lists and certificate files are kept.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let inner = shard.lock().unwrap_or_else(PoisonError::into_inner);
                inner.servers.values().map(Vec::len).sum::<usize>() + inner.certificates.len()
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`super::servers`] for `service` on `port`, from the last run when the Service's
    /// EndpointSlices are the same objects.
    pub fn servers(
        &self,
        store: &Store,
        service: &Key,
        port: &ResolvedPort,
        slots_block: u32,
    ) -> Arc<ServerSlots> {
        let slices: Vec<&Arc<EndpointSlice>> = store.endpoint_slices_of(service).collect();
        {
            let mut inner = self.shard(service);
            let run = inner.run;
            if let Some(known) = inner.servers.get_mut(service).and_then(|list| {
                list.iter_mut().find(|s| {
                    s.port == *port
                        && s.slots_block == slots_block
                        && s.slices.len() == slices.len()
                        && s.slices.iter().zip(&slices).all(|(a, b)| Arc::ptr_eq(a, b))
                })
            }) {
                known.used = run;
                return known.servers.clone();
            }
        }
        // Computed unlocked: the workers of a cold run (see `crate::parallel`) share the memo.
        let servers = Arc::new(super::servers(store, service, port, slots_block));
        let mut inner = self.shard(service);
        let run = inner.run;
        let list = inner.servers.entry(service.clone()).or_default();
        list.retain(|s| !(s.port == *port && s.slots_block == slots_block));
        // Most Services have one port: no room for four (a push's first growth).
        list.reserve_exact(1);
        list.push(Servers {
            port: port.clone(),
            slots_block,
            slices: slices.into_iter().cloned().collect(),
            servers: servers.clone(),
            used: run,
        });
        servers
    }

    /// [`tls::pem_file`] of `secret` and the `notAfter` of its leaf, from the last run when it
    /// is the same Secret object.
    pub fn certificate(&self, key: &Key, secret: &Arc<Secret>) -> CertificateFile {
        {
            let mut inner = self.shard(key);
            let run = inner.run;
            if let Some(known) = inner
                .certificates
                .get_mut(key)
                .filter(|c| Arc::ptr_eq(&c.secret, secret))
            {
                known.used = run;
                return known.file.clone();
            }
        }
        // Parsed unlocked, as the server slots above.
        let file = match tls::certificate_file(key, secret) {
            Ok((pem, end)) => (Ok(pem), end),
            Err(e) => (Err(e), None),
        };
        let mut inner = self.shard(key);
        let run = inner.run;
        inner.certificates.insert(
            key.clone(),
            Certificate {
                secret: secret.clone(),
                file: file.clone(),
                used: run,
            },
        );
        file
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Object;

    fn slice(name: &str, ip: &str) -> Object {
        crate::store::test_slice(name, "web", &[ip])
    }

    /// The same slices give the same slots (shared); a changed slice, another slot block or
    /// another port give slots computed again, equal to a fresh computation.
    #[test]
    fn server_slots_follow_the_slices_they_were_made_from() {
        let memo = Memo::default();
        let web = Key::new("ns", "web");
        let port = ResolvedPort {
            number: 80,
            name: String::new(),
            external: None,
            endpoints: super::super::exposure::EndpointRule::default(),
        };
        let mut store =
            Store::from_objects([slice("web-1", "10.0.0.1"), slice("web-2", "10.0.0.2")]);
        memo.begin_run();
        let first = memo.servers(&store, &web, &port, 4);
        memo.begin_run();
        assert!(Arc::ptr_eq(&first, &memo.servers(&store, &web, &port, 4)));
        let other_block = memo.servers(&store, &web, &port, 2);
        assert_eq!(*other_block, super::super::servers(&store, &web, &port, 2));
        store.upsert(slice("web-2", "10.0.0.3"));
        memo.begin_run();
        let moved = memo.servers(&store, &web, &port, 4);
        assert!(!Arc::ptr_eq(&first, &moved));
        assert_eq!(*moved, super::super::servers(&store, &web, &port, 4));
        assert!(
            moved
                .iter()
                .any(|s| s.address.is_some_and(|a| a.to_string() == "10.0.0.3"))
        );
    }
}
