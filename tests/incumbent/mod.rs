//! Shared pieces of the tests that re-express haproxytech/kubernetes-ingress' own end-to-end
//! suites (`deploy/tests/e2e/*` in its repository): manifests in the shape of the suites'
//! templates (IngressClass `haproxy` of controller `haproxy.org/ingress-controller`, an
//! `http-echo` Service with named ports `http` and `https`, one namespace and host per suite),
//! loopback pods that echo every request header, and one `portcullis run` shared by the tests
//! of a file.
//!
//! Every loop is bounded and every wait polls against a deadline.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::support::{APPLY_TIMEOUT, Answer, Harness};

/// The incumbent's ingress class and controller name, as its charts install them.
pub const CLASS: &str = "haproxy";
pub const CONTROLLER: &str = "haproxy.org/ingress-controller";

/// `portcullis run` flags that make it serve the incumbent's class.
pub const CLASS_FLAGS: [&str; 4] = ["--ingress-class", CLASS, "--controller-class", CONTROLLER];

const IO_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Manifests

/// The IngressClass `haproxy` the incumbent's installation creates.
pub fn ingress_class() -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: {CLASS}\n\
         spec:\n  controller: {CONTROLLER}\n"
    )
}

/// A `metadata.annotations` block (two-space indent), values double-quoted as the suites'
/// templates write them.
fn annotations_block(annotations: &[(&str, &str)]) -> String {
    if annotations.is_empty() {
        return String::new();
    }
    let mut out = String::from("  annotations:\n");
    for (k, v) in annotations {
        out.push_str(&format!("    {k}: {v:?}\n"));
    }
    out
}

/// The suites' `http-echo` Service: ports `http` (80) and `https` (443), each targeting the
/// pods' port of the same name.
pub fn echo_service(ns: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n{}\
         spec:\n  ports:\n    - {{name: http, protocol: TCP, port: 80, targetPort: http}}\n    \
         - {{name: https, protocol: TCP, port: 443, targetPort: https}}\n",
        annotations_block(annotations)
    )
}

/// One endpoint of a Service: a loopback pod with its `http` (and optionally `https`) port.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub name: String,
    pub http: u16,
    pub https: Option<u16>,
    pub ready: bool,
}

impl Endpoint {
    pub fn http(name: &str, port: u16) -> Self {
        Self {
            name: name.to_string(),
            http: port,
            https: None,
            ready: true,
        }
    }
}

/// One EndpointSlice per endpoint of Service `svc` (each loopback pod has ports of its own).
pub fn slices(ns: &str, svc: &str, endpoints: &[Endpoint]) -> String {
    let mut docs = Vec::new();
    for e in endpoints {
        let mut ports = format!("  - {{name: http, port: {}, protocol: TCP}}\n", e.http);
        if let Some(https) = e.https {
            ports.push_str(&format!(
                "  - {{name: https, port: {https}, protocol: TCP}}\n"
            ));
        }
        docs.push(format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-{}\n  \
             namespace: {ns}\n  labels: {{kubernetes.io/service-name: {svc}}}\naddressType: IPv4\n\
             ports:\n{ports}endpoints:\n  - addresses: [\"127.0.0.1\"]\n    \
             conditions: {{ready: {}}}\n    targetRef: {{kind: Pod, name: {}, namespace: {ns}}}\n",
            e.name, e.ready, e.name
        ));
    }
    docs.join("---\n")
}

/// One path of an Ingress rule, with the backend port given by name as the suites do.
#[derive(Debug, Clone, Copy)]
pub struct IngPath<'a> {
    /// `None`: a path without a `path` field (the canary suite's staging path).
    pub path: Option<&'a str>,
    pub path_type: &'a str,
    pub service: &'a str,
    pub port: &'a str,
}

/// `/` (Prefix) to `service`'s port `http`: the path of most suites.
pub fn root(service: &str) -> IngPath<'_> {
    IngPath {
        path: Some("/"),
        path_type: "Prefix",
        service,
        port: "http",
    }
}

