//! The plan: what it takes to move HAProxy from one configuration to the next.
//!
//! Whatever can change at run time does: dynamic servers added and deleted, server addresses
//! and states within existing slots, map entries, and crt-list certificates. Anything else needs a reload, and every reload has a
//! reason. To tell the two apart without knowing the templates, both models are rendered with
//! the runtime-changeable parts blanked out: if those renderings differ, the change is
//! structural.

pub mod command;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::{
    Address, Backend, CertPath, CrtListEntry, MapEntry, Model, RouteMaps, ServerSlot, Tls,
};
use crate::plan::command::{Command, ServerState};
use crate::render::{
    CRT_LIST, Content, EXACT_MAP, PREFIX_MAP, RenderedConfig, Renderer, SNI_MAP, SSL_REDIRECT_MAP,
};

/// One configuration as applied: the model and its files.
#[derive(Debug, Clone)]
pub struct Applied {
    pub model: Model,
    pub rendered: RenderedConfig,
    /// haproxy.cfg as the templates in force rendered it with every runtime-changeable part
    /// blanked out (see [`Applied::structure`]), rendered on first use.
    structure: Arc<std::sync::OnceLock<Content>>,
    /// The blanked model `structure` is the rendering of, and the renderer that renders it.
    blanked: Arc<Model>,
    renderer: Arc<Renderer>,
    /// The words of each backend's `default-server` line in `structure`, read when a server is
    /// first added, and shared by the configurations with this structure.
    keywords: Arc<std::sync::OnceLock<BTreeMap<String, Vec<String>>>>,
}

impl Applied {
    pub fn new(model: Model, rendered: RenderedConfig, renderer: &Arc<Renderer>) -> Self {
        Self::following(model, rendered, renderer, None)
    }

    /// Like [`Applied::new`], taking from `previous` what did not change: the blanked
    /// backends of backends both models share, and the structure when the blanked models
    /// are the same and so is the renderer. After an endpoint change that is no rendering
    /// and no copy of the unchanged backends.
    pub fn following(
        model: Model,
        rendered: RenderedConfig,
        renderer: &Arc<Renderer>,
        previous: Option<&Applied>,
    ) -> Self {
        let blanked = blank_runtime_parts(&model, previous);
        let same =
            previous.filter(|p| p.renderer.id() == renderer.id() && p.blanked.same_as(&blanked));
        let keywords = same.map_or_else(Arc::default, |p| p.keywords.clone());
        let structure = same.map_or_else(Arc::default, |p| p.structure.clone());
        Self {
            model,
            rendered,
            structure,
            blanked: Arc::new(blanked),
            renderer: renderer.clone(),
            keywords,
        }
    }

    /// haproxy.cfg as the templates in force rendered it with every runtime-changeable part
    /// blanked out. Two configurations with equal structure differ only in what the runtime
    /// API can change. Rendered with the templates of the moment the configuration was made,
    /// so that a template edit shows as a structural change; rendered once, on first use or
    /// by [`Applied::render_structure_ahead`].
    pub fn structure(&self) -> &Content {
        render_structure(
            &self.structure,
            &self.blanked,
            &self.renderer,
            &self.rendered,
        )
    }

    /// Renders the structure on a thread of its own, for a first start: HAProxy loads the
    /// configuration meanwhile, and the structure is needed only by the next change.
    pub fn render_structure_ahead(&self) {
        if self.structure.get().is_some() {
            return;
        }
        let (cell, blanked, renderer, rendered) = (
            self.structure.clone(),
            self.blanked.clone(),
            self.renderer.clone(),
            self.rendered.clone(),
        );
        let _ = std::thread::Builder::new()
            .name("structure".to_string())
            .spawn(move || {
                render_structure(&cell, &blanked, &renderer, &rendered);
            });
    }

    /// A configuration with `model` and `rendered` but the structure of `structure` (what
    /// HAProxy runs when only the runtime part of a change was applied).
    pub fn with_structure_of(model: Model, rendered: RenderedConfig, structure: &Applied) -> Self {
        Self {
            model,
            rendered,
            structure: structure.structure.clone(),
            blanked: structure.blanked.clone(),
            renderer: structure.renderer.clone(),
            keywords: structure.keywords.clone(),
        }
    }

    /// What each backend's `default-server` line gives the static servers of this
    /// configuration's structure, by backend: the keywords a server added at run time needs to
    /// be the same server (dynamic servers inherit none), whatever a site template puts on that
    /// line. Read from the structure once, on first use.
    fn server_keywords(&self) -> &BTreeMap<String, Vec<String>> {
        self.keywords
            .get_or_init(|| default_server_words(&self.structure().text().unwrap_or_default()))
    }
}

/// The structure in `cell`, rendered from `blanked` by `renderer` if it is not yet.
fn render_structure<'c>(
    cell: &'c std::sync::OnceLock<Content>,
    blanked: &Model,
    renderer: &Renderer,
    rendered: &RenderedConfig,
) -> &'c Content {
    cell.get_or_init(|| {
        renderer
            .render_config_cached(blanked)
            // Cannot happen for a model the same templates rendered; if it does, any change
            // counts as structural.
            .unwrap_or_else(|e| {
                format!("unrenderable: {e}\n{}", rendered.haproxy_cfg())
                    .into_bytes()
                    .into()
            })
    })
}

/// Runtime commands to send, or the reasons a reload is needed instead.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub commands: Vec<Command>,
    pub reload_reasons: Vec<String>,
    /// The certificates as HAProxy holds them after the commands, when that differs from the
    /// new model: a rotated certificate keeps the file name HAProxy loaded it under (see
    /// [`with_running_names`]).
    pub running_tls: Option<Tls>,
    /// Dynamic servers the commands put in maintenance, to delete once drained.
    pub drains: Vec<Drain>,
}

/// A dynamic server that left the model: in maintenance, to be deleted (`del server`) once
/// its connections are gone or its time is up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Drain {
    pub backend: String,
    pub server: String,
}

/// Compares what HAProxy runs with what is wanted.
pub fn plan(old: &Applied, new: &Applied) -> Plan {
    let mut plan = Plan::default();
    if old.rendered == new.rendered && old.structure() == new.structure() {
        return plan;
    }
    // CA bundles and client certificates are read by HAProxy only when it loads (and their
    // file names, which follow the content, are in haproxy.cfg).
    if let Some(path) = static_file_change(&old.model, &new.model) {
        plan.reload_reasons.push(format!("{path} changed"));
        return plan;
    }
    if old.structure() != new.structure() {
        plan.reload_reasons.push(structural_reason(
            &old.model,
            &new.model,
            &old.structure().text().unwrap_or_default(),
            &new.structure().text().unwrap_or_default(),
        ));
        return plan;
    }
    // HAProxy reads error pages only when it loads its configuration.
    if old.model.errorfiles != new.model.errorfiles {
        plan.reload_reasons
            .push("error pages (--configmap-errorfiles) changed".to_string());
        return plan;
    }
    // HAProxy reads pattern files when it loads, and only for the ACLs and maps that name
    // them: a verified reload puts every user of a changed file on the new content at once.
    if let Some(path) = pattern_file_change(&old.model, &new.model) {
        plan.reload_reasons.push(format!(
            "pattern file {path} (--configmap-patternfiles) changed"
        ));
        return plan;
    }
    servers(old, new, &mut plan);
    if !Arc::ptr_eq(&old.model.maps, &new.model.maps) {
        maps(old, new, &mut plan);
    }
    if !Arc::ptr_eq(&old.model.tls, &new.model.tls) {
        let tls = with_running_names(&old.model.tls, &new.model.tls);
        certificates(&old.model.tls, &tls, &mut plan);
        if tls != *new.model.tls {
            plan.running_tls = Some(tls);
        }
    }
    // Every command must be expressible; if one is not, the change goes through a reload.
    if let Some(e) = plan.commands.iter().find_map(|c| c.to_wire().err()) {
        plan.reload_reasons
            .push(format!("cannot apply at run time: {e}"));
    }
    if !plan.reload_reasons.is_empty() {
        plan.commands.clear();
        plan.running_tls = None;
        plan.drains.clear();
    }
    plan
}

