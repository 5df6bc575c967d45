//! HTTPRoutes into the model, beside the Ingresses: each route becomes a part like an
//! Ingress' (map entries, backends, route policies), ranked after every Ingress, so that a
//! host and path both claim goes to the Ingress and the route is warned.
//!
//! - Paths: `Exact` and `PathPrefix` are the Ingress `Exact` and `Prefix` (element-wise).
//! - Method, header and query parameter matches, a listener's protocol where a route is
//!   attached to one protocol only, and weighted backends become conditions of canary
//!   routes (see `routes::build_canaries`): at one map key, the conditions are tried in the
//!   spec's precedence (method, then more headers, then more query parameters, then the
//!   older route, then rule and match order), and a request none of them takes is routed
//!   by the key's unconditioned route, else a shorter one.
//! - Weights: backend `k` of `n` is taken with `rand(rest) lt w_k`, where `rest` is the sum
//!   of its weight and those after it; the last takes what is left.
//! - Filters become a route policy of the backend ([`RouteSettings`]).
//! - A backend ref that does not resolve, a rule without backends and a filter that cannot
//!   be served lead to [`INVALID_BACKEND`], which answers 500, for their share.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, ServiceBackendPort};

use super::{Attachments, Frontend, RouteState, attach, backend_ref, http_routes};
use crate::diagnostics::Severity;
use crate::model::{
    AclCondition, Cors, CorsOrigin, CrtListEntry, Redirect, RedirectPath, RouteSettings,
};
use crate::objects::gateway::{
    CorsFilter, HeaderModifier, HttpRoute, HttpRouteFilter, HttpRouteMatch, HttpRouteRule,
};
use crate::objects::{Key, Kind, ObjectRef};
use crate::policy::{HookContext, ValueSource};
use crate::translate::Translator;
use crate::translate::backends::ResolvedPort;
use crate::translate::routes::{Canary, INVALID_BACKEND, PathKind, RouteCandidate};
use crate::values;

/// A rule's matches; a rule without any has one that matches every request (`PathPrefix /`).
fn rule_matches(rule: &HttpRouteRule) -> impl Iterator<Item = &HttpRouteMatch> {
    static EVERY_REQUEST: std::sync::LazyLock<HttpRouteMatch> =
        std::sync::LazyLock::new(HttpRouteMatch::default);
    let every = rule.matches.is_empty().then(|| &*EVERY_REQUEST);
    rule.matches.iter().chain(every)
}

/// (rule, match) → age rank.
type Ranks = HashMap<(usize, usize), usize>;

