//! The model as templates see it: views that convert a field to a template value when a
//! template first reads it, and note what was read.
//!
//! Templates see the model as a [`ModelView`] and every backend as a [`BackendView`]. The
//! view notes the fields read (each map on its own), which is what the section cache keys a
//! remembered section by and what tells a patch whether the rest of the model may differ;
//! a backend view notes when a template reads anything of it but its name, which leaves the
//! render without a layout to patch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Error, Value};

use crate::fingerprint::Fingerprint;
use crate::model::{Backend, Model, UNUSED_SLOT_PORT};

/// `backend` as a template value: its fields as serde gives them, but its server slots as a
/// sequence whose slots are made when a template reads them. Serialized, the 42 slots of each
/// of 10 000 backends were a fifth of a cold run's rendering.
pub(super) fn backend_value(backend: &Backend) -> Value {
    let servers = Value::from_object(SlotsView::new(&backend.servers));
    to_value(&BackendWith(backend, servers))
}

/// A backend serialized with its servers as `.1`.
pub(super) struct BackendWith<'a, T>(pub(super) &'a Backend, pub(super) T);

impl<T: serde::Serialize> serde::Serialize for BackendWith<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // Every field named, in the order of `Backend`'s own serialization.
        let Backend {
            name,
            namespace,
            service,
            port,
            settings,
            policies,
            servers: _,
        } = self.0;
        let mut out = serializer.serialize_struct("Backend", 7)?;
        out.serialize_field("name", name)?;
        out.serialize_field("namespace", namespace)?;
        out.serialize_field("service", service)?;
        out.serialize_field("port", port)?;
        out.serialize_field("settings", settings)?;
        out.serialize_field("policies", policies)?;
        out.serialize_field("servers", &self.1)?;
        out.end()
    }
}

/// A backend's server slots as templates see them: `{name, address, port}` each (dynamic
/// servers: the used ones, with their `id` too).
#[derive(Debug)]
struct SlotsView {
    slots: Arc<crate::model::ServerSlots>,
    names: crate::model::SlotNames,
    /// Of dynamic servers, the slot index of each.
    dynamic: Option<Vec<usize>>,
}

impl SlotsView {
    fn new(slots: &Arc<crate::model::ServerSlots>) -> Self {
        let dynamic = slots
            .is_dynamic()
            .then(|| slots.used_indexes().collect::<Vec<_>>());
        Self {
            names: crate::model::slot_names(if dynamic.is_some() { 0 } else { slots.len() }),
            slots: slots.clone(),
            dynamic,
        }
    }
}

impl Object for SlotsView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let (index, name, id) = match &self.dynamic {
            Some(indexes) => {
                let index = *indexes.get(key.as_usize()?)?;
                (index, self.slots.name_at(index), Value::from(index + 1))
            }
            None => {
                let index = key.as_usize()?;
                (index, self.names.get(index)?.clone(), Value::UNDEFINED)
            }
        };
        let (address, port) = match self.slots.occupant(index) {
            Some((address, port)) => (address.with_text(|text| Value::from(text)), port),
            None => (Value::from(()), crate::model::UNUSED_SLOT_PORT),
        };
        Some(Value::from_object(SlotView {
            name: Value::from(name),
            address,
            port,
            id,
        }))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match &self.dynamic {
            Some(indexes) => Enumerator::Seq(indexes.len()),
            None => Enumerator::Seq(self.names.len()),
        }
    }
}