/// Runtime commands that bring the parts `old` and `new` share up to date, whatever else
/// differs. Used when the new configuration cannot be loaded (it failed its check), so that
/// endpoint, route and certificate changes still reach the running HAProxy instead of waiting
/// for the configuration to be fixed. Returns the commands and the model HAProxy runs after
/// them: the old structure with the new runtime state where it fits.
pub fn runtime_only(old: &Applied, new: &Applied) -> (Vec<Command>, Model, Vec<Drain>) {
    let mut plan = Plan::default();
    let mut model = old.model.clone();
    // Dynamic servers get the keywords of the configuration HAProxy runs.
    let keywords = old.server_keywords();
    for ob in model
        .backends
        .iter_mut()
        .chain(model.tcp_backends.iter_mut())
    {
        let Some(nb) = new
            .model
            .backends
            .iter()
            .chain(&new.model.tcp_backends)
            .find(|b| b.name == ob.name && b.servers.len() == ob.servers.len())
        else {
            continue;
        };
        if ob.servers == nb.servers {
            continue;
        }
        let ob = Arc::make_mut(ob);
        let added = added_count(&plan);
        for i in ob.servers.differing(&nb.servers) {
            let Some(ns) = nb.servers.get(i) else {
                continue;
            };
            let mut one = Plan::default();
            if nb.servers.is_dynamic() {
                dynamic_server_commands(
                    &nb.name,
                    i,
                    ob.servers.occupant(i),
                    &nb.servers,
                    keywords,
                    &mut one,
                );
            } else {
                server_commands(&nb.name, &ns, &mut one);
            }
            if one.reload_reasons.is_empty() {
                plan.commands.extend(one.commands);
                plan.drains.extend(one.drains);
                Arc::make_mut(&mut ob.servers).set(i, ns.address.map(|a| (a, ns.port)));
            }
        }
        // The cookie settings HAProxy runs are the old configuration's.
        if added_count(&plan) > added {
            dynamic_cookies(ob, &mut plan);
        }
    }
    // Routes may only point at backends (and route policies) the running HAProxy has.
    let servable = |value: &str| {
        // The canary part of the maps (route-acl): no canary, or a set the running HAProxy has.
        if value == crate::translate::routes::NO_CANARY
            || old
                .model
                .frontend_rules
                .canaries
                .iter()
                .any(|c| c.set == value)
        {
            return true;
        }
        let (backend, policy) = value.split_once('.').unwrap_or((value, ""));
        old.model.backends.iter().any(|b| {
            b.name == backend && (policy.is_empty() || b.policies.iter().any(|p| p.id == policy))
        })
    };
    let merge = |old_entries: &[MapEntry], new_entries: &[MapEntry]| -> Vec<MapEntry> {
        let mut out: BTreeMap<&str, &MapEntry> = BTreeMap::new();
        for e in new_entries {
            if servable(&e.value) {
                out.insert(&e.key, e);
            } else if let Some(o) = old_entries.iter().find(|o| o.key == e.key) {
                out.insert(&o.key, o);
            }
        }
        out.into_values().cloned().collect()
    };
    let route_maps = Arc::make_mut(&mut model.maps);
    route_maps.exact = merge(&old.model.maps.exact, &new.model.maps.exact);
    route_maps.prefix = merge(&old.model.maps.prefix, &new.model.maps.prefix);
    // ssl-passthrough: only to TCP backends the running HAProxy has.
    route_maps.sni = {
        let mut out: BTreeMap<&str, &MapEntry> = BTreeMap::new();
        for e in &new.model.maps.sni {
            if old.model.tcp_backends.iter().any(|b| *b.name == *e.value) {
                out.insert(&e.key, e);
            } else if let Some(o) = old.model.maps.sni.iter().find(|o| o.key == e.key) {
                out.insert(&o.key, o);
            }
        }
        out.into_values().cloned().collect()
    };
    if old.model.maps.sni.is_empty() != route_maps.sni.is_empty() {
        // The passthrough frontend exists or not: that is structural.
        route_maps.sni = old.model.maps.sni.clone();
    }
    let codes = &old.model.redirect_codes;
    let ported = &old.model.frontend_rules.ssl_redirect_ports;
    route_maps.ssl_redirect = new
        .model
        .maps
        .ssl_redirect
        .iter()
        .filter(|e| {
            codes.iter().any(|c| c.to_string() == *e.value)
                || ported.iter().any(|p| p.map_value() == *e.value)
        })
        .cloned()
        .collect();
    let target = Applied::with_structure_of(model.clone(), new.rendered.clone(), old);
    maps(old, &target, &mut plan);
    if old.model.tls.enabled() && new.model.tls.enabled() {
        let mut certs = Plan::default();
        let tls = with_running_names(&old.model.tls, &new.model.tls);
        certificates(&old.model.tls, &tls, &mut certs);
        if certs.reload_reasons.is_empty() {
            plan.commands.extend(certs.commands);
            // Only the certificates changed at run time; the bind options and the files
            // HAProxy reads when it loads are still the old ones.
            let old_tls = &old.model.tls;
            model.tls = Arc::new(crate::model::Tls {
                alpn: old_tls.alpn.clone(),
                strict_sni: old_tls.strict_sni,
                client_auth: old_tls.client_auth.clone(),
                static_files: old_tls.static_files.clone(),
                ..tls
            });
        }
    }
    plan.commands.retain(|c| c.to_wire().is_ok());
    (plan.commands, model, plan.drains)
}

/// A server as `show servers state` reports it: address, port, and whether it is in forced
/// maintenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedServer {
    /// `None` when HAProxy reports no IP address (a server that resolves a DNS name and has
    /// no answer yet).
    pub address: Option<IpAddr>,
    pub port: u16,
    pub maintenance: bool,
}

/// Parses `show servers state` (format version 1): (backend, server) → state.
pub fn parse_servers_state(text: &str) -> BTreeMap<(String, String), ReportedServer> {
    text.lines()
        .filter_map(parse_server_state_line)
        .map(|(backend, server, state)| ((backend.to_string(), server.to_string()), state))
        .collect()
}

/// One line of `show servers state` (format version 1): backend, server and state; `None`
/// for the version line, comments and lines of another shape.
pub fn parse_server_state_line(line: &str) -> Option<(&str, &str, ReportedServer)> {
    if line.starts_with('#') {
        return None;
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 19 {
        return None;
    }
    let (Ok(admin), Ok(port)) = (f[6].parse::<u32>(), f[18].parse::<u16>()) else {
        return None;
    };
    Some((
        f[1],
        f[3],
        ReportedServer {
            address: f[4].parse().ok(),
            port,
            // SRV_ADMF_FMAINT; the "configured" bit (0x04) stays set after `ready`.
            maintenance: admin & 0x01 != 0,
        },
    ))
}

/// Commands that bring every server to the model's state where HAProxy reports otherwise:
/// after a reload, nothing may silently keep an old address or stay in maintenance.
pub fn server_repairs(
    model: &Model,
    state: &BTreeMap<(String, String), ReportedServer>,
) -> Vec<Command> {
    let check = ServerCheck::new(model);
    let mut plan = Plan::default();
    for ((backend, server), actual) in state {
        check.repair(backend, server, actual, &mut plan);
    }
    plan.commands
}

/// Compares servers as HAProxy reports them, one at a time, with the model's slots.
#[derive(Debug)]
pub struct ServerCheck<'m> {
    backends: std::collections::HashMap<&'m str, &'m Backend>,
}