/// An Ingress with one rule for `host` (none: a rule without host), of class `class` (none:
/// no `ingressClassName`), with these annotations and `spec.tls` entries `(secret, hosts)`.
pub fn ingress(
    ns: &str,
    name: &str,
    class: Option<&str>,
    annotations: &[(&str, &str)],
    host: Option<&str>,
    paths: &[IngPath<'_>],
    tls: &[(&str, &[&str])],
) -> String {
    let mut out = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: {ns}\n{}spec:\n",
        annotations_block(annotations)
    );
    if let Some(class) = class {
        out.push_str(&format!("  ingressClassName: {class}\n"));
    }
    if !tls.is_empty() {
        out.push_str("  tls:\n");
        for (secret, hosts) in tls {
            out.push_str(&format!(
                "    - secretName: {secret}\n      hosts: {hosts:?}\n"
            ));
        }
    }
    out.push_str("  rules:\n");
    match host {
        Some(h) => out.push_str(&format!("    - host: {h:?}\n      http:\n")),
        None => out.push_str("    - http:\n"),
    }
    out.push_str("        paths:\n");
    for p in paths {
        out.push_str("          - ");
        if let Some(path) = p.path {
            out.push_str(&format!("path: {path:?}\n            "));
        }
        out.push_str(&format!(
            "pathType: {}\n            backend: {{service: {{name: {}, port: {{name: {}}}}}}}\n",
            p.path_type, p.service, p.port
        ));
    }
    out
}

/// The controller ConfigMap `haproxy-controller/haproxy-kubernetes-ingress` with `data` lines
/// (each `key: value`, already YAML).
pub fn controller_configmap(data: &[(&str, &str)]) -> String {
    let mut out = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: haproxy-kubernetes-ingress\n  \
         namespace: haproxy-controller\ndata:\n",
    );
    if data.is_empty() {
        out.push_str("  {}\n");
    }
    for (k, v) in data {
        out.push_str(&format!("  {k}: {v:?}\n"));
    }
    out
}

/// `--configmap` for [`controller_configmap`].
pub const CONFIGMAP_FLAGS: [&str; 2] = [
    "--configmap",
    "haproxy-controller/haproxy-kubernetes-ingress",
];

/// A `kubernetes.io/tls` Secret.
pub fn tls_secret(ns: &str, name: &str, cert: &str, key: &str) -> String {
    crate::support::tls_secret(ns, name, cert, key)
}

// ---------------------------------------------------------------------------------------------
// A suite

/// A suite's namespace and host (`<namespace>.test`, as the suites name theirs).
pub struct Suite {
    pub ns: String,
    pub host: String,
}

impl Suite {
    pub fn new(name: &str) -> Self {
        let ns = format!("e2e-tests-{name}");
        Self {
            host: format!("{ns}.test"),
            ns,
        }
    }

    /// The suite's `http-echo` app: its Service and one echo pod.
    pub fn app(&self, h: &Harness, pod: &Pod) {
        h.write(
            &format!("{}-app.yaml", self.ns),
            &format!(
                "{}---\n{}",
                echo_service(&self.ns, "http-echo", &[]),
                slices(&self.ns, "http-echo", &[pod.endpoint()])
            ),
        );
    }

    /// The suite's Ingress `http-echo` for its host, `/` to `http-echo`, with annotations.
    pub fn ingress(&self, h: &Harness, annotations: &[(&str, &str)]) {
        self.ingress_for(h, "http-echo", &self.host, annotations);
    }

    pub fn ingress_for(&self, h: &Harness, name: &str, host: &str, annotations: &[(&str, &str)]) {
        h.write(
            &format!("{}-{name}-ingress.yaml", self.ns),
            &ingress(
                &self.ns,
                name,
                Some(CLASS),
                annotations,
                Some(host),
                &[root("http-echo")],
                &[],
            ),
        );
    }

