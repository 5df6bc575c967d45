//! Gateway API from the cluster: `portcullis run` against the test API server watches
//! GatewayClasses, Gateways, HTTPRoutes and ReferenceGrants, serves the routes through a real
//! HAProxy, and writes their status as the spec defines it (conditions, reasons,
//! `attachedRoutes`, `observedGeneration`), in the shape of the upstream GatewayClass*,
//! GatewayObservedGenerationBump, HTTPRouteInvalidCrossNamespaceBackendRef,
//! HTTPRouteHostnameIntersection and GatewayInvalidRouteKind conformance tests. Without the
//! CRDs the controller starts, watches none of them and says so.
//!
//! Every loop here is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::time::Duration;

use apiserver::ApiServer;
use serde_json::Value;
use support::{APPLY_TIMEOUT, Harness, poll};

const GV: &str = "gateway.networking.k8s.io/v1";

struct Cluster {
    rt: tokio::runtime::Runtime,
    server: ApiServer,
}

impl Cluster {
    fn start(with_crds: bool) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut builder = ApiServer::builder()
            .list_items_without_type_meta()
            .bookmark_interval(Duration::from_secs(1));
        if with_crds {
            for def in apiserver::gateway_api_crds() {
                builder = builder.with_resource(def);
            }
        }
        let server = rt.block_on(builder.start());
        Self { rt, server }
    }

    fn harness(&self, h: &mut Harness) {
        let kubeconfig = h.work().join("kubeconfig");
        self.server.write_kubeconfig(&kubeconfig, None);
        h.use_kubeconfig(&kubeconfig);
    }

    /// The status condition `kind` of an object's conditions list at `pointer`.
    fn condition(
        &self,
        kind: &str,
        ns: &str,
        name: &str,
        pointer: &str,
        ty: &str,
    ) -> Option<Value> {
        let object = self.server.get(GV, kind, ns, name)?;
        object
            .pointer(pointer)?
            .as_array()?
            .iter()
            .find(|c| c["type"] == ty)
            .cloned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.rt.block_on(self.server.stop());
    }
}

const OBJECTS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: portcullis
spec:
  controllerName: portcullis.io/gateway-controller
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: someone-else
spec:
  controllerName: example.com/other
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
  namespace: infra
spec:
  gatewayClassName: portcullis
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    hostname: \"*.example.com\"
  - name: udp
    port: 9000
    protocol: UDP
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: good
  namespace: infra
spec:
  parentRefs:
  - name: gw
    sectionName: http
  hostnames:
  - app.example.com
  rules:
  - backendRefs:
    - name: infra-backend-v1
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: cross
  namespace: infra
spec:
  parentRefs:
  - name: gw
  hostnames:
  - cross.example.com
  rules:
  - backendRefs:
    - name: app-backend
      namespace: app
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: elsewhere
  namespace: infra
spec:
  parentRefs:
  - name: gw
  hostnames:
  - app.example.org
  rules:
  - backendRefs:
    - name: infra-backend-v1
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: foreign
  namespace: app
spec:
  parentRefs:
  - name: gw
    namespace: infra
  rules:
  - backendRefs:
    - name: app-backend
      port: 80
";

fn parent_condition(c: &Cluster, ns: &str, route: &str, ty: &str) -> Option<Value> {
    c.condition("HTTPRoute", ns, route, "/status/parents/0/conditions", ty)
}

