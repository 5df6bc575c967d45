//! haproxytech/kubernetes-ingress' own suites about the cluster around the routes,
//! re-expressed against Portcullis: `ingressclass`, `endpoints` (scaling replicas, endpoints
//! that are not ready, a TCP service), `map-updates` and `global-config` (`maxconn`, the
//! PROXY protocol from the load balancer). One test per suite case, in the suites' shape.
//!
//! Each test has a `portcullis run` of its own: these suites change the controller ConfigMap
//! or count HAProxy's reloads, which the other tests of a shared instance would disturb.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod incumbent;
mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use incumbent::*;
use support::{APPLY_TIMEOUT, Answer, Harness, TlsPod, free_port, self_signed, wait_until};

/// A harness serving the incumbent's class, with its IngressClass and base ConfigMap.
fn started(extra: &[&str]) -> Harness {
    let mut h = Harness::new();
    h.write("ingressclass.yaml", &ingress_class());
    h.write(
        "configmap.yaml",
        include_str!("fixtures/incumbent/configmap.yaml"),
    );
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(CONFIGMAP_FLAGS);
    flags.extend(extra);
    h.start(&flags);
    h
}

// ---------------------------------------------------------------------------------------------
// ingressclass

fn class_ingress(suite: &Suite, h: &Harness, class: Option<&str>) {
    h.write(
        "ingress.yaml",
        &ingress(
            &suite.ns,
            "http-echo",
            class,
            &[],
            Some(&suite.host),
            &[root("http-echo")],
            &[],
        ),
    );
}

/// ingressclass `Test_IngressClassName_Field`: an Ingress without `ingressClassName` is not
/// served; with `haproxy` it is.
#[test]
fn ingressclass_name_field() {
    let h = started(&[]);
    let suite = Suite::new("ingressclass");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    // Disabled
    class_ingress(&suite, &h, None);
    support::holds_for(Duration::from_millis(500), "not served", || {
        suite
            .get(&h, &[])
            .is_some_and(|a| a.status == 503 || a.status == 404)
    });
    // Enabled
    class_ingress(&suite, &h, Some(CLASS));
    suite.eventually(&h, "served", || suite.get(&h, &[]), |a| a.status == 200);
}

/// ingressclass `Test_IngressClassName_Resource`: an Ingress naming class `haproxy` is
/// served only while the IngressClass `haproxy` of this controller exists.
#[test]
fn ingressclass_name_resource() {
    let h = started(&[]);
    let suite = Suite::new("ingressclass-resource");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    // Disabled: the IngressClass is deleted (after the Ingress was served, so that its
    // removal is what stops it).
    class_ingress(&suite, &h, Some(CLASS));
    suite.eventually(&h, "served", || suite.get(&h, &[]), |a| a.status == 200);
    h.remove("ingressclass.yaml");
    suite.eventually(
        &h,
        "not served without the IngressClass",
        || suite.get(&h, &[]),
        |a| a.status == 503 || a.status == 404,
    );
    // Enabled
    h.write("ingressclass.yaml", &ingress_class());
    suite.eventually(&h, "served", || suite.get(&h, &[]), |a| a.status == 200);
}

// ---------------------------------------------------------------------------------------------
// endpoints

/// The endpoints suite's app: Service `http-echo`, the first `replicas` of `pods` as its
/// endpoints, and the Ingress with `annotations`.
fn endpoints_app(suite: &Suite, h: &Harness, endpoints: &[Endpoint], annotations: &[(&str, &str)]) {
    h.write(
        "app.yaml",
        &[
            echo_service(&suite.ns, "http-echo", &[]),
            slices(&suite.ns, "http-echo", endpoints),
            ingress(
                &suite.ns,
                "http-echo",
                Some(CLASS),
                annotations,
                Some(&suite.host),
                &[root("http-echo")],
                &[],
            ),
        ]
        .join("---\n"),
    );
}