impl Translator<'_> {
    /// The Gateway API's part of the run: every attached HTTPRoute as a part after the
    /// Ingresses' (which hold ranks below `first_rank`), and the HTTPS listeners'
    /// certificates.
    pub(in crate::translate) fn gateway_api(&mut self, first_rank: usize) {
        let attachments = attach(
            self.store,
            &self.config.gateway_controller_name,
            &super::ListenerPorts::of(self.config),
        );
        if attachments.gateways.is_empty() {
            return;
        }
        self.gateway_l4(&attachments);
        let routes: BTreeMap<&Key, &HttpRoute> = http_routes(self.store).collect();
        let mut order = Vec::new();
        for (r, state) in attachments.routes.iter().enumerate() {
            let Some(route) = routes.get(&state.key) else {
                continue;
            };
            for (i, rule) in route.spec.rules.iter().enumerate() {
                for j in 0..rule.matches.len().max(1) {
                    let m = rule.matches.get(j);
                    order.push((
                        Reverse(m.is_some_and(|m| m.method.is_some())),
                        Reverse(m.map_or(0, |m| m.headers.len())),
                        Reverse(m.map_or(0, |m| m.query_params.len())),
                        r,
                        i,
                        j,
                    ));
                }
            }
        }
        order.sort();
        let mut ranks: Vec<Ranks> = vec![HashMap::new(); attachments.routes.len()];
        for (n, (_, _, _, r, i, j)) in order.into_iter().enumerate() {
            ranks[r].insert((i, j), first_rank + n);
        }
        let mut rank = first_rank;
        for (r, state) in attachments.routes.iter().enumerate() {
            let Some(route) = routes.get(&state.key) else {
                continue;
            };
            let object = ObjectRef::new(Kind::HttpRoute, &state.key);
            let inputs = self.route_inputs(route, state, &attachments, rank, &ranks[r]);
            // The last run's part when made from the same inputs, charged the operations its
            // hooks used, as an Ingress' part is.
            let taken = inputs
                .as_ref()
                .and_then(|i| self.incremental.route(&state.key, i))
                .filter(|part| self.budget.charge(part.operations));
            let part = match taken {
                Some(part) => {
                    let part = self.incremental.took_route(rank, part);
                    if let Some(inputs) = inputs {
                        self.incremental
                            .keep_route(state.key.clone(), inputs, &part);
                    }
                    part
                }
                None => {
                    // The route hooks run on the run's budget, after the Ingresses'.
                    let mut t = Translator::new(&self.ctx);
                    let before = self.budget;
                    t.budget = before;
                    t.http_route(&state.key, route, r, &attachments, &ranks[r]);
                    self.budget = t.budget;
                    let operations = t.budget.used_since(before);
                    let part = t.into_ingress_part(
                        Arc::new(Ingress::default()),
                        rank,
                        operations.unwrap_or(0),
                    );
                    // A part whose hook call was stopped is not kept, as an Ingress' is not.
                    let part = self
                        .incremental
                        .made_ingress(rank, part, operations.is_some());
                    if let (Some(inputs), Some(_)) = (inputs, operations) {
                        self.incremental
                            .keep_route(state.key.clone(), inputs, &part);
                    }
                    part
                }
            };
            self.absorb_ingress(&object, &part);
            self.ingress_parts.push(part);
            rank += 1;
        }
        let mut t = Translator::new(&self.ctx);
        t.listener_certificates(&attachments);
        let part = t.into_ingress_part(Arc::new(Ingress::default()), rank, 0);
        // Its certificates' diagnostics name their Gateway already.
        self.gateway_part(
            rank,
            &ObjectRef::new(Kind::Gateway, &Key::new("", "")),
            part,
        );
    }

    /// What an HTTPRoute's part is made from besides the run's context (which a run taking
    /// parts shares with the last one): the object, what [`attach`] found for it, the
    /// frontends of its listeners, whether both protocols are served, its age ranks and its
    /// backend refs as they resolve now. `None` when the store does not hold it.
    fn route_inputs(
        &self,
        route: &HttpRoute,
        state: &RouteState,
        attachments: &Attachments,
        rank: usize,
        ranks: &Ranks,
    ) -> Option<RouteInputs> {
        let object = self
            .store
            .gateway_api(Kind::HttpRoute)
            .get(&state.key)?
            .clone();
        let mut ranks: Vec<((usize, usize), usize)> = ranks.iter().map(|(k, v)| (*k, *v)).collect();
        ranks.sort_unstable();
        Some(RouteInputs {
            object,
            state: state.clone(),
            frontends: state
                .parents
                .iter()
                .flat_map(|p| &p.listeners)
                .map(|(g, l, _)| {
                    let listener = &attachments.gateways[*g].listeners[*l];
                    (listener.frontend, listener.port)
                })
                .collect(),
            both: both_protocols(attachments),
            rank,
            ranks,
            refs: route
                .spec
                .rules
                .iter()
                .flat_map(|rule| &rule.backend_refs)
                .map(|r| {
                    backend_ref(self.store, &state.key, &r.reference)
                        .ok()
                        .map(|(_, service, port)| (service, port))
                })
                .collect(),
        })
    }

    /// A part of the Gateway API made in every run (the listeners' certificates) at age rank
    /// `rank`, after the Ingresses' and HTTPRoutes': a run that takes parts from the last one
    /// counts it as replaced (its claims and HTTPS side are gathered again, or taken when the
    /// same).
    fn gateway_part(
        &mut self,
        rank: usize,
        object: &ObjectRef,
        part: super::super::parts::IngressPart,
    ) {
        let part = self.incremental.made_ingress(rank, part, true);
        self.absorb_ingress(object, &part);
        self.ingress_parts.push(part);
    }

    /// The certificates of the HTTPS listeners, each for the listener's hostname, or the
    /// hosts of the routes attached to it.
    fn listener_certificates(&mut self, attachments: &Attachments) {
        for (g, gateway) in attachments.gateways.iter().enumerate() {
            let object = ObjectRef::new(Kind::Gateway, &gateway.key);
            for (l, listener) in gateway.listeners.iter().enumerate() {
                if listener.frontend != Some(Frontend::Https) {
                    continue;
                }
                let mut sni: BTreeSet<String> = BTreeSet::new();
                match &listener.hostname {
                    Some(h) => {
                        sni.insert(h.clone());
                    }
                    None => {
                        for route in &attachments.routes {
                            for parent in &route.parents {
                                for (pg, pl, hosts) in &parent.listeners {
                                    if (*pg, *pl) == (g, l) {
                                        sni.extend(hosts.iter().filter(|h| !h.is_empty()).cloned());
                                    }
                                }
                            }
                        }
                    }
                }
                if sni.is_empty() {
                    continue;
                }
                for (i, secret) in listener.certificates.iter().enumerate() {
                    match self.certificate(secret) {
                        Ok(path) => self.tls_entries.push(CrtListEntry {
                            path,
                            options: None,
                            sni: sni.iter().cloned().collect(),
                        }),
                        Err(crate::translate::tls::Unserved::Refused) => {}
                        Err(e) => self.diags.object(
                            Severity::Error,
                            &object,
                            format!("spec.listeners[{l}].tls.certificateRefs[{i}]"),
                            format!("Secret {secret}: {e}"),
                        ),
                    }
                }
            }
        }
    }

    /// One HTTPRoute's rules, on the hosts its parents accepted it for.
    fn http_route(
        &mut self,
        key: &Key,
        route: &HttpRoute,
        index: usize,
        attachments: &Attachments,
        ranks: &Ranks,
    ) {
        let object = ObjectRef::new(Kind::HttpRoute, key);
        let route_object = Arc::new(object.clone());
        for (i, h) in route.spec.hostnames.iter().enumerate() {
            if let Err(e) = values::parse_host(h) {
                self.diags.object(
                    Severity::Error,
                    &object,
                    format!("spec.hostnames[{i}]"),
                    format!("{e}; hostname skipped"),
                );
            }
        }
        // The frontends each host is served on.
        let mut hosts: BTreeMap<String, BTreeSet<Frontend>> = BTreeMap::new();
        let state = &attachments.routes[index];
        for parent in &state.parents {
            if let Some(refused) = parent.conditions.iter().find(|c| !c.status) {
                self.diags.object(
                    Severity::Warning,
                    &object,
                    format!("spec.parentRefs[{}]", parent.index),
                    format!(
                        "{} {}: {}: {}",
                        refused.kind,
                        refused.reason,
                        refused.message,
                        parent_effect(refused.kind)
                    ),
                );
            }
        }
        for parent in state.parents.iter().filter(|p| p.conditions[0].status) {
            for (g, l, names) in &parent.listeners {
                let listener = &attachments.gateways[*g].listeners[*l];
                for name in names {
                    let host = super::listeners::port_host(listener.port, name);
                    hosts.entry(host).or_default().extend(listener.frontend);
                }
            }
        }
        let both = both_protocols(attachments);
        let annotations = Arc::new(route.metadata.annotations.clone().unwrap_or_default());
        self.policy
            .vocabulary()
            .check_annotations(&object, &annotations, &mut self.diags);
        let mut sources = vec![ValueSource::annotations(object.clone(), annotations)];
        sources.extend(self.ctx.resources.iter().cloned());
        sources.extend(self.ctx.config_map.iter().cloned());
        for (i, rule) in route.spec.rules.iter().enumerate() {
            let field = format!("spec.rules[{i}]");
            let (filters, backends) = self.rule_backends(key, &object, rule, &field);
            for (j, m) in rule_matches(rule).enumerate() {
                let match_field = format!("{field}.matches[{j}]");
                let Some((kind, path, path_regex)) = self.match_path(m, &object, &match_field)
                else {
                    continue;
                };
                let conditions = match match_conditions(m) {
                    Ok(c) => path_regex.into_iter().chain(c).collect::<Vec<_>>(),
                    Err((f, e)) => {
                        self.diags.object(
                            Severity::Error,
                            &object,
                            format!("{match_field}.{f}"),
                            format!("{e}; match skipped"),
                        );
                        continue;
                    }
                };
                let rank = ranks.get(&(i, j)).copied().unwrap_or(usize::MAX);
                for (host, frontends) in &hosts {
                    // The route hook, once per match and host as once per Ingress path,
                    // when the rule has a backend to apply its settings in.
                    let values: Vec<String> = match &filters {
                        Some(filters) if backends.iter().any(|(v, _)| v != INVALID_BACKEND) => {
                            // The name alone, for a listener on a port of its own too.
                            let name = host.split_once('/').map_or(host.as_str(), |(_, n)| n);
                            let facts = BTreeMap::from([
                                ("host", name.to_string()),
                                ("path", path_fact(m, &path)),
                                ("path_type", path_type_fact(m).to_string()),
                            ]);
                            let settings = self.route_hook(&object, sources.clone(), facts);
                            let settings = filters_win(settings, filters);
                            backends
                                .iter()
                                .map(|(v, _)| self.with_policy(v.clone(), &settings, &object))
                                .collect()
                        }
                        _ => backends.iter().map(|(v, _)| v.clone()).collect(),
                    };
                    let mut conditions = conditions.clone();
                    if both && frontends.len() == 1 && !super::listeners::is_port_host(host) {
                        let tls = frontends.contains(&Frontend::Https);
                        conditions.push(AclCondition {
                            fetch: "ssl_fc".to_string(),
                            ignore_case: false,
                            method: Some("int".to_string()),
                            values: vec![if tls { "1" } else { "0" }.to_string()],
                        });
                    }
                    let mut rest: i64 = backends.iter().map(|(_, w)| *w).sum();
                    for (k, ((_, weight), value)) in backends.iter().zip(&values).enumerate() {
                        let mut conditions = conditions.clone();
                        if k + 1 < backends.len() {
                            conditions.push(AclCondition {
                                fetch: format!("rand({rest})"),
                                ignore_case: false,
                                method: None,
                                values: vec!["lt".to_string(), weight.to_string()],
                            });
                        }
                        rest -= weight;
                        let canary = (!conditions.is_empty()).then(|| {
                            let condition = conditions.remove(0);
                            Box::new(Canary {
                                condition,
                                and: conditions,
                            })
                        });
                        self.routes.push(RouteCandidate {
                            host: host.clone(),
                            path: path.clone(),
                            kind,
                            value: super::listeners::port_value(host, value).into(),
                            rank,
                            ingress: route_object.clone(),
                            field: match_field.clone(),
                            canary,
                        });
                    }
                }
            }
        }
    }

    /// A match's path: `PathPrefix` (the default) or `Exact` as a map key, or
    /// `RegularExpression` as the condition `path -m reg` at the key `/`; none, reported,
    /// when it cannot be served.
    fn match_path(
        &mut self,
        m: &HttpRouteMatch,
        object: &ObjectRef,
        field: &str,
    ) -> Option<(PathKind, String, Option<AclCondition>)> {
        let (kind, value) = match &m.path {
            None => (None, None),
            Some(p) => (p.kind.as_deref(), p.value.as_deref()),
        };
        let kind = match kind.unwrap_or("PathPrefix") {
            "PathPrefix" => PathKind::Prefix,
            "Exact" => PathKind::Exact,
            "RegularExpression" => {
                return match path_regex(value.unwrap_or_default()) {
                    Ok(c) => Some((PathKind::Prefix, "/".to_string(), Some(c))),
                    Err(e) => {
                        self.diags.object(
                            Severity::Error,
                            object,
                            format!("{field}.path.value"),
                            format!("{e}; match skipped"),
                        );
                        None
                    }
                };
            }
            other => {
                self.diags.object(
                    Severity::Error,
                    object,
                    format!("{field}.path.type"),
                    format!(
                        "{other:?} is not served (Exact, PathPrefix and RegularExpression are); match skipped"
                    ),
                );
                return None;
            }
        };
        match values::parse_path(value.unwrap_or("/")) {
            Ok(p) => Some((kind, p, None)),
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    object,
                    format!("{field}.path.value"),
                    format!("{e}; match skipped"),
                );
                None
            }
        }
    }

    /// A rule's filters as route settings (none when they cannot be served) and its
    /// backends with their weights (none of zero): the backend's name, or
    /// [`INVALID_BACKEND`].
    fn rule_backends(
        &mut self,
        key: &Key,
        object: &ObjectRef,
        rule: &crate::objects::gateway::HttpRouteRule,
        field: &str,
    ) -> (Option<RouteSettings>, Vec<(String, i64)>) {
        let invalid = || (None, vec![(INVALID_BACKEND.to_string(), 1)]);
        let settings = match rule_settings(&rule.filters, &rule.matches) {
            Ok(s) => s,
            Err((i, f, e)) => {
                self.diags.object(
                    Severity::Error,
                    object,
                    format!("{field}.filters[{i}]{f}"),
                    format!("{e}; the rule answers 500"),
                );
                return invalid();
            }
        };
        if settings.redirect.is_some() {
            // The redirect is a policy of a backend of the route's own, without servers.
            let name = format!(
                "{}_{}_redirect_0",
                key.namespace,
                key.name.replace('.', ":")
            );
            let port = ResolvedPort {
                number: 0,
                name: String::new(),
                external: None,
                endpoints: crate::translate::exposure::EndpointRule::default(),
            };
            let service = Key::new(key.namespace.clone(), format!("httproute.{}", key.name));
            self.add_registration(&name, &service, port, None);
            return (Some(settings), vec![(name, 1)]);
        }
        let mut out = Vec::new();
        for (j, r) in rule.backend_refs.iter().enumerate() {
            let at = format!("{field}.backendRefs[{j}]");
            let Some(weight) = super::served_weight(&mut self.diags, object, &at, r.weight) else {
                continue;
            };
            if !r.filters.is_empty() {
                self.diags.object(
                    Severity::Warning,
                    object,
                    format!("{at}.filters"),
                    "filters on a backend ref are not served; ignored",
                );
            }
            let value = match backend_ref(self.store, key, &r.reference) {
                Ok((service_key, service, number)) => {
                    let port = ServiceBackendPort {
                        name: None,
                        number: Some(number),
                    };
                    match self.resolve_port(&service, &port) {
                        Ok(resolved) => self.register_backend(&service_key, resolved, None),
                        Err(e) => {
                            self.diags.object(
                                Severity::Error,
                                object,
                                at,
                                format!("Service {service_key}: {e}; its share answers 500"),
                            );
                            INVALID_BACKEND.to_string()
                        }
                    }
                }
                Err((_, message)) => {
                    self.diags.object(
                        Severity::Error,
                        object,
                        at,
                        format!("{message}; its share answers 500"),
                    );
                    INVALID_BACKEND.to_string()
                }
            };
            out.push((value, weight));
        }
        if out.is_empty() {
            if rule.backend_refs.is_empty() {
                self.diags.object(
                    Severity::Warning,
                    object,
                    field,
                    "the rule has no backendRefs and no redirect; it answers 500",
                );
            }
            return invalid();
        }
        (Some(settings), out)
    }

    /// The route hook's settings for one match of an HTTPRoute on one host (see
    /// `docs/gateway-api.md`: what it decides about routing itself is not applied).
    fn route_hook(
        &mut self,
        object: &ObjectRef,
        sources: Vec<ValueSource>,
        facts: BTreeMap<&'static str, String>,
    ) -> RouteSettings {
        let ctx =
            HookContext::new(object.clone(), sources, facts).with_snippets(self.config.snippets);
        let run = self.policy.run_route(&ctx, self.budget);
        self.budget = run.budget;
        self.diags.extend(run.diagnostics);
        let mut outcome = run.settings;
        self.check_pattern_refs(object, &mut outcome);
        Arc::unwrap_or_clone(outcome.settings)
    }

    /// The map value of backend `name` with a route policy (none for [`INVALID_BACKEND`],
    /// which answers 500 whatever the policy).
    fn with_policy(
        &mut self,
        name: String,
        settings: &RouteSettings,
        object: &ObjectRef,
    ) -> String {
        if settings.is_empty() || name == INVALID_BACKEND {
            return name;
        }
        if let Some(auth) = &settings.basic_auth {
            self.userlists
                .require(auth, self.store, object, &mut self.diags);
        }
        let id = crate::translate::policy_id(settings);
        if let Some(capture) = &settings.capture {
            self.add_captures(capture, &id);
        }
        if let Some(b) = self.backends.get_mut(&name) {
            b.policies.insert(id.clone(), Arc::new(settings.clone()));
        }
        format!("{name}.{id}")
    }
}