/// `{{ backend.servers|slot_runs }}`: the slots in order as runs, each used slot alone and
/// each stretch of unused slots as one, so that a template prints a backend's 39 unused slots
/// (of 42, with 3 endpoints) as one `server-template` line instead of 39 `server` lines. A
/// run is `{name, address, port, prefix, first, last}`: `name`, `address` and `port` are the
/// first slot's, `first` and `last` the numbers of its first and last slot as in their names
/// (`prefix` then the number, `SRV_1` first); `first == last` for a used slot and may be for
/// an unused one. `id` is the first server's id (its number), and `dynamic` whether the
/// backend has dynamic servers, whose lines must name their ids (HAProxy would number
/// them in order otherwise).
pub(super) fn slot_runs(servers: &Value) -> Result<Value, Error> {
    if let Some(view) = servers.downcast_object_ref::<SlotsView>() {
        let runs = view.slots.runs();
        return Ok(Value::from_object(SlotRunsView {
            slots: view.slots.clone(),
            names: view.names.clone(),
            runs,
        }));
    }
    // A list as serialized (a site template's own, say): runs by position; dynamic servers
    // are one run each, named with their ids.
    let items: Vec<Value> = servers.try_iter()?.collect();
    if items
        .first()
        .is_some_and(|s| s.get_attr("id").is_ok_and(|id| !id.is_undefined()))
    {
        let mut runs = Vec::new();
        for slot in &items {
            let id = slot.get_attr("id")?.as_usize().unwrap_or_default();
            let (name, address, port) = (
                slot.get_attr("name")?,
                slot.get_attr("address")?,
                slot.get_attr("port")?,
            );
            let mut run = run_fields(name, address, port, id - 1, id - 1);
            run.dynamic = true;
            runs.push(Value::from_object(run));
        }
        return Ok(Value::from(runs));
    }
    let mut runs = Vec::new();
    let mut unused_from: Option<(usize, Value)> = None;
    let unused = |(first, name): (usize, Value), last: usize| {
        run_value(
            name,
            Value::from(()),
            Value::from(UNUSED_SLOT_PORT),
            first,
            last,
        )
    };
    for (i, slot) in items.iter().enumerate() {
        let address = slot.get_attr("address")?;
        if address.is_true() {
            if let Some(from) = unused_from.take() {
                runs.push(unused(from, i - 1));
            }
            let (name, port) = (slot.get_attr("name")?, slot.get_attr("port")?);
            runs.push(run_value(name, address, port, i, i));
        } else if unused_from.is_none() {
            unused_from = Some((i, slot.get_attr("name")?));
        }
    }
    if let Some(from) = unused_from {
        runs.push(unused(from, items.len() - 1));
    }
    Ok(Value::from(runs))
}

/// A run as a template value (slot indexes `first..=last`).
fn run_value(name: Value, address: Value, port: Value, first: usize, last: usize) -> Value {
    Value::from_object(run_fields(name, address, port, first, last))
}

fn run_fields(name: Value, address: Value, port: Value, first: usize, last: usize) -> SlotRunView {
    SlotRunView {
        name,
        address,
        port,
        first: first + 1,
        last: last + 1,
        dynamic: false,
    }
}

/// A backend's slot runs, made as a template reads them.
#[derive(Debug)]
struct SlotRunsView {
    slots: Arc<crate::model::ServerSlots>,
    names: crate::model::SlotNames,
    runs: Vec<crate::model::SlotRun>,
}

impl Object for SlotRunsView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        use crate::model::SlotRun;
        let (first, last) = match *self.runs.get(key.as_usize()?)? {
            SlotRun::Used(i) => (i, i),
            SlotRun::Unused { first, last } => (first, last),
        };
        let (address, port) = match self.slots.occupant(first) {
            Some((address, port)) => (address.with_text(|text| Value::from(text)), port),
            None => (Value::from(()), UNUSED_SLOT_PORT),
        };
        if self.slots.is_dynamic() {
            let name = Value::from(self.slots.name_at(first));
            let mut run = run_fields(name, address, Value::from(port), first, last);
            run.dynamic = true;
            return Some(Value::from_object(run));
        }
        let name = Value::from(self.names.get(first)?.clone());
        Some(run_value(name, address, Value::from(port), first, last))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.runs.len())
    }
}

/// One run of slots as templates see it.
#[derive(Debug)]
struct SlotRunView {
    name: Value,
    address: Value,
    port: Value,
    /// Slot numbers, as in the names.
    first: usize,
    last: usize,
    /// Of a backend with dynamic servers.
    dynamic: bool,
}

impl Object for SlotRunView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "name" => Some(self.name.clone()),
            "address" => Some(self.address.clone()),
            "port" => Some(self.port.clone()),
            "prefix" => Some(Value::from(crate::model::SLOT_NAME_PREFIX)),
            "first" | "id" => Some(Value::from(self.first)),
            "last" => Some(Value::from(self.last)),
            "dynamic" => Some(Value::from(self.dynamic)),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&[
            "name", "address", "port", "prefix", "first", "last", "id", "dynamic",
        ])
    }
}

/// One server slot as templates see it.
#[derive(Debug)]
struct SlotView {
    name: Value,
    address: Value,
    port: u16,
    /// A dynamic server's id; undefined for a slot.
    id: Value,
}

impl Object for SlotView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "name" => Some(self.name.clone()),
            "address" => Some(self.address.clone()),
            "port" => Some(Value::from(self.port)),
            "id" if !self.id.is_undefined() => Some(self.id.clone()),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        if self.id.is_undefined() {
            Enumerator::Str(&["name", "address", "port"])
        } else {
            Enumerator::Str(&["name", "address", "port", "id"])
        }
    }
}

/// A template value of `value`, as serde sees it.
pub(crate) fn to_value<T: serde::Serialize>(value: &T) -> Value {
    Value::from(minijinja::value::Serde(value))
}