/// endpoints `Test_HTTP_Reach`: with 4, 8, 2, 0 and 3 replicas in turn, twice as many
/// requests as replicas reach each replica exactly twice (round robin). HAProxy reloads
/// only when the number of server slots changes: the suite's ConfigMap sets `server-slots:
/// "4"`, so the step to 8 replicas reloads (the slots grow to 8), and so does the step back
/// to 2 (they shrink to 4), which the incumbent, keeping its slots, does without a reload.
#[test]
fn endpoints_http_reach() {
    let h = started(&[]);
    let suite = Suite::new("endpoints");
    let pods: Vec<Pod> = (0..8)
        .map(|i| Pod::start(&format!("http-echo-{i}"), Reply::Echo))
        .collect();
    let endpoints = |n: usize| -> Vec<Endpoint> { pods[..n].iter().map(Pod::endpoint).collect() };
    endpoints_app(&suite, &h, &endpoints(1), &[]);
    suite.eventually(
        &h,
        "one replica",
        || suite.get(&h, &[]),
        |a| a.status == 200,
    );
    let mut reloads = h.reloads();
    for replicas in [4usize, 8, 2, 0, 3] {
        endpoints_app(&suite, &h, &endpoints(replicas), &[]);
        let mut last = BTreeMap::new();
        let ok = support::poll(APPLY_TIMEOUT, || {
            let mut counter: BTreeMap<String, usize> = BTreeMap::new();
            for _ in 0..replicas * 2 {
                if let Some(a) = suite.get(&h, &[]).filter(|a| a.status == 200) {
                    *counter.entry(a.who()).or_default() += 1;
                }
            }
            let ok = if replicas == 0 {
                counter.is_empty() && suite.get(&h, &[]).is_some_and(|a| a.status == 503)
            } else {
                counter.len() == replicas && counter.values().all(|v| *v == 2)
            };
            last = counter;
            ok.then_some(())
        });
        assert!(
            ok.is_some(),
            "{replicas} replicas, each answering twice: {last:?}"
        );
        let grew = u64::from(replicas == 8 || replicas == 2);
        assert_eq!(
            h.reloads(),
            (reloads.0 + grew, reloads.1),
            "{replicas} replicas: {grew} reload (slots changed)"
        );
        reloads = h.reloads();
    }
}

/// endpoints `Test_Non_Ready_Endpoints`: one ready and two not-ready endpoints, with `check:
/// "false"` and the suite's backend snippet answering 503 unless the number of usable
/// servers is as expected. The suite's snippet compares `nbsrv()` with the count its own
/// rollout leaves; here one endpoint is ready, so one server must be usable.
#[test]
fn endpoints_non_ready() {
    let h = started(&[
        "--allow-config-snippets",
        "--allow-config-snippets-in-annotations",
    ]);
    let suite = Suite::new("endpoints-not-ready");
    let pods: Vec<Pod> = (0..3)
        .map(|i| Pod::start(&format!("http-echo-{i}"), Reply::Echo))
        .collect();
    let endpoints: Vec<Endpoint> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| Endpoint {
            ready: i == 0,
            ..p.endpoint()
        })
        .collect();
    endpoints_app(
        &suite,
        &h,
        &endpoints,
        &[
            ("check", "false"),
            (
                "backend-config-snippet",
                "http-request return status 503 if !{ nbsrv() eq 1 }",
            ),
        ],
    );
    suite.eventually(
        &h,
        "200 from the ready pod",
        || suite.get(&h, &[]),
        |a| a.status == 200,
    );
    for _ in 0..10 {
        assert_eq!(
            suite.get(&h, &[]).map(|a| a.who()).as_deref(),
            Some("http-echo-0")
        );
    }
}

/// endpoints `Test_TCP_Reach`: the TCP services ConfigMap maps a port to the Service's
/// `https` port; HTTPS requests through it reach the four replicas' own TLS servers.
#[test]
fn endpoints_tcp_reach() {
    let tcp_port = free_port();
    let mut h = Harness::new();
    let work = h.work();
    self_signed(&work, "tcp-service.test", "pod");
    let (crt, key) = (work.join("pod.crt"), work.join("pod.key"));
    let suite = Suite::new("endpoints-tcp");
    let pods: Vec<(Pod, u16, TlsPod)> = (0..4)
        .map(|i| {
            let https = free_port();
            (
                Pod::start(&format!("http-echo-{i}"), Reply::Echo),
                https,
                TlsPod::start(https, &crt, &key),
            )
        })
        .collect();
    let endpoints: Vec<Endpoint> = pods
        .iter()
        .map(|(p, https, _)| Endpoint {
            https: Some(*https),
            ..p.endpoint()
        })
        .collect();
    h.write("ingressclass.yaml", &ingress_class());
    endpoints_app(&suite, &h, &endpoints, &[]);
    h.write(
        "tcp.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: haproxy-kubernetes-ingress-tcp\n  \
             namespace: haproxy-controller\ndata:\n  \"{tcp_port}\": \"{}/http-echo:443\"\n",
            suite.ns
        ),
    );
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend([
        "--configmap-tcp-services",
        "haproxy-controller/haproxy-kubernetes-ingress-tcp",
    ]);
    h.start(&flags);
    let https_get = || support::https_get(tcp_port, "tcp-service.test", "tcp-service.test", "/");
    wait_until(APPLY_TIMEOUT, "the TCP service answers over TLS", || {
        https_get().is_some_and(|a| a.status == 200)
    });
    for _ in 0..4 {
        let answer = https_get().expect("an answer");
        assert_eq!(answer.status, 200);
        assert!(answer.body.contains("s_server"), "{}", answer.body);
    }
}