/// What can be checked of one HTTPRoute alone, as translation checks it: its hostnames, each
/// match's path and conditions, each rule's filters (errors on `subject`, with the fields
/// translation names). Returns the hosts (`""` for none) and, for every match that would be
/// routed, the `path` and `path_type` facts its route hook sees.
pub fn review(
    route: &HttpRoute,
    subject: &ObjectRef,
    diags: &mut crate::diagnostics::Diagnostics,
) -> (Vec<String>, Vec<(String, String)>) {
    let mut hosts = Vec::new();
    for (i, h) in route.spec.hostnames.iter().enumerate() {
        match values::parse_host(h) {
            Ok(h) => hosts.push(h),
            Err(e) => diags.object(
                Severity::Error,
                subject,
                format!("spec.hostnames[{i}]"),
                format!("{e}; hostname skipped"),
            ),
        }
    }
    if route.spec.hostnames.is_empty() {
        hosts.push(String::new());
    }
    let mut matches_out = Vec::new();
    for (i, rule) in route.spec.rules.iter().enumerate() {
        if let Err((k, f, e)) = rule_settings(&rule.filters, &rule.matches) {
            diags.object(
                Severity::Error,
                subject,
                format!("spec.rules[{i}].filters[{k}]{f}"),
                format!("{e}; the rule answers 500"),
            );
            continue;
        }
        for (j, m) in rule_matches(rule).enumerate() {
            let field = format!("spec.rules[{i}].matches[{j}]");
            let path = match path_type_fact(m) {
                "RegularExpression" => path_regex(
                    m.path
                        .as_ref()
                        .and_then(|p| p.value.as_deref())
                        .unwrap_or(""),
                )
                .map(|_| "/".to_string()),
                _ => values::parse_path(
                    m.path
                        .as_ref()
                        .and_then(|p| p.value.as_deref())
                        .unwrap_or("/"),
                ),
            };
            let known = matches!(
                m.path.as_ref().and_then(|p| p.kind.as_deref()),
                None | Some("Exact" | "PathPrefix" | "RegularExpression")
            );
            let checked = match (known, path) {
                (false, _) => Err((
                    "path.type".to_string(),
                    "not served (Exact, PathPrefix and RegularExpression are)".to_string(),
                )),
                (true, Err(e)) => Err(("path.value".to_string(), e)),
                (true, Ok(p)) => match_conditions(m).map(|_| p),
            };
            match checked {
                Ok(p) => matches_out.push((path_fact(m, &p), path_type_fact(m).to_string())),
                Err((f, e)) => diags.object(
                    Severity::Error,
                    subject,
                    format!("{field}.{f}"),
                    format!("{e}; match skipped"),
                ),
            }
        }
    }
    (hosts, matches_out)
}