/// Routes served from the cluster, and every status the spec asks for, with its reason.
#[test]
fn serves_routes_and_writes_status_from_the_cluster() {
    let cluster = Cluster::start(true);
    let mut h = Harness::new();
    for (ns, name) in [("infra", "infra-backend-v1"), ("app", "app-backend")] {
        let backend = h.backend(ns, name);
        cluster.server.apply_yaml(&backend);
    }
    cluster.server.apply_yaml(OBJECTS);
    cluster.harness(&mut h);
    h.start(&["--allow-local-endpoints"]);

    for (host, expected) in [
        ("app.example.com", "infra-backend-v1"),
        ("cross.example.com", "status 500"),
        ("app.example.org", "status 404"),
    ] {
        let mut last = String::new();
        let answered = poll(APPLY_TIMEOUT, || {
            last = h.try_get(host, "/")?.who();
            (last == expected).then_some(())
        });
        assert!(
            answered.is_some(),
            "{host}: {last}, not {expected}\n{}",
            h.log()
        );
    }
    let expect = |what: &str, found: Option<Value>, status: &str, reason: &str| {
        assert!(
            found
                .as_ref()
                .is_some_and(|c| c["status"] == status && c["reason"] == reason),
            "{what}: expected {status} {reason}, found {found:?}\n{}",
            support::log_tail(&h.log(), 40)
        );
        found.unwrap()
    };
    let class = poll(APPLY_TIMEOUT, || {
        cluster.condition(
            "GatewayClass",
            "",
            "portcullis",
            "/status/conditions",
            "Accepted",
        )
    });
    expect("GatewayClass Accepted", class, "True", "Accepted");
    assert!(
        cluster
            .condition(
                "GatewayClass",
                "",
                "someone-else",
                "/status/conditions",
                "Accepted"
            )
            .is_none(),
        "another controller's class is left alone"
    );
    let gw = |ty: &str| cluster.condition("Gateway", "infra", "gw", "/status/conditions", ty);
    expect(
        "Gateway Accepted",
        poll(APPLY_TIMEOUT, || gw("Accepted")),
        "True",
        "Accepted",
    );
    expect("Gateway Programmed", gw("Programmed"), "True", "Programmed");
    let listener = |i: usize, ty: &str| {
        cluster.condition(
            "Gateway",
            "infra",
            "gw",
            &format!("/status/listeners/{i}/conditions"),
            ty,
        )
    };
    expect(
        "listener http Accepted",
        listener(0, "Accepted"),
        "True",
        "Accepted",
    );
    expect(
        "listener udp Accepted",
        listener(1, "Accepted"),
        "False",
        "UnsupportedProtocol",
    );
    let gateway = cluster.server.get(GV, "Gateway", "infra", "gw").unwrap();
    // good and cross attach; elsewhere's hostname does not match, foreign is not allowed.
    assert_eq!(
        gateway["status"]["listeners"][0]["attachedRoutes"], 2,
        "{gateway}"
    );

    let accepted = poll(APPLY_TIMEOUT, || {
        parent_condition(&cluster, "infra", "good", "Accepted")
    });
    let accepted = expect("good Accepted", accepted, "True", "Accepted");
    let generation = cluster
        .server
        .get(GV, "HTTPRoute", "infra", "good")
        .unwrap()["metadata"]["generation"]
        .clone();
    assert_eq!(accepted["observedGeneration"], generation);
    expect(
        "good ResolvedRefs",
        parent_condition(&cluster, "infra", "good", "ResolvedRefs"),
        "True",
        "ResolvedRefs",
    );
    expect(
        "cross ResolvedRefs",
        poll(APPLY_TIMEOUT, || {
            parent_condition(&cluster, "infra", "cross", "ResolvedRefs")
        }),
        "False",
        "RefNotPermitted",
    );
    expect(
        "elsewhere Accepted",
        poll(APPLY_TIMEOUT, || {
            parent_condition(&cluster, "infra", "elsewhere", "Accepted")
        }),
        "False",
        "NoMatchingListenerHostname",
    );
    expect(
        "foreign Accepted",
        poll(APPLY_TIMEOUT, || {
            parent_condition(&cluster, "app", "foreign", "Accepted")
        }),
        "False",
        "NotAllowedByListeners",
    );

    // A ReferenceGrant makes the cross-namespace reference resolve.
    cluster.server.apply_yaml(
        "apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata:
  name: from-infra
  namespace: app
spec:
  from:
  - group: gateway.networking.k8s.io
    kind: HTTPRoute
    namespace: infra
  to:
  - group: \"\"
    kind: Service
",
    );
    let resolved = poll(APPLY_TIMEOUT, || {
        parent_condition(&cluster, "infra", "cross", "ResolvedRefs")
            .filter(|c| c["status"] == "True")
    });
    assert!(resolved.is_some(), "{}", support::log_tail(&h.log(), 40));
    let answered = poll(APPLY_TIMEOUT, || {
        (h.try_get("cross.example.com", "/")?.who() == "app-backend").then_some(())
    });
    assert!(answered.is_some());

    // A new generation is observed.
    cluster.server.apply_yaml(
        &OBJECTS
            .split("---\n")
            .find(|d| d.contains("name: good"))
            .unwrap()
            .replace("port: 80\n", "port: 80\n      weight: 2\n"),
    );
    let bumped = poll(APPLY_TIMEOUT, || {
        let route = cluster.server.get(GV, "HTTPRoute", "infra", "good")?;
        let generation = route["metadata"]["generation"].clone();
        let observed =
            parent_condition(&cluster, "infra", "good", "Accepted")?["observedGeneration"].clone();
        (generation != 1 && observed == generation).then_some(())
    });
    assert!(bumped.is_some(), "observedGeneration follows the route");
}

/// Without the Gateway API CRDs the controller starts, watches none of their kinds, and says
/// so once per kind.
#[test]
fn missing_crds_are_a_notice() {
    let cluster = Cluster::start(false);
    let mut h = Harness::new();
    cluster.harness(&mut h);
    h.start(&[]);
    let log = h.log();
    for kind in ["GatewayClass", "Gateway", "HTTPRoute", "ReferenceGrant"] {
        assert!(
            log.contains(&format!("the Gateway API {kind} resource")),
            "no notice for {kind}:\n{log}"
        );
    }
    assert_eq!(cluster.server.watch_count("httproutes"), 0);
}