// ---------------------------------------------------------------------------------------------
// map-updates

/// map-updates `Test_Update`: 700 paths added to an Ingress at once are applied without a
/// reload (as runtime map updates), and every one of them is routed.
#[test]
fn map_updates_update() {
    let h = started(&[]);
    let suite = Suite::new("map-updates");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    let write = |paths: &[String]| {
        let list: Vec<IngPath<'_>> = paths
            .iter()
            .map(|p| IngPath {
                path: Some(p),
                path_type: "ImplementationSpecific",
                service: "http-echo",
                port: "http",
            })
            .collect();
        h.write(
            "ingress.yaml",
            &ingress(
                &suite.ns,
                "http-echo",
                Some(CLASS),
                &[],
                Some(&suite.host),
                &list,
                &[],
            ),
        );
    };
    write(&["/".to_string()]);
    suite.eventually(
        &h,
        "/ is served",
        || suite.get(&h, &[]),
        |a| a.status == 200,
    );
    let reloads = h.reloads();
    let paths: Vec<String> = (0..700).map(|i| format!("/{i}")).collect();
    write(&paths);
    wait_until(APPLY_TIMEOUT, "the last path is served", || {
        suite
            .send(&h, "GET", "/699", &[])
            .is_some_and(|a| a.status == 200)
    });
    assert_eq!(h.reloads(), reloads, "700 paths without a reload");
    for path in &paths {
        let answer = suite.send(&h, "GET", path, &[]).expect("an answer");
        assert_eq!(answer.who(), "http-echo", "{path}: {answer:?}");
    }
    // The `/` entry the 700 replaced is gone.
    wait_until(APPLY_TIMEOUT, "/ is no longer routed", || {
        suite.get(&h, &[]).is_some_and(|a| a.status == 404)
    });
    assert_eq!(h.reloads(), reloads, "still no reload");
}

// ---------------------------------------------------------------------------------------------
// global-config

/// `Maxconn:` of `show info`.
fn maxconn(h: &Harness) -> Option<String> {
    h.runtime("show info\n")
        .lines()
        .find_map(|l| l.strip_prefix("Maxconn: ").map(str::to_string))
}

/// global-config `TestMaxconn`: the ConfigMap's `maxconn` is HAProxy's, and changing it
/// changes HAProxy's.
#[test]
fn global_config_maxconn() {
    let h = started(&[]);
    let base = include_str!("fixtures/incumbent/configmap.yaml");
    h.write(
        "configmap.yaml",
        &base.replace("maxconn: \"1000\"", "maxconn: \"1111\""),
    );
    wait_until(APPLY_TIMEOUT, "maxconn 1111", || {
        maxconn(&h).as_deref() == Some("1111")
    });
    h.write("configmap.yaml", base);
    wait_until(APPLY_TIMEOUT, "maxconn 1000", || {
        maxconn(&h).as_deref() == Some("1000")
    });
    // The suite's ConfigMap loads without a diagnostic on its syslog-server.
    assert!(
        !log_has(&h, &["syslog-server"]),
        "{}",
        support::log_tail(&h.log(), 20)
    );
}

/// A connection to the HTTP port that starts with a PROXY v1 header (client 10.1.1.1) and
/// sends `HEAD / HTTP/1.0`: what comes back.
fn proxy_proto_conn(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"PROXY TCP4 10.1.1.1 20.2.2.2 1000 2000\r\nHEAD / HTTP/1.0\r\n\r\n")
        .ok()?;
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    Some(String::from_utf8_lossy(&out).to_string())
}