/// The route hook's settings with a rule's filters over them: where both set the same
/// thing, the filter wins (it is the route's own typed statement; the hook's value may come
/// from a ConfigMap default). Header lists are joined, the filter's after the hook's, so a
/// header both set gets the filter's value.
fn filters_win(mut hook: RouteSettings, filters: &RouteSettings) -> RouteSettings {
    let f = filters.clone();
    if f.set_host.is_some() {
        hook.set_host = f.set_host;
    }
    hook.request_headers.extend(f.request_headers);
    hook.response_headers.extend(f.response_headers);
    hook.request_headers_add.extend(f.request_headers_add);
    hook.request_headers_remove.extend(f.request_headers_remove);
    hook.response_headers_add.extend(f.response_headers_add);
    hook.response_headers_remove
        .extend(f.response_headers_remove);
    if f.path_rewrite.is_some() {
        hook.path_rewrite = f.path_rewrite;
        hook.more_path_rewrites = f.more_path_rewrites;
    }
    if f.cors.is_some() {
        hook.cors = f.cors;
    }
    if f.redirect.is_some() {
        hook.redirect = f.redirect;
    }
    hook
}

/// The `path` fact of a match: the path as routed, or the pattern of a regular expression.
fn path_fact(m: &HttpRouteMatch, routed: &str) -> String {
    match &m.path {
        Some(p) if p.kind.as_deref() == Some("RegularExpression") => {
            p.value.clone().unwrap_or_default()
        }
        _ => routed.to_string(),
    }
}