impl<'m> ServerCheck<'m> {
    pub fn new(model: &'m Model) -> Self {
        Self {
            backends: model
                .backends
                .iter()
                .chain(&model.tcp_backends)
                .map(|b| (b.name.as_str(), &**b))
                .collect(),
        }
    }

    /// Adds to `plan` the commands that bring `server` of `backend` from `actual` to the
    /// model's slot; none for a server the model has not.
    pub fn repair(&self, backend: &str, server: &str, actual: &ReportedServer, plan: &mut Plan) {
        let Some(b) = self.backends.get(backend) else {
            return;
        };
        let Some(slot) = server
            .strip_prefix("SRV_")
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| b.servers.get(i))
            .filter(|slot| &*slot.name == server)
        else {
            return;
        };
        let right = match &slot.address {
            Some(Address::Ip(ip)) => {
                !actual.maintenance && actual.port == slot.port && actual.address == Some(*ip)
            }
            // DNS names are resolved by HAProxy; nothing to compare.
            Some(Address::Name(_)) => true,
            None => actual.maintenance,
        };
        if !right {
            server_commands(backend, &slot, plan);
        }
    }
}

/// Whether `actual` (HAProxy's order after runtime commands) serves every name with the same
/// line as `wanted`: for each SNI name on several lines, their relative order must match. A
/// line without SNI names answers for its certificate's own names, which are unknown here, so
/// it must keep its place exactly.
fn same_precedence(actual: &[&CrtListEntry], wanted: &[CrtListEntry]) -> bool {
    if actual.len() != wanted.len() {
        return false;
    }
    if actual.iter().zip(wanted).all(|(x, y)| *x == y) {
        return true;
    }
    let position: BTreeMap<&CrtListEntry, usize> =
        actual.iter().enumerate().map(|(i, e)| (*e, i)).collect();
    let mut by_name: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, entry) in wanted.iter().enumerate() {
        if entry.sni.is_empty() && actual.get(i) != Some(&entry) {
            return false;
        }
        for name in &entry.sni {
            by_name
                .entry(name.as_str())
                .or_default()
                .push(position.get(entry).copied().unwrap_or(usize::MAX));
        }
    }
    by_name
        .values()
        .all(|positions| positions.windows(2).all(|w| w[0] < w[1]))
}

/// The model with everything the runtime API can change replaced by fixed placeholders.
/// Backends shared with `previous`'s model take its blanked backend; a blanked backend equal
/// to `previous`'s is shared with it.
fn blank_runtime_parts(model: &Model, previous: Option<&Applied>) -> Model {
    let mut m = model.clone();
    let blank =
        |list: &mut [Arc<Backend>], before: &[Arc<Backend>], blanked_before: &[Arc<Backend>]| {
            for (i, b) in list.iter_mut().enumerate() {
                let (was, blanked_was) = (before.get(i), blanked_before.get(i));
                if let (Some(was), Some(blanked_was)) = (was, blanked_was) {
                    if Arc::ptr_eq(was, b) {
                        *b = blanked_was.clone();
                        continue;
                    }
                }
                if !b.servers.all_unused() {
                    Arc::make_mut(&mut Arc::make_mut(b).servers).clear_all();
                }
                if let Some(blanked_was) = blanked_was.filter(|w| ***w == **b) {
                    *b = blanked_was.clone();
                }
            }
        };
    let (before, blanked_before) =
        previous.map_or((None, None), |p| (Some(&p.model), Some(&p.blanked)));
    blank(
        &mut m.backends,
        before.map_or(&[], |p| &p.backends),
        blanked_before.map_or(&[], |p| &p.backends),
    );
    blank(
        &mut m.tcp_backends,
        before.map_or(&[], |p| &p.tcp_backends),
        blanked_before.map_or(&[], |p| &p.tcp_backends),
    );
    // Whether the passthrough frontend exists is structural; which names it passes is not.
    let mut maps = RouteMaps::default();
    if !m.maps.sni.is_empty() {
        maps.sni.push(MapEntry {
            key: "placeholder".into(),
            value: "placeholder".into(),
        });
    }
    m.maps = Arc::new(maps);
    // Whether an HTTPS frontend exists is structural; which certificates it serves is not.
    // (Built anew rather than copied: the certificates are most of it.)
    let tls = &model.tls;
    m.tls = Arc::new(Tls {
        pem_files: Vec::new(),
        crt_list: if tls.enabled() {
            vec![CrtListEntry {
                // Of no Secret: only its presence is compared.
                path: CertPath::new(
                    "certs/placeholder.pem".to_string(),
                    crate::objects::Key::new("", "placeholder"),
                ),
                options: None,
                sni: Vec::new(),
            }]
        } else {
            Vec::new()
        },
        alpn: tls.alpn.clone(),
        strict_sni: tls.strict_sni,
        client_auth: tls.client_auth.clone(),
        static_files: tls.static_files.clone(),
    });
    m
}

/// The first file haproxy.cfg names directly (CA bundle, client certificate to the pods) whose
/// content differs, or that one side has and the other not.
fn static_file_change(old: &Model, new: &Model) -> Option<String> {
    let files = |m: &Model| -> BTreeMap<String, Arc<str>> {
        m.tls
            .static_files
            .iter()
            .map(|p| (p.path.to_string(), p.content.clone()))
            .collect()
    };
    first_difference(&files(old), &files(new))
}

/// The path of a pattern file that differs between the models (added, changed or removed).
fn pattern_file_change(old: &Model, new: &Model) -> Option<String> {
    if old.patterns == new.patterns {
        return None;
    }
    let files = |m: &Model| -> BTreeMap<String, Arc<str>> {
        m.patterns
            .iter()
            .map(|p| (p.path.clone(), p.content.clone()))
            .collect()
    };
    first_difference(&files(old), &files(new))
}

/// The first path whose content differs between `a` and `b`, or that one has and the other
/// not; the new side's names first, since they say which file and which content.
fn first_difference(
    a: &BTreeMap<String, Arc<str>>,
    b: &BTreeMap<String, Arc<str>>,
) -> Option<String> {
    b.keys()
        .chain(a.keys())
        .find(|k| a.get(*k) != b.get(*k))
        .cloned()
}