/// The model as templates see it: each field converted when first read.
#[derive(Debug)]
pub(super) struct ModelView {
    pub(super) model: Model,
    backends: Value,
    fields: Mutex<HashMap<&'static str, Value>>,
    /// Field fingerprints, computed when a remembered section needs them.
    fingerprints: Mutex<HashMap<&'static str, u128>>,
    /// The fields read by each section render in progress, innermost last.
    recording: Mutex<Vec<Vec<&'static str>>>,
    /// Every field any template has read through this view (`maps.<map>` for each map):
    /// a patch may not render with this view for a model that differs in one of them.
    read: Arc<Mutex<Vec<&'static str>>>,
}

const MODEL_FIELDS: &[&str] = &[
    "version",
    "listen",
    "runtime_socket",
    "global",
    "maps",
    "frontend_rules",
    "redirect_codes",
    "backends",
    "default_backend",
    "tls",
    "peers",
    "tcp",
    "tcp_backends",
    "userlists",
    "errorfiles",
    "patterns",
];

/// Something done with one serializable field of the model.
trait FieldVisitor {
    type Out;
    fn visit<T: serde::Serialize + ?Sized>(self, value: &T) -> Self::Out;
}

/// Applies `visitor` to the field `name` of `m` (not `backends`, which is views).
fn visit_field<V: FieldVisitor>(m: &Model, name: &str, visitor: V) -> Option<V::Out> {
    Some(match name {
        "version" => visitor.visit(&m.version),
        "listen" => visitor.visit(&m.listen),
        "runtime_socket" => visitor.visit(&m.runtime_socket),
        "global" => visitor.visit(&m.global),
        "maps" => visitor.visit(&*m.maps),
        "frontend_rules" => visitor.visit(&m.frontend_rules),
        "redirect_codes" => visitor.visit(&m.redirect_codes),
        "default_backend" => visitor.visit(&m.default_backend),
        "tls" => visitor.visit(&*m.tls),
        "peers" => visitor.visit(&m.peers),
        "tcp" => visitor.visit(&m.tcp),
        "tcp_backends" => visitor.visit(&m.tcp_backends),
        "userlists" => visitor.visit(&m.userlists),
        "errorfiles" => visitor.visit(&m.errorfiles),
        "patterns" => visitor.visit(&m.patterns),
        _ => return None,
    })
}

struct ToValue;

impl FieldVisitor for ToValue {
    type Out = Value;
    fn visit<T: serde::Serialize + ?Sized>(self, value: &T) -> Value {
        Value::from(minijinja::value::Serde(value))
    }
}

struct ToFingerprint;

impl FieldVisitor for ToFingerprint {
    type Out = u128;
    fn visit<T: serde::Serialize + ?Sized>(self, value: &T) -> u128 {
        let mut h = Fingerprint::new();
        h.add_serialized(&value);
        h.finish()
    }
}