    /// The suites' client: a GET of `/` for the host, with `Origin: http://<host>` as theirs
    /// always sends, and extra headers.
    pub fn get(&self, h: &Harness, extra: &[(&str, &str)]) -> Option<Answer> {
        self.send(h, "GET", "/", extra)
    }

    pub fn send(
        &self,
        h: &Harness,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
    ) -> Option<Answer> {
        let origin = format!("http://{}", self.host);
        let mut headers = vec![("Origin", origin.as_str())];
        headers.extend_from_slice(extra);
        request(h.http_port, method, &self.host, path, &headers)
    }

    /// Polls until the answer to `probe` satisfies `check`.
    pub fn eventually(
        &self,
        h: &Harness,
        what: &str,
        mut probe: impl FnMut() -> Option<Answer>,
        check: impl Fn(&Answer) -> bool,
    ) {
        let mut last = None;
        let ok = crate::support::poll(APPLY_TIMEOUT, || {
            let answer = probe();
            let ok = answer.as_ref().is_some_and(&check);
            last = answer;
            ok.then_some(())
        });
        assert!(
            ok.is_some(),
            "{}: {what}; last answer: {last:?}\n{}",
            self.ns,
            crate::support::log_tail(&h.log(), 40)
        );
    }
}

/// An annotation name as the suites' manifests write it: bare, without a prefix.
pub fn org(name: &str) -> String {
    name.to_string()
}

// ---------------------------------------------------------------------------------------------
// Pods

/// What a loopback pod answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// `200`, body `<name> <method> <target> host=<host>`, then every request header as
    /// `name: value` (name lowercased), in the order received: the suites' `http-echo` JSON in
    /// plain text.
    Echo,
    /// Expects a PROXY protocol v1 line before the request, as the suites' `proxy-protocol`
    /// image does: `200 hello!` after one, `400` without.
    ProxyHello,
}