/// global-config `Test_Proxy_Protocol`: with `proxy-protocol: 0.0.0.0/0` a PROXY header is
/// read (the default backend's 404); with `proxy-protocol: 192.168.1.1`, a connection from
/// elsewhere is plain HTTP, so the header is a bad request.
#[test]
fn global_config_proxy_protocol() {
    let h = started(&[]);
    let base = include_str!("fixtures/incumbent/configmap.yaml");
    let with = |cidrs: &str| {
        base.replace(
            "  maxconn: \"1000\"\n",
            &format!("  proxy-protocol: {cidrs}\n  maxconn: \"1000\"\n"),
        )
    };
    // Source_IP_OK
    h.write("configmap.yaml", &with("0.0.0.0/0"));
    wait_until(APPLY_TIMEOUT, "a PROXY header is accepted", || {
        proxy_proto_conn(h.http_port).is_some_and(|r| r.contains("404 Not Found"))
    });
    // Source_IP_KO
    h.write("configmap.yaml", &with("192.168.1.1"));
    wait_until(APPLY_TIMEOUT, "a PROXY header is a bad request", || {
        proxy_proto_conn(h.http_port).is_some_and(|r| r.contains("400 Bad request"))
    });
    let plain: Option<Answer> = suite_get(&h);
    assert_eq!(plain.map(|a| a.status), Some(404), "plain HTTP is served");
}

fn suite_get(h: &Harness) -> Option<Answer> {
    request(h.http_port, "GET", "unknown.test", "/", &[])
}

// ---------------------------------------------------------------------------------------------
// pod-maxconn (deploy/tests/integration/pod-maxconn)

/// A running controller pod `name` of the incumbent's Deployment (through its ReplicaSet).
fn controller_pod(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: haproxy-controller\n  \
         labels: {{app: haproxy-ingress, pod-template-hash: 5d8f9}}\n  \
         ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: haproxy-ingress-5d8f9, \
         uid: 3f1c2e0a-rs, controller: true, blockOwnerDeletion: true}}]\n\
         spec:\n  containers: [{{name: controller, image: portcullis}}]\n\
         status: {{phase: Running, podIP: \"{ip}\", podIPs: [{{ip: \"{ip}\"}}]}}\n"
    )
}

/// pod-maxconn `TestPodMaxConnConfigMap` and `TestPodMaxConnConfigMapMisc`: the ConfigMap's
/// `pod-maxconn` is the budget of all controller replicas together, so each replica's
/// servers get it divided by the number of replicas: 128 over 2 replicas is 64 per server,
/// over 4 it is 32.
#[test]
fn pod_maxconn_configmap() {
    let mut h = Harness::new();
    h.write("ingressclass.yaml", &ingress_class());
    let base = include_str!("fixtures/incumbent/configmap.yaml");
    h.write("configmap.yaml", &format!("{base}  pod-maxconn: \"128\"\n"));
    let ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let pods = |n: usize| -> String {
        (1..=n)
            .map(|i| controller_pod(&format!("ic{i}"), ips[i - 1]))
            .collect::<Vec<_>>()
            .join("---\n")
    };
    h.write("controller-pods.yaml", &pods(2));
    let suite = Suite::new("pod-maxconn");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    suite.ingress(&h, &[]);
    let peer_port = free_port().to_string();
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(CONFIGMAP_FLAGS);
    flags.extend([
        "--pod-name",
        "ic1",
        "--pod-namespace",
        "haproxy-controller",
        "--pod-ip",
        "127.0.0.1",
        "--localpeer-port",
        &peer_port,
    ]);
    h.start(&flags);
    let backend = format!("backend {}_http-echo_80", suite.ns);
    let default_server = || -> Option<String> {
        section(&config(&h), &backend)
            .into_iter()
            .find(|l| l.starts_with("default-server"))
            .map(str::to_string)
    };
    let per_server = |maxconn: &str| {
        let ok = support::poll(APPLY_TIMEOUT, || {
            default_server()
                .is_some_and(|l| l.ends_with(maxconn) || l.contains(&format!("{maxconn} ")))
                .then_some(())
        });
        assert!(ok.is_some(), "{maxconn}: {:?}", default_server());
    };
    per_server("maxconn 64");
    // The same pods again change nothing; two more replicas halve it again.
    h.write("controller-pods.yaml", &pods(2));
    h.write("controller-pods.yaml", &pods(4));
    per_server("maxconn 32");
}