impl ModelView {
    pub(super) fn value(model: &Model, touched: &Arc<AtomicBool>) -> Value {
        let backends = model
            .backends
            .iter()
            .enumerate()
            .map(|(index, backend)| {
                Value::from_object(BackendView {
                    backend: backend.clone(),
                    index,
                    value: OnceLock::new(),
                    touched: touched.clone(),
                })
            })
            .collect::<Vec<_>>();
        Value::from_object(ModelView {
            model: model.clone(),
            backends: Value::from(backends),
            fields: Mutex::new(HashMap::new()),
            fingerprints: Mutex::new(HashMap::new()),
            recording: Mutex::new(Vec::new()),
            read: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Notes model fields (by [`MODEL_FIELDS`] name) that a remembered section read when it
    /// was rendered; `maps` as every map, since which ones it was is not kept.
    pub(super) fn note_reads(&self, fields: &[&'static str]) {
        for &field in fields {
            note_read(&self.read, field);
            if field == "maps" {
                for map in ["maps.exact", "maps.prefix", "maps.ssl_redirect", "maps.sni"] {
                    note_read(&self.read, map);
                }
            }
        }
    }

    /// Whether a template read any of `fields` through this view.
    pub(super) fn read_any(&self, fields: &[&'static str]) -> bool {
        !fields.is_empty()
            && self
                .read
                .lock()
                .map_or(true, |read| fields.iter().any(|f| read.contains(f)))
    }

    /// The fingerprint of field `name`; `None` for the backends, which sections of other
    /// backends must not depend on.
    pub(super) fn fingerprint(&self, name: &'static str) -> Option<u128> {
        if let Some(fp) = self.fingerprints.lock().ok()?.get(name) {
            return Some(*fp);
        }
        let fp = visit_field(&self.model, name, ToFingerprint)?;
        self.fingerprints.lock().ok()?.insert(name, fp);
        Some(fp)
    }

    /// Starts noting the fields read, until [`ModelView::recorded`].
    pub(super) fn record(&self) {
        if let Ok(mut r) = self.recording.lock() {
            r.push(Vec::new());
        }
    }

    /// The fields read since the matching [`ModelView::record`].
    pub(super) fn recorded(&self) -> Vec<&'static str> {
        self.recording
            .lock()
            .ok()
            .and_then(|mut r| r.pop())
            .unwrap_or_default()
    }
}

impl Object for ModelView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = *MODEL_FIELDS.iter().find(|f| Some(**f) == key.as_str())?;
        note_read(&self.read, name);
        if let Ok(mut recording) = self.recording.lock() {
            // An enclosing section depends on what a section inside it read too.
            for reads in recording.iter_mut() {
                if !reads.contains(&name) {
                    reads.push(name);
                }
            }
        }
        if let Some(v) = self.fields.lock().ok()?.get(name) {
            return Some(v.clone());
        }
        let v = match name {
            "backends" => self.backends.clone(),
            // `model.maps.sni` is read to know whether there is a passthrough frontend: the
            // tens of thousands of routes in the other maps are converted only if read.
            "maps" => Value::from_object(MapsView {
                maps: self.model.maps.clone(),
                fields: Mutex::new(HashMap::new()),
                read: self.read.clone(),
            }),
            _ => visit_field(&self.model, name, ToValue)?,
        };
        self.fields.lock().ok()?.insert(name, v.clone());
        Some(v)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(MODEL_FIELDS)
    }
}

/// The routing maps as templates see them: each map converted when first read.
#[derive(Debug)]
struct MapsView {
    maps: Arc<crate::model::RouteMaps>,
    fields: Mutex<HashMap<&'static str, Value>>,
    /// The model view's record of fields read.
    read: Arc<Mutex<Vec<&'static str>>>,
}

const MAPS_FIELDS: &[&str] = &["exact", "prefix", "ssl_redirect", "sni"];

/// Notes that a template read `name`.
fn note_read(read: &Mutex<Vec<&'static str>>, name: &'static str) {
    if let Ok(mut read) = read.lock() {
        if !read.contains(&name) {
            read.push(name);
        }
    }
}

impl Object for MapsView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = *MAPS_FIELDS.iter().find(|f| Some(**f) == key.as_str())?;
        note_read(
            &self.read,
            match name {
                "exact" => "maps.exact",
                "prefix" => "maps.prefix",
                "ssl_redirect" => "maps.ssl_redirect",
                _ => "maps.sni",
            },
        );
        if let Some(v) = self.fields.lock().ok()?.get(name) {
            return Some(v.clone());
        }
        let m = &self.maps;
        let v = to_value(match name {
            "exact" => &m.exact,
            "prefix" => &m.prefix,
            "ssl_redirect" => &m.ssl_redirect,
            _ => &m.sni,
        });
        self.fields.lock().ok()?.insert(name, v.clone());
        Some(v)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(MAPS_FIELDS)
    }
}

/// One backend as templates see it.
#[derive(Debug)]
pub(super) struct BackendView {
    pub(super) backend: Arc<Backend>,
    /// Its place in the model's backends.
    pub(super) index: usize,
    value: OnceLock<Value>,
    touched: Arc<AtomicBool>,
}

impl BackendView {
    fn full(&self) -> &Value {
        self.value.get_or_init(|| backend_value(&self.backend))
    }
}