fn structural_reason(old: &Model, new: &Model, old_cfg: &str, new_cfg: &str) -> String {
    let names = |m: &Model| -> BTreeMap<String, String> {
        m.backends
            .iter()
            .chain(&m.tcp_backends)
            .map(|b| {
                let servers = if b.servers.is_dynamic() {
                    "dynamic servers".to_string()
                } else {
                    b.servers.len().to_string()
                };
                (b.name.clone(), servers)
            })
            .collect()
    };
    let (a, b) = (names(old), names(new));
    let added: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    let removed: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
    if !added.is_empty() || !removed.is_empty() {
        let list = |v: &[&String]| {
            v.iter()
                .take(3)
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return format!(
            "backends changed (added: [{}], removed: [{}])",
            list(&added),
            list(&removed)
        );
    }
    for (name, slots) in &b {
        if a.get(name) != Some(slots) {
            return format!(
                "server slots of {name} changed from {} to {slots}",
                a.get(name).map_or("0", String::as_str)
            );
        }
    }
    let line = old_cfg
        .lines()
        .zip(new_cfg.lines())
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| old_cfg.lines().count().min(new_cfg.lines().count()));
    let text = new_cfg.lines().nth(line).unwrap_or("<end of file>").trim();
    // The reason is logged and shown in /readyz: never with a password hash.
    let text = crate::translate::auth::redact_config(text);
    format!("configuration changed at line {}: {text}", line + 1)
}

fn servers(old: &Applied, new: &Applied, plan: &mut Plan) {
    let old_backends = old.model.backends.iter().chain(&old.model.tcp_backends);
    let new_backends = new.model.backends.iter().chain(&new.model.tcp_backends);
    let keywords = new.server_keywords();
    for (ob, nb) in old_backends.zip(new_backends) {
        if Arc::ptr_eq(ob, nb) {
            continue;
        }
        let added = added_count(plan);
        for i in ob.servers.differing(&nb.servers) {
            if nb.servers.is_dynamic() {
                let old = ob.servers.occupant(i);
                dynamic_server_commands(&nb.name, i, old, &nb.servers, keywords, plan);
            } else if let Some(ns) = nb.servers.get(i) {
                server_commands(&nb.name, &ns, plan);
            }
        }
        if added_count(plan) > added {
            dynamic_cookies(nb, plan);
        }
    }
}

/// How many `add server` commands `plan` holds.
fn added_count(plan: &Plan) -> usize {
    plan.commands
        .iter()
        .filter(|c| matches!(c, Command::AddServer { .. }))
        .count()
}

/// After servers were added to `backend`: HAProxy 2.6 gives a server added at run time no
/// dynamic cookie (its cookie is empty, and clients get an empty one), so a backend with
/// dynamic cookies has them computed again for every server.
fn dynamic_cookies(backend: &Backend, plan: &mut Plan) {
    let dynamic = backend
        .settings
        .cookie_persistence
        .as_ref()
        .is_some_and(|c| c.dynamic);
    if dynamic {
        plan.commands.push(Command::EnableDynamicCookie {
            backend: backend.name.clone(),
        });
    }
}

/// Commands that move the dynamic server at slot `index` of `backend` from `old` (its address
/// and port in the running configuration, if it has the server) to what `new` holds there: a
/// new endpoint is added (`add server` with the backend's server keywords, health checks
/// enabled when they include `check`, then made ready); a removed one is put in maintenance
/// and left to drain ([`Plan::drains`]); one whose address changed (another endpoint took its
/// id) is moved like a slot.
fn dynamic_server_commands(
    backend: &str,
    index: usize,
    old: Option<(&Address, u16)>,
    new: &crate::model::ServerSlots,
    keywords: &BTreeMap<String, Vec<String>>,
    plan: &mut Plan,
) {
    let server = new.name_at(index).to_string();
    match (old, new.occupant(index)) {
        (_, Some((address @ Address::Name(_), _))) => plan
            .reload_reasons
            .push(format!("server {backend}/{server} now points at {address}")),
        (None, Some((Address::Ip(addr), port))) => {
            let keywords = keywords.get(backend).cloned().unwrap_or_default();
            let check = keywords.iter().any(|k| k == "check");
            plan.commands.push(Command::AddServer {
                backend: backend.to_string(),
                server: server.clone(),
                addr: *addr,
                port,
                id: u32::try_from(index + 1).unwrap_or(u32::MAX),
                keywords,
            });
            if check {
                plan.commands.push(Command::EnableHealth {
                    backend: backend.to_string(),
                    server: server.clone(),
                });
            }
            plan.commands.push(Command::SetServerState {
                backend: backend.to_string(),
                server,
                state: ServerState::Ready,
            });
        }
        (Some(_), Some(_)) => {
            if let Some(slot) = new.get(index) {
                server_commands(backend, &slot, plan);
            }
        }
        (Some(_), None) => {
            plan.commands.push(Command::SetServerState {
                backend: backend.to_string(),
                server: server.clone(),
                state: ServerState::Maint,
            });
            plan.drains.push(Drain {
                backend: backend.to_string(),
                server,
            });
        }
        (None, None) => {}
    }
}

/// The words of each backend's `default-server` lines in `cfg`, by backend (one pass).
fn default_server_words(cfg: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut backend: Option<&str> = None;
    for line in cfg.lines() {
        if !line.starts_with(char::is_whitespace) {
            if !line.is_empty() && !line.starts_with('#') {
                backend = line.strip_prefix("backend ").map(str::trim);
            }
            continue;
        }
        let Some(name) = backend else {
            continue;
        };
        // Several lines add up, as HAProxy reads them for the servers after them.
        let mut words = line.split_whitespace();
        if words.next() == Some("default-server") {
            out.entry(name.to_string())
                .or_insert_with(Vec::new)
                .extend(words.map(str::to_string));
        }
    }
    out
}

/// Commands that put a slot in the state the model describes. Idempotent.
pub fn server_commands(backend: &str, slot: &ServerSlot, plan: &mut Plan) {
    let state = |state| Command::SetServerState {
        backend: backend.to_string(),
        server: slot.name.to_string(),
        state,
    };
    match &slot.address {
        Some(Address::Ip(addr)) => {
            plan.commands.push(Command::SetServerAddr {
                backend: backend.to_string(),
                server: slot.name.to_string(),
                addr: *addr,
                port: slot.port,
            });
            plan.commands.push(state(ServerState::Ready));
        }
        // ExternalName servers are DNS names; their resolution is set at start-up.
        Some(address @ Address::Name(_)) => plan.reload_reasons.push(format!(
            "server {backend}/{} now points at {address}",
            slot.name
        )),
        None => plan.commands.push(state(ServerState::Maint)),
    }
}

fn maps(old: &Applied, new: &Applied, plan: &mut Plan) {
    let pairs: [(&str, &[MapEntry], &[MapEntry]); 4] = [
        (EXACT_MAP, &old.model.maps.exact, &new.model.maps.exact),
        (PREFIX_MAP, &old.model.maps.prefix, &new.model.maps.prefix),
        (
            SSL_REDIRECT_MAP,
            &old.model.maps.ssl_redirect,
            &new.model.maps.ssl_redirect,
        ),
        (SNI_MAP, &old.model.maps.sni, &new.model.maps.sni),
    ];
    for (map, old_entries, new_entries) in pairs {
        map_commands(map, old_entries, new_entries, &mut plan.commands);
    }
}