/// The `path_type` fact of a match, as the Gateway API names it.
fn path_type_fact(m: &HttpRouteMatch) -> &'static str {
    match m.path.as_ref().and_then(|p| p.kind.as_deref()) {
        Some("Exact") => "Exact",
        Some("RegularExpression") => "RegularExpression",
        _ => "PathPrefix",
    }
}

/// Whether the shared frontends serve both HTTP and HTTPS listeners (a route attached to one
/// protocol only then gets a condition on it).
fn both_protocols(attachments: &Attachments) -> bool {
    let served = |f: Frontend| {
        attachments.gateways.iter().any(|g| {
            g.listeners
                .iter()
                .any(|l| l.frontend == Some(f) && l.port.is_none())
        })
    };
    served(Frontend::Http) && served(Frontend::Https)
}

/// What an HTTPRoute's part was made from (see `Translator::route_inputs`): the part is
/// taken by a later run only when these are the same (the object and the Services the very
/// same, kept alive here so that their addresses are not reused).
#[derive(Debug)]
pub(in crate::translate) struct RouteInputs {
    object: Arc<crate::objects::GatewayApi>,
    state: RouteState,
    /// The frontend and the port of its own of each listener the route is attached to.
    frontends: Vec<(Option<Frontend>, Option<u16>)>,
    both: bool,
    rank: usize,
    ranks: Vec<((usize, usize), usize)>,
    refs: Vec<Option<(Arc<crate::objects::Service>, i32)>>,
}

impl PartialEq for RouteInputs {
    fn eq(&self, other: &Self) -> bool {
        let same_ref =
            |a: &Option<(Arc<crate::objects::Service>, i32)>,
             b: &Option<(Arc<crate::objects::Service>, i32)>| match (a, b) {
                (Some((a, p)), Some((b, q))) => Arc::ptr_eq(a, b) && p == q,
                (None, None) => true,
                _ => false,
            };
        Arc::ptr_eq(&self.object, &other.object)
            && self.rank == other.rank
            && self.both == other.both
            && self.frontends == other.frontends
            && self.ranks == other.ranks
            && self.state == other.state
            && self.refs.len() == other.refs.len()
            && self
                .refs
                .iter()
                .zip(&other.refs)
                .all(|(a, b)| same_ref(a, b))
    }
}

/// What a refused condition of a parent means for the route.
fn parent_effect(kind: &str) -> &'static str {
    if kind == "Accepted" {
        "the route is not attached to this Gateway"
    } else {
        "the share of those backends answers 500"
    }
}

/// A header or query value compared exactly: `-m str` when it is a plain word, else an
/// anchored regex with every other character as `\xHH` (nothing of it is then read as
/// HAProxy's syntax).
fn exact(fetch: String, value: &str) -> Result<AclCondition, String> {
    if value.is_empty() || value.len() > 4096 {
        return Err("the value must be 1 to 4096 characters".to_string());
    }
    if value.chars().any(|c| !(' '..='~').contains(&c)) {
        return Err(format!(
            "{} contains a character that is not printable ASCII",
            crate::diagnostics::quoted(value)
        ));
    }
    let plain = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~:/+=@,;!*".contains(&b));
    if plain {
        return Ok(AclCondition {
            fetch,
            ignore_case: false,
            method: Some("str".to_string()),
            values: vec![value.to_string()],
        });
    }
    let mut pattern = String::from("^");
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() {
            pattern.push(b as char);
        } else {
            pattern.push_str(&format!("\\x{b:02x}"));
        }
    }
    pattern.push('$');
    regex(fetch, &pattern)
}

fn regex(fetch: String, pattern: &str) -> Result<AclCondition, String> {
    let pattern = values::parse_regex_at(pattern, values::RegexPlace::Acl { ignore_case: false })?;
    Ok(AclCondition {
        fetch,
        ignore_case: false,
        method: Some("reg".to_string()),
        values: vec![pattern],
    })
}

/// A `RegularExpression` path match: the whole path (without the query string) matches the
/// pattern, checked with PCRE2 as HAProxy's ACL reads it.
fn path_regex(pattern: &str) -> Result<AclCondition, String> {
    if pattern.is_empty() {
        return Err("a RegularExpression path match needs a value".to_string());
    }
    // Checked alone first, so that the pattern cannot close the group it is put in.
    values::parse_regex_at(pattern, values::RegexPlace::Acl { ignore_case: false })?;
    regex("path".to_string(), &format!("^(?:{pattern})$"))
}

/// The conditions of a match besides its path; on error, the field and why.
fn match_conditions(m: &HttpRouteMatch) -> Result<Vec<AclCondition>, (String, String)> {
    let mut out = Vec::new();
    if let Some(method) = &m.method {
        const METHODS: &[&str] = &[
            "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
        ];
        if !METHODS.contains(&method.as_str()) {
            return Err((
                "method".to_string(),
                format!(
                    "{} is not an HTTP method",
                    crate::diagnostics::quoted(method)
                ),
            ));
        }
        out.push(AclCondition {
            fetch: "method".to_string(),
            ignore_case: false,
            method: Some("str".to_string()),
            values: vec![method.clone()],
        });
    }
    for (what, list, fetch) in [
        ("headers", &m.headers, "req.fhdr"),
        ("queryParams", &m.query_params, "url_param"),
    ] {
        for (i, v) in list.iter().enumerate() {
            let at = |f: &str| format!("{what}[{i}].{f}");
            let name = values::parse_header_name(&v.name).map_err(|e| (at("name"), e))?;
            let fetch = format!("{fetch}({name})");
            let condition = match v.kind.as_deref().unwrap_or("Exact") {
                "Exact" => exact(fetch, &v.value),
                "RegularExpression" => regex(fetch, &v.value),
                other => Err(format!("{other:?} is not Exact or RegularExpression")),
            };
            out.push(condition.map_err(|e| (at("value"), e))?);
        }
    }
    Ok(out)
}