impl Object for BackendView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        if key.as_str() != Some("name") {
            self.touched.store(true, Ordering::Relaxed);
        }
        self.full().get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.touched.store(true, Ordering::Relaxed);
        match self.full().try_iter() {
            Ok(keys) => Enumerator::Values(keys.collect()),
            Err(_) => Enumerator::Empty,
        }
    }
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    use super::*;

    /// Backend `ns_web_80` with these slots.
    fn backend_with(slots: crate::model::ServerSlots) -> Backend {
        Backend {
            name: "ns_web_80".to_string(),
            namespace: "ns".to_string(),
            service: "web".to_string(),
            port: 80,
            settings: Arc::default(),
            policies: Vec::new(),
            servers: Arc::new(slots),
        }
    }

    fn ip(text: &str) -> crate::model::Address {
        crate::model::Address::Ip(text.parse().unwrap())
    }

    /// Templates see a backend's slots as they saw the serialized list: printed, indexed
    /// (from the end too), counted, iterated, as maps.
    #[test]
    fn backend_slots_read_as_the_serialized_list() {
        let mut slots = crate::model::ServerSlots::unused(4);
        slots.set(1, Some((ip("10.0.0.1"), 8080)));
        slots.set(3, Some((ip("2001:db8::1"), 80)));
        let backend = backend_with(slots);
        let template = "{{ b.servers }}|{{ b.servers|length }}|{{ b.servers[-1] }}|\
            {{ b.servers[1].address }}|{{ b.servers[0].address is none }}|\
            {% for s in b.servers %}{{ s.name }}={{ s.address }}:{{ s.port }}{% if not loop.last %},{% endif %}{% endfor %}|\
            {% for k, v in b.servers[3]|items %}{{ k }}:{{ v }};{% endfor %}|{{ b.servers[9] is undefined }}|\
            {{ b|list }}|{{ b.servers|map(attribute='port')|sum }}";
        let env = Environment::new();
        let render = |b: Value| {
            env.render_str(template, minijinja::context! { b => b })
                .unwrap()
        };
        let lazy = render(backend_value(&backend));
        assert_eq!(lazy, render(to_value(&backend)));
        assert!(lazy.contains("SRV_4=2001:db8::1:80"), "{lazy}");
    }

    /// Dynamic servers: only the endpoints' servers, each with its id, read the same lazily
    /// and serialized, and as runs of one that say they are dynamic.
    #[test]
    fn dynamic_servers_read_alike_from_either_form() {
        let servers = crate::model::ServerSlots::dynamic([
            (2_000_000_000, ip("10.0.0.2"), 80),
            (7, ip("2001:db8::1"), 8080),
        ]);
        let backend = backend_with(servers);
        let template = "{{ b.servers|length }}|\
            {% for s in b.servers %}{{ s.name }}#{{ s.id }}={{ s.address }}:{{ s.port }};{% endfor %}|\
            {% for r in b.servers|slot_runs %}{{ r.name }} id {{ r.id }} {{ r.dynamic }};{% endfor %}";
        let mut env = Environment::new();
        env.add_filter("slot_runs", slot_runs);
        let render = |b: Value| {
            env.render_str(template, minijinja::context! { b => b })
                .unwrap()
        };
        let lazy = render(backend_value(&backend));
        assert_eq!(lazy, render(to_value(&backend)));
        assert_eq!(
            lazy,
            "2|SRV_7#7=2001:db8::1:8080;SRV_2000000000#2000000000=10.0.0.2:80;|\
             SRV_7 id 7 True;SRV_2000000000 id 2000000000 True;"
        );
    }

    #[test]
    fn slot_runs_group_unused_slots_the_same_from_either_form() {
        // Slots: unused, used, unused ×3, used (IPv6), unused: runs 1, 2, 3-5, 6, 7.
        let mut slots = crate::model::ServerSlots::unused(7);
        slots.set(1, Some((ip("10.0.0.1"), 8080)));
        slots.set(5, Some((ip("2001:db8::1"), 80)));
        let backend = backend_with(slots);
        let runs = "{{ b.servers|slot_runs|length }}:\
            {% for r in b.servers|slot_runs %}{{ r.name }}={{ r.address }}:{{ r.port }}\
            [{{ r.prefix }}{{ r.first }}-{{ r.last }}];{% endfor %}|";
        let template = format!("{runs}{{{{ (b.servers|slot_runs)[2]|list }}}}");
        let mut env = Environment::new();
        env.add_filter("slot_runs", slot_runs);
        let render = |b: Value| {
            env.render_str(&template, minijinja::context! { b => b })
                .unwrap()
        };
        let lazy = render(backend_value(&backend));
        assert_eq!(lazy, render(to_value(&backend)));
        assert_eq!(
            lazy,
            "5:SRV_1=None:1[SRV_1-1];SRV_2=10.0.0.1:8080[SRV_2-2];SRV_3=None:1[SRV_3-5];\
             SRV_6=2001:db8::1:80[SRV_6-6];SRV_7=None:1[SRV_7-7];|\
             ['name', 'address', 'port', 'prefix', 'first', 'last', 'id', 'dynamic']"
        );
        // No slots, no runs; all unused, one.
        for (len, want) in [(0, "0:|"), (3, "1:SRV_1=None:1[SRV_1-3];|")] {
            let empty = backend_with(crate::model::ServerSlots::unused(len));
            for b in [backend_value(&empty), to_value(&empty)] {
                let got = env
                    .render_str(runs, minijinja::context! { b => b })
                    .unwrap();
                assert_eq!(got, want);
            }
        }
    }
}