/// The commands that make map `map` hold `new_entries` where it held `old_entries`: both
/// walked side by side in key order, additions and changes first, then removals.
fn map_commands(
    map: &str,
    old_entries: &[MapEntry],
    new_entries: &[MapEntry],
    commands: &mut Vec<Command>,
) {
    if old_entries == new_entries {
        return;
    }
    let (a, b) = (
        SortedEntries::of(old_entries),
        SortedEntries::of(new_entries),
    );
    let mut removals = Vec::new();
    let (mut i, mut j) = (0, 0);
    loop {
        let (x, y) = (a.get(i), b.get(j));
        // The side whose key comes first (an exhausted side comes last).
        let order = match (x, y) {
            (None, None) => break,
            (Some(x), Some(y)) => x.0.cmp(y.0),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
        };
        match (order, x, y) {
            (std::cmp::Ordering::Less, Some(x), _) => {
                removals.push(Command::DelMap {
                    map: map.to_string(),
                    key: x.0.to_string(),
                });
                i += 1;
            }
            (std::cmp::Ordering::Greater, _, Some(y)) => {
                commands.push(Command::AddMap {
                    map: map.to_string(),
                    key: y.0.to_string(),
                    value: y.1.to_string(),
                });
                j += 1;
            }
            (_, Some(x), Some(y)) => {
                if x.1 != y.1 {
                    commands.push(Command::SetMap {
                        map: map.to_string(),
                        key: y.0.to_string(),
                        value: y.1.to_string(),
                    });
                }
                i += 1;
                j += 1;
            }
            // Not reached: `order` names a side only when that side has an entry.
            _ => break,
        }
    }
    commands.extend(removals);
}

/// A map's entries as (key, value) sorted by key, one per key. Translation writes them so,
/// and they are then read where they are (a copy of a map of 40 000 entries took 1.3 MB
/// beside both models); anything else is read into a sorted map first (the last entry of a
/// key wins, as in HAProxy's file).
enum SortedEntries<'a> {
    AsWritten(&'a [MapEntry]),
    Sorted(Vec<(&'a str, &'a str)>),
}

impl<'a> SortedEntries<'a> {
    fn of(entries: &'a [MapEntry]) -> Self {
        if entries.windows(2).all(|w| w[0].key < w[1].key) {
            Self::AsWritten(entries)
        } else {
            let sorted: BTreeMap<&str, &str> =
                entries.iter().map(|e| (&*e.key, &*e.value)).collect();
            Self::Sorted(sorted.into_iter().collect())
        }
    }

    fn get(&self, at: usize) -> Option<(&'a str, &'a str)> {
        match self {
            Self::AsWritten(entries) => entries.get(at).map(|e| (&*e.key, &*e.value)),
            Self::Sorted(pairs) => pairs.get(at).copied(),
        }
    }
}

/// `new` with every crt-list certificate of a Secret that HAProxy already holds under another
/// file name (an older content) renamed to that name. A rotated certificate is then replaced
/// in place (`set ssl cert` + `commit ssl cert`): HAProxy allows that for every certificate,
/// the default one included (which it will not remove from a crt-list at run time), and no
/// name goes without its certificate in between. The disk has the new file under its own
/// name; the old file, which HAProxy still names, stays until a reload no longer loads it.
pub fn with_running_names(running: &Tls, new: &Tls) -> Tls {
    let listed = |tls: &Tls| -> BTreeMap<crate::objects::Key, CertPath> {
        tls.crt_list
            .iter()
            .map(|e| (e.path.secret().clone(), e.path.clone()))
            .collect()
    };
    let held = listed(running);
    let renames: BTreeMap<CertPath, CertPath> = listed(new)
        .into_iter()
        .filter_map(|(key, path)| {
            let old = held.get(&key)?;
            (*old != path).then(|| (path, old.clone()))
        })
        .collect();
    let mut out = new.clone();
    for path in out
        .crt_list
        .iter_mut()
        .map(|e| &mut e.path)
        .chain(out.pem_files.iter_mut().map(|p| &mut p.path))
    {
        if let Some(name) = renames.get(&*path) {
            path.clone_from(name);
        }
    }
    out
}