/// A header value as written: printable ASCII, `%` doubled for the log-format it is
/// written in; a `$` is refused (HAProxy would read an environment variable).
fn literal_header_value(v: &str) -> Result<String, String> {
    let format = v.replace('%', "%%");
    values::check_header_format(&format)
        .map_err(|e| format!("{}: {e}", crate::diagnostics::quoted(v)))?;
    Ok(format)
}

type NameValues = Vec<(String, String)>;

fn modifier(m: &HeaderModifier) -> Result<(NameValues, NameValues, Vec<String>), (String, String)> {
    let mut set = Vec::new();
    let mut add = Vec::new();
    for (what, list, out) in [("set", &m.set, &mut set), ("add", &m.add, &mut add)] {
        for (i, h) in list.iter().enumerate() {
            let name =
                values::parse_header_name(&h.name).map_err(|e| (format!("{what}[{i}].name"), e))?;
            let value =
                literal_header_value(&h.value).map_err(|e| (format!("{what}[{i}].value"), e))?;
            out.push((name, value));
        }
    }
    let mut remove = Vec::new();
    for (i, name) in m.remove.iter().enumerate() {
        remove.push(values::parse_header_name(name).map_err(|e| (format!("remove[{i}]"), e))?);
    }
    Ok((set, add, remove))
}

/// Characters a redirect's prefix pattern and replacement may hold (see [`RedirectPath`]).
fn regsub_safe(v: &str) -> bool {
    v.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_~/.".contains(&b))
}

/// The prefix a `ReplacePrefixMatch` replaces: the match's `PathPrefix` value.
fn matched_prefix(matches: &[HttpRouteMatch]) -> Result<String, String> {
    let prefixes: BTreeSet<String> = if matches.is_empty() {
        BTreeSet::from(["/".to_string()])
    } else {
        matches
            .iter()
            .map(|m| {
                let p = m.path.clone().unwrap_or_default();
                match p.kind.as_deref().unwrap_or("PathPrefix") {
                    "PathPrefix" => Ok(p.value.unwrap_or_else(|| "/".to_string())),
                    _ => Err("ReplacePrefixMatch needs PathPrefix matches".to_string()),
                }
            })
            .collect::<Result<_, _>>()?
    };
    match prefixes.into_iter().collect::<Vec<_>>().as_slice() {
        [one] => Ok(one.trim_end_matches('/').to_string()),
        _ => {
            Err("ReplacePrefixMatch needs the rule's matches to share one path prefix".to_string())
        }
    }
}

/// A rule's filters as route settings; on error, the filter's index, the field under it and
/// why.
fn rule_settings(
    filters: &[HttpRouteFilter],
    matches: &[HttpRouteMatch],
) -> Result<RouteSettings, (usize, String, String)> {
    let mut s = RouteSettings::default();
    for (i, f) in filters.iter().enumerate() {
        let fail = |field: &str, e: String| (i, field.to_string(), e);
        match f.kind.as_str() {
            "RequestHeaderModifier" | "ResponseHeaderModifier" => {
                let request = f.kind == "RequestHeaderModifier";
                let (field, m) = if request {
                    (".requestHeaderModifier", &f.request_header_modifier)
                } else {
                    (".responseHeaderModifier", &f.response_header_modifier)
                };
                let Some(m) = m else {
                    return Err(fail(field, "missing".to_string()));
                };
                let (set, add, remove) =
                    modifier(m).map_err(|(sub, e)| fail(&format!("{field}.{sub}"), e))?;
                if request {
                    s.request_headers.extend(set);
                    s.request_headers_add.extend(add);
                    s.request_headers_remove.extend(remove);
                } else {
                    s.response_headers.extend(set);
                    s.response_headers_add.extend(add);
                    s.response_headers_remove.extend(remove);
                }
            }
            "RequestRedirect" => {
                let Some(r) = &f.request_redirect else {
                    return Err(fail(".requestRedirect", "missing".to_string()));
                };
                let scheme = match r.scheme.as_deref() {
                    None => None,
                    Some(v @ ("http" | "https")) => Some(v.to_string()),
                    Some(v) => {
                        return Err(fail(
                            ".requestRedirect.scheme",
                            format!("{v:?} is not http or https"),
                        ));
                    }
                };
                let host = match r.hostname.as_deref() {
                    None => String::new(),
                    Some(h) => values::parse_host(h)
                        .ok()
                        .filter(|h| !h.starts_with('*'))
                        .ok_or_else(|| {
                            fail(
                                ".requestRedirect.hostname",
                                format!("{} is not a host name", crate::diagnostics::quoted(h)),
                            )
                        })?,
                };
                let port = match r.port {
                    None => None,
                    Some(p) => Some(u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
                        fail(".requestRedirect.port", format!("{p} is not a port"))
                    })?),
                };
                // The scheme's default port is left out, as the spec asks.
                let port = port.filter(|p| {
                    !matches!(
                        (scheme.as_deref(), p),
                        (Some("http"), 80) | (Some("https"), 443)
                    )
                });
                let code = match r.status_code.unwrap_or(302) {
                    c @ (301 | 302 | 303 | 307 | 308) => c as u16,
                    c => {
                        return Err(fail(
                            ".requestRedirect.statusCode",
                            format!("{c} is not 301, 302, 303, 307 or 308"),
                        ));
                    }
                };
                let path = match &r.path {
                    None => None,
                    Some(p) => Some(
                        redirect_path(p, matches).map_err(|e| fail(".requestRedirect.path", e))?,
                    ),
                };
                s.redirect = Some(Redirect {
                    scheme,
                    host,
                    code,
                    path,
                    port,
                });
            }
            "URLRewrite" => {
                let Some(r) = &f.url_rewrite else {
                    return Err(fail(".urlRewrite", "missing".to_string()));
                };
                if let Some(h) = &r.hostname {
                    let host = values::parse_host(h)
                        .ok()
                        .filter(|h| !h.starts_with('*'))
                        .ok_or_else(|| {
                            fail(
                                ".urlRewrite.hostname",
                                format!("{} is not a host name", crate::diagnostics::quoted(h)),
                            )
                        })?;
                    s.set_host = Some(host);
                }
                if let Some(p) = &r.path {
                    s.path_rewrite =
                        Some(rewrite_path(p, matches).map_err(|e| fail(".urlRewrite.path", e))?);
                }
            }
            "CORS" => {
                let Some(c) = &f.cors else {
                    return Err(fail(".cors", "missing".to_string()));
                };
                s.cors = cors(c).map_err(|(sub, e)| fail(&format!(".cors.{sub}"), e))?;
            }
            other => {
                return Err(fail(
                    ".type",
                    format!(
                        "{other:?} is not served (RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite and CORS are)"
                    ),
                ));
            }
        }
    }
    if s.redirect.is_some() && s.path_rewrite.is_some() {
        return Err((
            0,
            String::new(),
            "RequestRedirect and URLRewrite cannot be combined".to_string(),
        ));
    }
    Ok(s)
}