/// A loopback HTTP pod on its own thread; stops when dropped.
#[derive(Debug)]
pub struct Pod {
    pub name: String,
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl Pod {
    pub fn start(name: &str, reply: Reply) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("an address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, name2) = (stop.clone(), name.to_string());
        std::thread::spawn(move || {
            // Bounded: about ten minutes of idle polling at most.
            for _ in 0..600_000 {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                match listener.accept() {
                    Ok((stream, _)) => {
                        let name = name2.clone();
                        std::thread::spawn(move || serve(stream, &name, reply));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Self {
            name: name.to_string(),
            port,
            stop,
        }
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::http(&self.name, self.port)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads until the end of a request head (or of what the peer sends); at most 64 KiB.
fn read_head(stream: &mut TcpStream, mut head: Vec<u8>) -> Vec<u8> {
    let mut buf = [0u8; 4096];
    for _ in 0..16 {
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    head
}

fn serve(mut stream: TcpStream, name: &str, reply: Reply) {
    if stream.set_nonblocking(false).is_err() || stream.set_read_timeout(Some(IO_TIMEOUT)).is_err()
    {
        return;
    }
    let mut head = read_head(&mut stream, Vec::new());
    if head.is_empty() {
        // A TCP health check.
        return;
    }
    if reply == Reply::ProxyHello {
        let Some(end) = head.windows(2).position(|w| w == b"\r\n") else {
            return;
        };
        let line = String::from_utf8_lossy(&head[..end]).to_string();
        if !(line.starts_with("PROXY TCP4 ") || line.starts_with("PROXY TCP6 ")) {
            answer(&mut stream, 400, "", "no PROXY protocol header\n");
            return;
        }
        head = read_head(&mut stream, head[end + 2..].to_vec());
        if head.is_empty() {
            // A health check sends the PROXY line only.
            return;
        }
        answer(&mut stream, 200, "", "hello!");
        return;
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let text = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let host = headers
        .iter()
        .find(|(n, _)| n == "host")
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    let mut body = format!("{name} {method} {target} host={host}\n");
    for (n, v) in &headers {
        body.push_str(&format!("{n}: {v}\n"));
    }
    let body = if method == "HEAD" {
        String::new()
    } else {
        body
    };
    answer(&mut stream, 200, &format!("X-Served-By: {name}\r\n"), &body);
}

fn answer(stream: &mut TcpStream, status: u16, extra_headers: &str, body: &str) {
    let reason = if status == 200 { "OK" } else { "Bad Request" };
    let answer = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         {extra_headers}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes());
}

/// The value of request header `name` (lowercase) as an [`Reply::Echo`] pod received it.
pub fn received(answer: &Answer, name: &str) -> Option<String> {
    let prefix = format!("{name}: ");
    answer
        .body
        .lines()
        .skip(1)
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
}

/// The `host=` an [`Reply::Echo`] pod received.
pub fn received_host(answer: &Answer) -> Option<String> {
    let first = answer.body.lines().next()?;
    first
        .split(' ')
        .find_map(|w| w.strip_prefix("host=").map(str::to_string))
}

// ---------------------------------------------------------------------------------------------
// Clients

/// One HTTP/1.1 request with `Connection: close` on a fresh connection to 127.0.0.1:`port`;
/// `None` if the connection failed or the answer was not HTTP.
pub fn request(
    port: u16,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<Answer> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: portcullis-e2e\r\nConnection: close\r\n"
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    // A HEAD answer has no body: read what comes until the server closes.
    let _ = stream.read_to_end(&mut raw);
    parse(&raw, method == "HEAD")
}

fn parse(raw: &[u8], head_only: bool) -> Option<Answer> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = match text.split_once("\r\n\r\n") {
        Some(parts) => parts,
        None if head_only => (text.as_ref(), ""),
        None => return None,
    };
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_string(),
    })
}

/// All values of response header `name` (lowercase).
pub fn header_values<'a>(answer: &'a Answer, name: &str) -> Vec<&'a str> {
    answer
        .headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The `Set-Cookie` value for cookie `name`, if the answer sets it.
pub fn set_cookie(answer: &Answer, name: &str) -> Option<String> {
    header_values(answer, "set-cookie")
        .into_iter()
        .find_map(|v| {
            let (n, rest) = v.split(';').next()?.split_once('=')?;
            (n.trim() == name).then(|| rest.trim().to_string())
        })
}

// ---------------------------------------------------------------------------------------------
// Diagnostics and configuration

/// Whether some line of `portcullis run`'s log holds every one of `parts`.
pub fn log_has(h: &Harness, parts: &[&str]) -> bool {
    h.log()
        .lines()
        .any(|line| parts.iter().all(|p| line.contains(p)))
}

/// The `haproxy.cfg` in force.
pub fn config(h: &Harness) -> String {
    std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap_or_default()
}

/// The lines of section `header` (e.g. `backend shop_web_80`) of `cfg`, trimmed.
pub fn section<'a>(cfg: &'a str, header: &str) -> Vec<&'a str> {
    let mut lines = cfg.lines();
    let mut out = Vec::new();
    if lines.by_ref().any(|l| l.trim_end() == header) {
        for l in lines {
            if !l.starts_with(' ') && !l.trim().is_empty() {
                break;
            }
            if !l.trim().is_empty() {
                out.push(l.trim());
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// One `portcullis run` per test file

/// The harness the tests of one file share: the first test that asks starts it; it stops
/// when the last test holding it is done (and a later test starts a new one).
pub struct Shared {
    slot: Mutex<Option<Weak<Harness>>>,
}

impl Shared {
    pub const fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    /// The running shared harness, or a new one prepared by `prepare` (which writes the
    /// manifests every test needs) and started with `flags`.
    pub fn get(&self, prepare: impl FnOnce(&mut Harness), flags: &[&str]) -> Arc<Harness> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = slot.as_ref().and_then(Weak::upgrade) {
            return h;
        }
        let mut h = Harness::new();
        prepare(&mut h);
        h.start(flags);
        let h = Arc::new(h);
        *slot = Some(Arc::downgrade(&h));
        h
    }
}