/// Certificate changes at run time, from the certificates HAProxy holds (`a`) to `b` (named as
/// [`with_running_names`] does). A changed certificate is replaced in place (`set ssl cert` +
/// `commit ssl cert`). New crt-list lines load their certificate first
/// (`new`/`set`/`commit ssl cert`) and are then added; removed lines are deleted, and their
/// certificate too when nothing uses it. The first line is the default certificate: HAProxy
/// will not delete it at run time, so changing which Secret is first needs a reload.
fn certificates(a: &Tls, b: &Tls, plan: &mut Plan) {
    if a == b {
        return;
    }
    if a.crt_list.first() != b.crt_list.first() {
        plan.reload_reasons
            .push("the default certificate changed".to_string());
        return;
    }
    let lines_of =
        |list: &[CrtListEntry], path: &CertPath| list.iter().filter(|e| e.path == *path).count();
    let added: Vec<&CrtListEntry> = b
        .crt_list
        .iter()
        .filter(|e| !a.crt_list.contains(e))
        .collect();
    let removed: Vec<&CrtListEntry> = a
        .crt_list
        .iter()
        .filter(|e| !b.crt_list.contains(e))
        .collect();
    // Lines with TLS options of their own are written by a reload: the runtime commands
    // here add plain lines.
    if added.iter().chain(&removed).any(|e| e.options.is_some()) {
        plan.reload_reasons
            .push("a crt-list line with TLS options changed".to_string());
        return;
    }
    // `del ssl crt-list` names a certificate, not a line: a certificate on several lines is
    // ambiguous, so such changes go through a reload.
    if added
        .iter()
        .chain(&removed)
        .any(|e| lines_of(&a.crt_list, &e.path) > 1 || lines_of(&b.crt_list, &e.path) > 1)
    {
        plan.reload_reasons
            .push("a certificate used on several crt-list lines changed".to_string());
        return;
    }
    // HAProxy appends added lines at the end of its list, and a name on several lines is
    // served by the first. If that order would give a name another certificate than the new
    // crt-list does (a newer line ahead of an older one for the same name), reload instead.
    let simulated: Vec<&CrtListEntry> = a
        .crt_list
        .iter()
        .filter(|e| !removed.contains(e))
        .chain(added.iter().copied())
        .collect();
    if !same_precedence(&simulated, &b.crt_list) {
        plan.reload_reasons.push(
            "a crt-list line would take precedence over another for the same name".to_string(),
        );
        return;
    }
    let old_pem: BTreeMap<&str, &str> = a
        .pem_files
        .iter()
        .map(|p| (p.path.as_str(), &*p.content))
        .collect();
    for pem in &b.pem_files {
        match old_pem.get(pem.path.as_str()) {
            Some(content) if **content == *pem.content => {}
            Some(_) => {
                plan.commands.push(Command::SetSslCert {
                    path: pem.path.to_string(),
                    pem: pem.content.to_string(),
                });
                plan.commands.push(Command::CommitSslCert {
                    path: pem.path.to_string(),
                });
            }
            None => {
                plan.commands.push(Command::NewSslCert {
                    path: pem.path.to_string(),
                });
                plan.commands.push(Command::SetSslCert {
                    path: pem.path.to_string(),
                    pem: pem.content.to_string(),
                });
                plan.commands.push(Command::CommitSslCert {
                    path: pem.path.to_string(),
                });
            }
        }
    }
    // A line whose SNI names changed is removed, then added again.
    for entry in &removed {
        plan.commands.push(Command::DelSslCrtList {
            crt_list: CRT_LIST.to_string(),
            path: entry.path.to_string(),
        });
    }
    for entry in &added {
        plan.commands.push(Command::AddSslCrtList {
            crt_list: CRT_LIST.to_string(),
            path: entry.path.to_string(),
            sni: entry.sni.clone(),
        });
    }
    for entry in &removed {
        if !b.pem_files.iter().any(|p| p.path == entry.path) {
            plan.commands.push(Command::DelSslCert {
                path: entry.path.to_string(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use std::collections::BTreeMap;

    use super::*;
    use crate::objects::{Key, Object};
    use crate::pipeline::Pipeline;
    use crate::store::Store;
    use crate::translate::TranslateConfig;

    fn pipeline() -> Pipeline {
        Pipeline::load(
            None,
            None,
            TranslateConfig {
                version: "test".into(),
                watch_ingress_without_class: true,
                ..TranslateConfig::default()
            },
        )
        .unwrap()
    }

    /// A cluster: `paths` on host a.com to Service `web` (and `api` if `with_api`), `ips` as
    /// web's endpoints, `annotations` on the Service.
    fn cluster(
        paths: &[&str],
        ips: &[&str],
        annotations: &serde_json::Value,
        with_api: bool,
    ) -> Applied {
        let store = Store::from_objects(objects(paths, ips, annotations, with_api));
        let p = pipeline();
        let out = p.run(&store).unwrap();
        Applied::new(out.model, out.rendered, &p.renderer)
    }

    /// The objects of [`cluster`].
    fn objects(
        paths: &[&str],
        ips: &[&str],
        annotations: &serde_json::Value,
        with_api: bool,
    ) -> Vec<Object> {
        let objects = vec![
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                   "metadata": {"name": "i", "namespace": "ns"},
                   "spec": {"rules": [{"host": "a.com", "http": {"paths": paths.iter().map(|p| json!({
                        "path": p, "pathType": "Prefix",
                        "backend": {"service": {"name": if p.starts_with("/api") && with_api {"api"} else {"web"}, "port": {"number": 80}}}
                   })).collect::<Vec<_>>()}}]}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ns", "annotations": annotations},
                   "spec": {"ports": [{"port": 80}]}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "ns"},
                   "spec": {"ports": [{"port": 80}]}}),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": "web-1", "namespace": "ns", "labels": {"kubernetes.io/service-name": "web"}},
                   "addressType": "IPv4", "ports": [{"port": 8080}],
                   "endpoints": ips.iter().map(|ip| json!({"addresses": [ip]})).collect::<Vec<_>>()}),
        ];
        objects
            .into_iter()
            .map(|v| Object::from_value(v).unwrap())
            .collect()
    }

    /// A configuration made following the previous one shares its structure when only
    /// runtime parts changed, and plans as one made from scratch; a structural change or
    /// other templates give a new structure.
    #[test]
    fn following_configurations_share_what_did_not_change() {
        let p = pipeline();
        let applied = |objects: Vec<Object>, previous: Option<&Applied>| {
            let out = p.run(&Store::from_objects(objects)).unwrap();
            let fresh = Applied::new(
                out.model.clone(),
                out.rendered.clone(),
                &pipeline().renderer,
            );
            (
                Applied::following(out.model, out.rendered, &p.renderer, previous),
                fresh,
            )
        };
        let none = json!({});
        let (a, _) = applied(
            objects(&["/"], &["10.0.0.1", "10.0.0.2"], &none, false),
            None,
        );
        let (moved, fresh) = applied(
            objects(&["/"], &["10.0.0.1", "10.0.0.3"], &none, false),
            Some(&a),
        );
        assert!(a.structure().ptr_eq(moved.structure()));
        assert_eq!(moved.structure(), fresh.structure());
        assert_eq!(plan(&a, &moved), plan(&a, &fresh));
        assert!(!plan(&a, &moved).commands.is_empty());

        let timeout = json!({"haproxy.org/timeout-server": "7s"});
        let (slower, fresh) = applied(
            objects(&["/"], &["10.0.0.1", "10.0.0.3"], &timeout, false),
            Some(&moved),
        );
        assert_eq!(slower.structure(), fresh.structure());
        assert!(
            slower
                .structure()
                .text()
                .unwrap()
                .contains("timeout server 7000")
        );
        assert_eq!(plan(&moved, &slower), plan(&moved, &fresh));
        assert!(!plan(&moved, &slower).reload_reasons.is_empty());

        // The same model under other templates: a new structure.
        let site = tempfile::tempdir().unwrap();
        std::fs::create_dir(site.path().join("parts")).unwrap();
        std::fs::write(site.path().join("parts/stats.j2"), "# no stats\n").unwrap();
        let other = Arc::new(
            Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap(),
        );
        let again = Applied::following(
            slower.model.clone(),
            slower.rendered.clone(),
            &other,
            Some(&slower),
        );
        assert!(again.structure().text().unwrap().contains("# no stats"));
        assert_ne!(again.structure(), slower.structure());
    }

    fn plan_between(a: &Applied, b: &Applied) -> Plan {
        plan(a, b)
    }

    /// The id every replica gives `ip`:8080 (the backend's only endpoint there).
    fn id_of(ip: &str) -> u32 {
        let endpoint = (Address::Ip(ip.parse().unwrap()), 8080);
        crate::translate::slots::assign_ids(&[endpoint])[0]
    }

    #[test]
    fn endpoint_changes_add_and_drain_dynamic_servers() {
        let check = json!({"haproxy.org/check": "true", "haproxy.org/pod-maxconn": "50"});
        let a = cluster(&["/"], &["10.0.0.1", "10.0.0.2"], &check, false);
        let b = cluster(&["/"], &["10.0.0.1", "10.0.0.3"], &check, false);
        let p = plan_between(&a, &b);
        assert!(p.reload_reasons.is_empty(), "{:?}", p.reload_reasons);
        let lines: Vec<String> = p.commands.iter().map(ToString::to_string).collect();
        let (gone, new) = (id_of("10.0.0.2"), id_of("10.0.0.3"));
        // The new endpoint is added with the backend's server keywords (dynamic servers
        // inherit no default-server), its checks enabled, then made ready; the removed one
        // goes into maintenance and is left to drain.
        let mut wanted = vec![
            format!("add server ns_web_80/SRV_{new} 10.0.0.3:8080 id {new} check maxconn 50"),
            format!("enable health ns_web_80/SRV_{new}"),
            format!("set server ns_web_80/SRV_{new} state ready"),
            format!("set server ns_web_80/SRV_{gone} state maint"),
        ];
        if gone < new {
            wanted.rotate_left(3);
        }
        assert_eq!(lines, wanted);
        assert_eq!(
            p.drains,
            vec![Drain {
                backend: "ns_web_80".into(),
                server: format!("SRV_{gone}"),
            }]
        );
        assert_eq!(plan_between(&a, &a), Plan::default());
        // From none to some and back: never a reload.
        let none = cluster(&["/"], &[], &check, false);
        let many: Vec<String> = (1..=60).map(|i| format!("10.0.1.{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let many = cluster(&["/"], &many, &check, false);
        for (x, y) in [(&none, &many), (&many, &none), (&none, &a)] {
            let p = plan_between(x, y);
            assert!(p.reload_reasons.is_empty(), "{:?}", p.reload_reasons);
        }
        assert_eq!(plan_between(&none, &many).commands.len(), 180);
        assert_eq!(plan_between(&many, &none).drains.len(), 60);
    }

    #[test]
    fn endpoint_changes_in_slots_are_runtime_commands() {
        let slots = json!({"haproxy.org/scale-server-slots": "4"});
        let a = cluster(&["/"], &["10.0.0.1", "10.0.0.2"], &slots, false);
        let b = cluster(&["/"], &["10.0.0.1", "10.0.0.3"], &slots, false);
        let p = plan_between(&a, &b);
        assert!(p.reload_reasons.is_empty(), "{:?}", p.reload_reasons);
        let names: Vec<&str> = p.commands.iter().map(Command::name).collect();
        assert!(
            names.contains(&"set server addr") && names.contains(&"set server state"),
            "{names:?}"
        );
        assert!(!names.contains(&"add server"), "{names:?}");
        assert!(
            p.commands
                .iter()
                .any(|c| c.to_string().contains("10.0.0.3"))
        );
        assert!(p.drains.is_empty());
        assert_eq!(plan_between(&a, &a), Plan::default());
    }

    #[test]
    fn default_server_words_are_read_from_the_backend_section() {
        let cfg = "defaults\n  default-server init-addr last,libc,none\nbackend a\n  mode http\n  default-server check inter 500\n  server SRV_1 1.2.3.4:80 id 1\n\nbackend b\n  mode http\n\nbackend c\n  default-server ssl verify none\n  default-server maxconn 3\n";
        let words = default_server_words(cfg);
        assert_eq!(words["a"], ["check", "inter", "500"]);
        assert!(!words.contains_key("b"));
        assert_eq!(words["c"], ["ssl", "verify", "none", "maxconn", "3"]);
        assert_eq!(
            words.len(),
            2,
            "the defaults section's line is no backend's"
        );
    }

    #[test]
    fn new_paths_are_map_updates() {
        let a = cluster(&["/"], &["10.0.0.1"], &json!({}), false);
        let b = cluster(&["/", "/docs"], &["10.0.0.1"], &json!({}), false);
        let p = plan_between(&a, &b);
        assert!(p.reload_reasons.is_empty(), "{:?}", p.reload_reasons);
        let lines: Vec<String> = p.commands.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "add map maps/exact.map a.com/docs ns_web_80",
                "add map maps/prefix.map a.com/docs/ ns_web_80"
            ]
        );
        // And back: the entries are deleted.
        let back = plan_between(&b, &a);
        assert!(
            back.commands.iter().all(|c| c.name() == "del map"),
            "{back:?}"
        );
    }

    #[test]
    fn structural_changes_reload_with_a_reason() {
        let a = cluster(&["/"], &["10.0.0.1"], &json!({}), false);
        let with_api = cluster(&["/", "/api"], &["10.0.0.1"], &json!({}), true);
        let p = plan_between(&a, &with_api);
        assert!(p.commands.is_empty());
        assert!(
            p.reload_reasons[0].starts_with("backends changed"),
            "{:?}",
            p.reload_reasons
        );

        let slots = cluster(
            &["/"],
            &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
            &json!({"haproxy.org/scale-server-slots": "2"}),
            false,
        );
        let fewer = cluster(
            &["/"],
            &["10.0.0.1"],
            &json!({"haproxy.org/scale-server-slots": "2"}),
            false,
        );
        let p = plan_between(&fewer, &slots);
        assert!(
            p.reload_reasons[0].starts_with("server slots of ns_web_80"),
            "{:?}",
            p.reload_reasons
        );

        let timeout = cluster(
            &["/"],
            &["10.0.0.1"],
            &json!({"haproxy.org/timeout-server": "7s"}),
            false,
        );
        let p = plan_between(&a, &timeout);
        assert!(
            p.reload_reasons[0].contains("timeout server 7000"),
            "{:?}",
            p.reload_reasons
        );
    }

    #[test]
    fn runtime_part_of_an_unloadable_change_skips_what_does_not_exist() {
        let a = cluster(&["/"], &["10.0.0.1"], &json!({}), false);
        // A new backend (needs a reload) plus an endpoint change on the existing one.
        let b = cluster(&["/", "/api", "/docs"], &["10.0.0.9"], &json!({}), true);
        let (commands, model, _) = runtime_only(&a, &b);
        let lines: Vec<String> = commands.iter().map(ToString::to_string).collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("add server ns_web_80/") && l.contains(" 10.0.0.9:8080 ")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l == "add map maps/exact.map a.com/docs ns_web_80"),
            "{lines:?}"
        );
        // Routes to the backend HAProxy does not have yet are left for the reload.
        assert!(!lines.iter().any(|l| l.contains("ns_api_80")), "{lines:?}");
        assert_eq!(model.backends.len(), 1);
        assert!(
            model
                .maps
                .exact
                .iter()
                .all(|e| !e.value.starts_with("ns_api_80"))
        );
    }

    #[test]
    fn reported_servers_are_repaired_to_the_model() {
        let a = cluster(
            &["/"],
            &["10.0.0.1"],
            &json!({"haproxy.org/scale-server-slots": "3"}),
            false,
        );
        let slot = a.model.backends[0]
            .servers
            .iter()
            .find(|s| s.address.is_some())
            .unwrap()
            .name;
        let empty: Vec<String> = a.model.backends[0]
            .servers
            .iter()
            .filter(|s| s.address.is_none())
            .map(|s| s.name.to_string())
            .collect();
        // HAProxy 2.6's format: the endpoint's slot is stuck in maintenance on 127.0.0.1:1,
        // one empty slot is wrongly up.
        let mut text = String::from(
            "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n",
        );
        text.push_str(&format!(
            "3 ns_web_80 1 {slot} 127.0.0.1 0 5 1 1 6 8 2 0 6 0 0 0 - 1 - 0 0 - - 0\n"
        ));
        text.push_str(&format!(
            "3 ns_web_80 2 {} 10.9.9.9 2 0 1 1 6 8 2 0 6 0 0 0 - 80 - 0 0 - - 0\n",
            empty[0]
        ));
        text.push_str(&format!(
            "3 ns_web_80 3 {} 127.0.0.1 0 5 1 1 6 8 2 0 6 0 0 0 - 1 - 0 0 - - 0\n",
            empty[1]
        ));
        let state = parse_servers_state(&text);
        assert_eq!(state.len(), 3);
        let lines: Vec<String> = server_repairs(&a.model, &state)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lines,
            [
                format!("set server ns_web_80/{slot} addr 10.0.0.1 port 8080"),
                format!("set server ns_web_80/{slot} state ready"),
                format!("set server ns_web_80/{} state maint", empty[0]),
            ]
        );
    }

    #[test]
    fn appended_lines_must_not_change_which_certificate_a_name_gets() {
        let line = |path: &str, sni: &[&str]| CrtListEntry {
            path: CertPath::new(path.to_string(), Key::new("ns", path)),
            options: None,
            sni: sni.iter().map(|s| s.to_string()).collect(),
        };
        let (a, b, c) = (
            line("certs/a.pem", &["a.com"]),
            line("certs/b.pem", &["x.com"]),
            line("certs/c.pem", &["x.com"]),
        );
        // Appending c after b keeps x.com on b: fine.
        assert!(same_precedence(
            &[&a, &b, &c],
            &[a.clone(), b.clone(), c.clone()]
        ));
        // Wanted c before b for x.com, but HAProxy would append c: not the same.
        assert!(!same_precedence(
            &[&a, &b, &c],
            &[a.clone(), c.clone(), b.clone()]
        ));
        // Different names may be reordered freely.
        let d = line("certs/d.pem", &["d.com"]);
        assert!(same_precedence(
            &[&a, &b, &d],
            &[a.clone(), d.clone(), b.clone()]
        ));
        // A line without names (its certificate's own) must keep its place.
        let e = line("certs/e.pem", &[]);
        assert!(!same_precedence(
            &[&a, &b, &e],
            &[a.clone(), e.clone(), b.clone()]
        ));
    }

    #[test]
    fn rotated_certificates_keep_the_name_haproxy_holds() {
        use crate::model::PemFile;
        use crate::translate::tls::file_path;
        let tls = |certs: &[(&str, &str, &[&str])]| Tls {
            pem_files: certs
                .iter()
                .map(|(secret, content, _)| PemFile {
                    path: file_path("certs", &Key::new("ns", *secret), content),
                    content: (*content).into(),
                })
                .collect(),
            crt_list: certs
                .iter()
                .map(|(secret, content, sni)| CrtListEntry {
                    path: file_path("certs", &Key::new("ns", *secret), content),
                    options: None,
                    sni: sni.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
            ..Tls::default()
        };
        let running = tls(&[("default", "d1", &[]), ("web", "w1", &["w.com"])]);
        // Both rotated, and a new Secret.
        let new = tls(&[
            ("default", "d2", &[]),
            ("web", "w2", &["w.com"]),
            ("api", "a1", &["api.com"]),
        ]);
        let renamed = with_running_names(&running, &new);
        assert_eq!(renamed.crt_list[0].path, running.crt_list[0].path);
        assert_eq!(renamed.crt_list[1].path, running.crt_list[1].path);
        assert_eq!(renamed.crt_list[2].path, new.crt_list[2].path);
        assert_eq!(&*renamed.pem_files[0].content, "d2");
        let mut plan = Plan::default();
        certificates(&running, &renamed, &mut plan);
        assert!(plan.reload_reasons.is_empty(), "{:?}", plan.reload_reasons);
        let lines: Vec<String> = plan
            .commands
            .iter()
            .map(|c| c.to_string().lines().next().unwrap_or_default().to_string())
            .collect();
        let (d, w, a) = (
            &running.crt_list[0].path,
            &running.crt_list[1].path,
            &new.crt_list[2].path,
        );
        assert_eq!(
            lines,
            [
                format!("set ssl cert {d} <<"),
                format!("commit ssl cert {d}"),
                format!("set ssl cert {w} <<"),
                format!("commit ssl cert {w}"),
                format!("new ssl cert {a}"),
                format!("set ssl cert {a} <<"),
                format!("commit ssl cert {a}"),
                "add ssl crt-list certs/crt-list.txt <<".to_string(),
            ]
        );
        // A Secret HAProxy does not hold keeps its own name; so does an unchanged one.
        assert_eq!(with_running_names(&running, &running), running);
    }

    /// ssl-passthrough hosts for Service `vault`, and `server-ca` on `web` from Secret `ca`
    /// holding `ca_pem`.
    fn edge_cluster(hosts: &[&str], ca_pem: &str) -> Applied {
        let mut objects = vec![
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "vault", "namespace": "ns",
                   "annotations": {"haproxy.org/ssl-passthrough": "true"}},
                   "spec": {"ports": [{"port": 443}]}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ns",
                   "annotations": {"haproxy.org/server-ca": "ca"}},
                   "spec": {"ports": [{"port": 80}]}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ca", "namespace": "ns"},
                   "stringData": {"ca.crt": ca_pem}}),
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                   "metadata": {"name": "web", "namespace": "ns"},
                   "spec": {"rules": [{"host": "a.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
        ];
        for host in hosts {
            objects.push(json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                   "metadata": {"name": host.replace('.', "-"), "namespace": "ns"},
                   "spec": {"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": "vault", "port": {"number": 443}}}}]}}]}}));
        }
        let store =
            Store::from_objects(objects.into_iter().map(|v| Object::from_value(v).unwrap()));
        let p = pipeline();
        let out = p.run(&store).unwrap();
        Applied::new(out.model, out.rendered, &p.renderer)
    }

    #[test]
    fn passthrough_hosts_are_map_updates_and_ca_files_reload() {
        let ca = include_str!("../../tests/fixtures/tls/rsa.crt");
        let other = include_str!("../../tests/fixtures/tls/ec.crt");
        let none = edge_cluster(&[], ca);
        let one = edge_cluster(&["v1.example.com"], ca);
        let two = edge_cluster(&["v1.example.com", "v2.example.com"], ca);
        // The first passthrough host adds the passthrough frontend: structural.
        assert!(!plan_between(&none, &one).reload_reasons.is_empty());
        // Another host for an existing TCP backend is one map entry, both ways.
        let p = plan_between(&one, &two);
        assert!(p.reload_reasons.is_empty(), "{:?}", p.reload_reasons);
        let lines: Vec<String> = p.commands.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            ["add map maps/sni.map v2.example.com tcp_ns_vault_443"]
        );
        let back: Vec<String> = plan_between(&two, &one)
            .commands
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(back, ["del map maps/sni.map v2.example.com"]);
        // The last one going away is structural again.
        assert!(!plan_between(&one, &none).reload_reasons.is_empty());
        // A CA bundle is read only when HAProxy loads: its content changing reloads.
        let rotated = edge_cluster(&["v1.example.com", "v2.example.com"], other);
        let p = plan_between(&two, &rotated);
        let new_ca = &rotated.model.tls.static_files[0].path;
        assert!(new_ca.as_str().starts_with("certs/ca/ns_ca_"), "{new_ca}");
        assert_eq!(p.reload_reasons, [format!("{new_ca} changed")]);
        assert!(p.commands.is_empty());
    }

    proptest::proptest! {
        /// Applied to the old map as HAProxy would (the last entry of a key wins in a file),
        /// the commands give the new map, and they touch only keys that differ.
        #[test]
        fn map_commands_turn_the_old_map_into_the_new(
            old in proptest::collection::vec(("[a-e]{1,2}", "[xy]"), 0..12),
            new in proptest::collection::vec(("[a-e]{1,2}", "[xy]"), 0..12),
            sort_old: bool,
            sort_new: bool,
        ) {
            let entries = |pairs: &[(String, String)], sort: bool| -> Vec<MapEntry> {
                if sort {
                    let unique: BTreeMap<_, _> = pairs.iter().cloned().collect();
                    unique.into_iter().map(|(key, value)| MapEntry { key: key.into(), value: value.into() }).collect()
                } else {
                    pairs.iter().map(|(k, v)| MapEntry { key: k.clone().into(), value: v.clone().into() }).collect()
                }
            };
            let (old, new) = (entries(&old, sort_old), entries(&new, sort_new));
            let as_map = |list: &[MapEntry]| -> BTreeMap<String, String> {
                list.iter().map(|e| (e.key.to_string(), e.value.to_string())).collect()
            };
            let mut held = as_map(&old);
            let before = held.clone();
            let mut commands = Vec::new();
            map_commands("m", &old, &new, &mut commands);
            for command in &commands {
                match command {
                    Command::AddMap { key, value, .. } => {
                        proptest::prop_assert!(!held.contains_key(key), "add of a held key {}", key);
                        held.insert(key.clone(), value.clone());
                    }
                    Command::SetMap { key, value, .. } => {
                        proptest::prop_assert_ne!(held.get(key), Some(value));
                        proptest::prop_assert!(held.insert(key.clone(), value.clone()).is_some());
                    }
                    Command::DelMap { key, .. } => {
                        proptest::prop_assert!(held.remove(key).is_some());
                    }
                    other => proptest::prop_assert!(false, "{:?}", other),
                }
            }
            proptest::prop_assert_eq!(&held, &as_map(&new));
            let differing = before.keys().chain(held.keys()).collect::<std::collections::BTreeSet<_>>()
                .into_iter().filter(|k| before.get(*k) != held.get(*k)).count();
            proptest::prop_assert_eq!(commands.len(), differing);
        }
    }
}