/// Most seconds a CORS `maxAge` may be (a day; browsers cap it lower).
const MAX_CORS_AGE: i64 = 86_400;

/// A `CORS` filter as the route policy's CORS settings; none when no origin is allowed (then
/// no response carries CORS headers, as without the filter). On error, the field under
/// `cors` and why.
fn cors(c: &CorsFilter) -> Result<Option<Cors>, (String, String)> {
    if c.allow_origins.is_empty() {
        return Ok(None);
    }
    let allow_origin = cors_origins(&c.allow_origins)?;
    let list = |field: &str, items: &[String], parse: fn(&str) -> Result<String, String>| {
        if items.is_empty() {
            return Ok(String::new());
        }
        for (i, item) in items.iter().enumerate() {
            if item.contains(',') || item.trim().is_empty() {
                return Err((
                    format!("{field}[{i}]"),
                    format!("{} is not one name", crate::diagnostics::quoted(item)),
                ));
            }
        }
        let joined = if items.iter().any(|i| i.trim() == "*") {
            "*".to_string()
        } else {
            items.join(",")
        };
        parse(&joined).map_err(|e| (field.to_string(), e))
    };
    let allow_methods = list("allowMethods", &c.allow_methods, values::parse_http_methods)?;
    let allow_headers = list(
        "allowHeaders",
        &c.allow_headers,
        values::parse_header_name_list,
    )?;
    let expose_headers = list(
        "exposeHeaders",
        &c.expose_headers,
        values::parse_header_name_list,
    )?;
    let max_age = c.max_age.unwrap_or(5);
    if !(0..=MAX_CORS_AGE).contains(&max_age) {
        return Err((
            "maxAge".to_string(),
            format!("{max_age} is not between 0 and {MAX_CORS_AGE} seconds"),
        ));
    }
    let credentials = c.allow_credentials == Some(true);
    Ok(Some(Cors {
        allow_origin,
        allow_methods,
        allow_headers,
        allow_credentials: credentials,
        max_age: max_age as u64,
        respond_to_options: true,
        expose_headers,
        // Browsers take `*` literally on credentialed requests: the spec has the gateway
        // answer with what the request asked for.
        echo_wildcards: credentials,
    }))
}

/// `allowOrigins`: `*`, origins `scheme://host[:port]`, and origins whose host starts with a
/// `*.` label wildcard (one or more labels). Exact origins alone are a list; with a
/// wildcard, all of them are one anchored regex.
fn cors_origins(origins: &[String]) -> Result<CorsOrigin, (String, String)> {
    if origins.iter().any(|o| o.trim() == "*") {
        return Ok(CorsOrigin::Any);
    }
    let escape = |v: &str| -> String {
        v.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, ':' | '/' | '-') {
                    c.to_string()
                } else {
                    format!("\\x{:02x}", c as u32)
                }
            })
            .collect()
    };
    let mut exact = Vec::new();
    let mut patterns = Vec::new();
    for (i, origin) in origins.iter().enumerate() {
        let field = format!("allowOrigins[{i}]");
        let wild = origin
            .split_once("://*.")
            .map(|(scheme, rest)| format!("{scheme}://{rest}"));
        let parsed = values::parse_origin(wild.as_deref().unwrap_or(origin))
            .map_err(|e| (field.clone(), e))?;
        if wild.is_some() {
            let (scheme, rest) = parsed.split_once("://").unwrap_or_default();
            patterns.push(format!("{scheme}://[a-z0-9.-]+[.]{}", escape(rest)));
        } else {
            patterns.push(escape(&parsed));
            exact.push(parsed);
        }
    }
    if exact.len() == origins.len() {
        exact.dedup();
        return Ok(CorsOrigin::List(exact));
    }
    let regex = format!("^(?:{})$", patterns.join("|"));
    match values::parse_cors_origin(&regex) {
        Ok(o) => Ok(o),
        Err(e) => Err(("allowOrigins".to_string(), e)),
    }
}

fn redirect_path(
    p: &crate::objects::gateway::PathModifier,
    matches: &[HttpRouteMatch],
) -> Result<RedirectPath, String> {
    match p.kind.as_str() {
        "ReplaceFullPath" => {
            let path = values::parse_path(p.replace_full_path.as_deref().unwrap_or("/"))?;
            Ok(RedirectPath::Full { path })
        }
        "ReplacePrefixMatch" => {
            let prefix = matched_prefix(matches)?;
            let replacement = p
                .replace_prefix_match
                .clone()
                .unwrap_or_else(|| "/".to_string());
            values::parse_path(&replacement)?;
            if !regsub_safe(&prefix) || !regsub_safe(&replacement) {
                return Err(
                    "a redirect's prefix and replacement may hold letters, digits and -_~/. only"
                        .to_string(),
                );
            }
            let trimmed = replacement.trim_end_matches('/');
            let escaped = prefix.replace('.', "[.]");
            Ok(if trimmed.is_empty() {
                RedirectPath::Prefix {
                    pattern: format!("^{escaped}/?"),
                    replacement: "/".to_string(),
                }
            } else {
                RedirectPath::Prefix {
                    pattern: format!("^{escaped}"),
                    replacement: trimmed.to_string(),
                }
            })
        }
        other => Err(format!(
            "{other:?} is not ReplaceFullPath or ReplacePrefixMatch"
        )),
    }
}

/// A URL rewrite's path as a `replace-path` rule (regex, replacement).
fn rewrite_path(
    p: &crate::objects::gateway::PathModifier,
    matches: &[HttpRouteMatch],
) -> Result<(String, String), String> {
    match p.kind.as_str() {
        "ReplaceFullPath" => {
            let path = values::parse_path(p.replace_full_path.as_deref().unwrap_or("/"))?;
            Ok(("^.*$".to_string(), values::parse_replacement(&path)?))
        }
        "ReplacePrefixMatch" => {
            let prefix = matched_prefix(matches)?;
            let replacement = p
                .replace_prefix_match
                .clone()
                .unwrap_or_else(|| "/".to_string());
            let replacement = values::parse_path(&replacement)?;
            let escaped: String = prefix
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '/' {
                        c.to_string()
                    } else {
                        format!("\\x{:02x}", c as u32)
                    }
                })
                .collect();
            let trimmed = replacement.trim_end_matches('/');
            let (regex, with) = if trimmed.is_empty() {
                (format!("^{escaped}/?(.*)$"), "/\\1".to_string())
            } else {
                (format!("^{escaped}(/.*)?$"), format!("{trimmed}\\1"))
            };
            Ok((
                values::parse_regex(&regex)?,
                values::parse_replacement(&with)?,
            ))
        }
        other => Err(format!(
            "{other:?} is not ReplaceFullPath or ReplacePrefixMatch"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::gateway::{PathMatch, PathModifier};

    fn prefix(v: &str) -> Vec<HttpRouteMatch> {
        vec![HttpRouteMatch {
            path: Some(PathMatch {
                kind: Some("PathPrefix".to_string()),
                value: Some(v.to_string()),
            }),
            ..HttpRouteMatch::default()
        }]
    }

    fn replace_prefix(v: &str) -> PathModifier {
        PathModifier {
            kind: "ReplacePrefixMatch".to_string(),
            replace_full_path: None,
            replace_prefix_match: Some(v.to_string()),
        }
    }

    #[test]
    fn prefix_rewrites_keep_segment_boundaries() {
        let (re, with) = rewrite_path(&replace_prefix("/xyz"), &prefix("/foo/")).unwrap();
        assert_eq!((re.as_str(), with.as_str()), ("^/foo(/.*)?$", "/xyz\\1"));
        let (re, with) = rewrite_path(&replace_prefix("/"), &prefix("/foo")).unwrap();
        assert_eq!((re.as_str(), with.as_str()), ("^/foo/?(.*)$", "/\\1"));
    }

    #[test]
    fn exact_values_never_reach_the_config_as_syntax() {
        let c = exact("req.fhdr(x)".to_string(), "a b\"#$%").unwrap();
        assert_eq!(c.method.as_deref(), Some("reg"));
        assert_eq!(c.values, vec!["^a\\x20b\\x22\\x23\\x24\\x25$".to_string()]);
        let c = exact("req.fhdr(x)".to_string(), "v1.2").unwrap();
        assert_eq!(c.method.as_deref(), Some("str"));
        assert!(exact("req.fhdr(x)".to_string(), "a\nb").is_err());
    }

    #[test]
    fn cors_origins_with_a_wildcard_become_one_anchored_regex() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            cors_origins(&list(&["https://www.foo.com", "HTTPS://www.foo.com"])).unwrap(),
            CorsOrigin::List(vec!["https://www.foo.com".to_string()])
        );
        let CorsOrigin::Regex(re) =
            cors_origins(&list(&["https://www.foo.com", "https://*.bar.com:8443"])).unwrap()
        else {
            panic!("a wildcard origin is a regex");
        };
        assert_eq!(
            re,
            "^(?:https://www\\x2efoo\\x2ecom|https://[a-z0-9.-]+[.]bar\\x2ecom:8443)$"
        );
        assert_eq!(
            cors_origins(&list(&["https://a.com", "*"])).unwrap(),
            CorsOrigin::Any
        );
        let (field, _) = cors_origins(&list(&["https://a.com", "https://a.com/x"])).unwrap_err();
        assert_eq!(field, "allowOrigins[1]");
    }

    #[test]
    fn cors_filters_echo_wildcards_only_with_credentials() {
        let filter = |credentials: bool| CorsFilter {
            allow_origins: vec!["*".to_string()],
            allow_credentials: Some(credentials),
            allow_methods: vec!["*".to_string()],
            allow_headers: vec!["x-a".to_string(), "X-B".to_string()],
            ..CorsFilter::default()
        };
        let open = cors(&filter(false)).unwrap().unwrap();
        assert_eq!(
            (
                open.allow_methods.as_str(),
                open.echo_wildcards,
                open.max_age
            ),
            ("*", false, 5)
        );
        assert_eq!(open.allow_headers, "x-a, X-B");
        assert!(cors(&filter(true)).unwrap().unwrap().echo_wildcards);
        let none = CorsFilter::default();
        assert_eq!(cors(&none).unwrap(), None);
        let bad = CorsFilter {
            allow_origins: vec!["https://a.com".to_string()],
            allow_methods: vec!["GET, PUT".to_string()],
            ..CorsFilter::default()
        };
        assert_eq!(cors(&bad).unwrap_err().0, "allowMethods[0]");
    }

    #[test]
    fn path_regexes_match_the_whole_path_and_cannot_escape_their_group() {
        let c = path_regex("/api/v[0-9]+/.*").unwrap();
        assert_eq!(
            (c.fetch.as_str(), c.values[0].as_str()),
            ("path", "^(?:/api/v[0-9]+/.*)$")
        );
        assert!(path_regex("a)|(b").is_err());
        assert!(path_regex("/a b").is_err());
        assert!(path_regex("(").is_err());
    }

    #[test]
    fn header_values_are_written_literally() {
        assert_eq!(literal_header_value("50% off").unwrap(), "50%% off");
        assert!(literal_header_value("$HOME").is_err());
    }
}
