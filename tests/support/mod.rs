//! Support for the end-to-end tests of `portcullis run`: a [`Harness`] that owns a manifest
//! directory, loopback echo backends and a real `portcullis run` driving a real HAProxy, and
//! small clients for what the tests look at (HTTP through HAProxy, the master CLI, the admin
//! endpoint, `openssl s_client`).
//!
//! Everything is bounded: every wait polls a condition against a deadline, every socket has a
//! timeout, and the process is stopped (SIGTERM, then SIGKILL) when the harness is dropped.
//! Ports are handed out, never hard-coded, so tests run in parallel.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portcullis::tools::demo::{EchoServer, spawn_echo};

/// How long `portcullis run` may take to serve its first configuration (HAProxy start included),
/// with room for a busy 2-core machine running the tests in parallel.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a change may take to show, for waits that are not themselves the measurement.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(15);
/// Socket timeouts for every client here.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two polls.
const POLL_EVERY: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------------------------------
// Polling

/// Polls `condition` every 10 ms until it holds or `timeout` passes; panics naming `what` if it
/// never held. Returns how long it took.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    let max_polls = timeout.as_millis() / POLL_EVERY.as_millis() + 10;
    for _ in 0..max_polls {
        if condition() {
            return started.elapsed();
        }
        if started.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(POLL_EVERY);
    }
    panic!("timed out after {timeout:?} waiting until {what}");
}

/// Polls `probe` until it returns `Some`, or returns the last `None` after `timeout`.
pub fn poll<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    let max_polls = timeout.as_millis() / POLL_EVERY.as_millis() + 10;
    for _ in 0..max_polls {
        if let Some(v) = probe() {
            return Some(v);
        }
        if started.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(POLL_EVERY);
    }
    None
}

/// Checks that `condition` holds on every poll for the whole of `window` (something that must
/// not happen is given the time to happen).
pub fn holds_for(window: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    let max_polls = window.as_millis() / POLL_EVERY.as_millis() + 10;
    for _ in 0..max_polls {
        assert!(
            condition(),
            "{what} stopped holding after {:?}",
            started.elapsed()
        );
        if started.elapsed() >= window {
            return;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

// ---------------------------------------------------------------------------------------------
// Ports

/// Ports already handed out by this test process, so that two harnesses never share one.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback port that nothing listens on: bound on 127.0.0.1 and released, and never handed
/// out twice by this process.
///
/// Ports are taken below the kernel's ephemeral range when there is room for that: the echo
/// backends (bound to port 0) and every outgoing connection of the tests and of HAProxy take
/// their ports from the ephemeral range, so they can never grab a port between its release here
/// and HAProxy binding it. Otherwise the kernel picks (port 0).
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|w| w.parse::<u32>().ok())
        })
        .unwrap_or(0);
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    if low >= 12_000 {
        // Spread processes over the range; within one process, count up.
        let span = low - 10_000;
        let base = 10_000 + std::process::id().wrapping_mul(7919) % span;
        for _ in 0..2_000 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = u16::try_from(10_000 + (base - 10_000 + n) % span).unwrap_or(0);
            if port == 0 || handed.contains(&port) {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed.insert(port);
                return port;
            }
        }
    }
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        if handed.insert(port) {
            return port;
        }
    }
    panic!("no free loopback port found");
}

// ---------------------------------------------------------------------------------------------
// Manifests

/// A Service `name` in `ns` with one port, 80, named `http`, and these annotations.
pub fn service(ns: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    let mut out =
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n");
    if !annotations.is_empty() {
        out.push_str("  annotations:\n");
        for (k, v) in annotations {
            out.push_str(&format!("    {k}: {v:?}\n"));
        }
    }
    out.push_str("spec:\n  ports:\n    - {name: http, port: 80, targetPort: http}\n");
    out
}

/// One EndpointSlice per endpoint of Service `name` (a slice lists one port for all of its
/// endpoints, and every loopback echo server has its own port): `(slice suffix, port, ready)`.
pub fn endpoint_slices(ns: &str, name: &str, endpoints: &[(&str, u16, bool)]) -> String {
    let endpoints: Vec<(&str, u16, &str)> = endpoints
        .iter()
        .map(|(suffix, port, ready)| {
            let conditions = if *ready {
                "{ready: true}"
            } else {
                "{ready: false}"
            };
            (*suffix, *port, conditions)
        })
        .collect();
    endpoint_slices_with(ns, name, &endpoints)
}

/// Like [`endpoint_slices`], with each endpoint's `conditions` written out as YAML.
pub fn endpoint_slices_with(ns: &str, name: &str, endpoints: &[(&str, u16, &str)]) -> String {
    let mut docs = Vec::new();
    for (suffix, port, conditions) in endpoints {
        docs.push(format!(
            "apiVersion: discovery.k8s.io/v1\n\
             kind: EndpointSlice\n\
             metadata:\n  name: {name}-{suffix}\n  namespace: {ns}\n  \
             labels: {{kubernetes.io/service-name: {name}}}\n\
             addressType: IPv4\n\
             ports:\n  - {{name: http, port: {port}, protocol: TCP}}\n\
             endpoints:\n  - addresses: [\"127.0.0.1\"]\n    \
             conditions: {conditions}\n"
        ));
    }
    docs.join("---\n")
}

/// One path of an Ingress rule.
#[derive(Debug, Clone)]
pub struct Route<'a> {
    /// `None`: a rule without a host.
    pub host: Option<&'a str>,
    pub path: &'a str,
    /// `Exact`, `Prefix` or `ImplementationSpecific`.
    pub path_type: &'a str,
    pub service: &'a str,
}

/// Shorthand for a [`Route`].
pub fn route<'a>(
    host: Option<&'a str>,
    path: &'a str,
    path_type: &'a str,
    service: &'a str,
) -> Route<'a> {
    Route {
        host,
        path,
        path_type,
        service,
    }
}

/// An Ingress of class `portcullis`: one rule per host, in the order hosts first appear,
/// optionally a `spec.defaultBackend` and `spec.tls` entries `(secret, hosts)`.
/// The IngressClass `portcullis` of the default `--controller-class`, which the Ingresses of
/// [`ingress`] name.
pub const INGRESS_CLASS: &str = "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: portcullis\nspec:\n  controller: portcullis.io/ingress\n";

pub fn ingress(
    ns: &str,
    name: &str,
    routes: &[Route<'_>],
    default_backend: Option<&str>,
    tls: &[(&str, &[&str])],
) -> String {
    let mut out = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
         spec:\n  ingressClassName: portcullis\n"
    );
    if let Some(service) = default_backend {
        out.push_str(&format!(
            "  defaultBackend:\n    service: {{name: {service}, port: {{number: 80}}}}\n"
        ));
    }
    if !tls.is_empty() {
        out.push_str("  tls:\n");
        for (secret, hosts) in tls {
            out.push_str(&format!(
                "    - secretName: {secret}\n      hosts: {hosts:?}\n"
            ));
        }
    }
    let mut hosts: Vec<Option<&str>> = Vec::new();
    for r in routes {
        if !hosts.contains(&r.host) {
            hosts.push(r.host);
        }
    }
    if !hosts.is_empty() {
        out.push_str("  rules:\n");
    }
    for host in hosts {
        match host {
            Some(h) => out.push_str(&format!("    - host: {h:?}\n      http:\n")),
            None => out.push_str("    - http:\n"),
        }
        out.push_str("        paths:\n");
        for r in routes.iter().filter(|r| r.host == host) {
            out.push_str(&format!(
                "          - path: {:?}\n            pathType: {}\n            \
                 backend: {{service: {{name: {}, port: {{number: 80}}}}}}\n",
                r.path, r.path_type, r.service
            ));
        }
    }
    out
}

/// A `kubernetes.io/tls` Secret with PEM text in `stringData`.
pub fn tls_secret(ns: &str, name: &str, cert_pem: &str, key_pem: &str) -> String {
    let indent = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
         type: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(cert_pem),
        indent(key_pem)
    )
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Which echo backend answered (the first word of its body), or `status <n>`.
    pub fn who(&self) -> String {
        if self.status == 200 {
            self.body
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string()
        } else {
            format!("status {}", self.status)
        }
    }
}

/// The bytes of a request with `Connection: close` and `extra` header lines.
fn request_bytes(method: &str, host: &str, path: &str, extra: &[(&str, &str)]) -> String {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: portcullis-e2e\r\nConnection: close\r\n"
    );
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), read to the end.
pub fn http_get(addr: SocketAddr, host: &str, path: &str) -> std::io::Result<Answer> {
    http_get_with(addr, host, path, &[])
}

/// [`http_get`] with extra request headers.
pub fn http_get_with(
    addr: SocketAddr,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> std::io::Result<Answer> {
    http_request(addr, "GET", host, path, extra)
}

/// One request of `method` without a body, as [`http_get_with`] sends it.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let request = request_bytes(method, host, path, extra);
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unparsable answer: {:?}", String::from_utf8_lossy(&raw)),
        )
    })
}

fn parse_response(raw: &[u8]) -> Option<Answer> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Some(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    for _ in 0..100_000 {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size + 2..)?;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The master CLI

/// The master's line of `show proc`, and the workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub master_pid: u32,
    pub reloads: u64,
    pub failed: u64,
    /// Workers of the configuration in force.
    pub workers: Vec<u32>,
    /// Workers of earlier configurations that have not finished yet: until they are gone, a
    /// new connection may still be served with the previous configuration.
    pub old_workers: Vec<u32>,
}

/// Sends `command` to a master CLI or runtime API socket: write, half-close, read to the end
/// (the master CLI answers only after the half-close).
pub fn socket_command(path: &Path, command: &str) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(command.as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Parses `show proc` (2.6: `<pid> master <reloads> [failed: <n>] <uptime> <version>`, then
/// sections `# workers`, `# old workers`, `# programs`).
pub fn parse_show_proc(text: &str) -> Option<Proc> {
    let mut master = None;
    let mut workers = Vec::new();
    let mut old_workers = Vec::new();
    let mut old_section = false;
    for line in text.lines() {
        if let Some(section) = line.strip_prefix('#') {
            old_section = section.trim() == "old workers";
            continue;
        }
        let mut words = line.split_whitespace();
        let Some(pid) = words.next().and_then(|w| w.parse::<u32>().ok()) else {
            continue;
        };
        match words.next() {
            Some("master") => {
                let reloads = words.next()?.parse().ok()?;
                let failed = match line.split_once("[failed: ") {
                    Some((_, rest)) => rest.split(']').next()?.trim().parse().ok()?,
                    None => 0,
                };
                master = Some((pid, reloads, failed));
            }
            Some("worker") if old_section => old_workers.push(pid),
            Some("worker") => workers.push(pid),
            _ => {}
        }
    }
    let (master_pid, reloads, failed) = master?;
    Some(Proc {
        master_pid,
        reloads,
        failed,
        workers,
        old_workers,
    })
}

// ---------------------------------------------------------------------------------------------
// External commands

/// Runs `command` (stdin closed), killing it if it takes longer than `timeout`.
pub fn output_within(command: Command, timeout: Duration) -> Output {
    output_with_input(command, None, timeout)
}

/// Runs `command` with `input` on its stdin (or stdin closed), killing it if it takes longer
/// than `timeout`.
pub fn output_with_input(mut command: Command, input: Option<&[u8]>, timeout: Duration) -> Output {
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    let pid = child.id();
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // Small inputs: the pipe holds them; the child sees EOF when stdin is dropped.
        let _ = stdin.write_all(input);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.unwrap_or_else(|e| panic!("waiting for {command:?}: {e}")),
        Err(_) => {
            signal(pid, "KILL");
            panic!("{command:?} did not finish within {timeout:?}");
        }
    }
}

/// Sends a signal through kill(1) (the crate forbids `unsafe`, so no libc here).
pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Whether a process exists (and is not a zombie).
pub fn process_exists(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3, after the parenthesised command name, is the state; Z is a zombie.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// A self-signed EC certificate for `host`: `(certificate PEM, key PEM)`.
pub fn self_signed(dir: &Path, host: &str, tag: &str) -> (String, String) {
    let crt = dir.join(format!("{tag}.crt"));
    let key = dir.join(format!("{tag}.key"));
    let mut cmd = Command::new("openssl");
    cmd.args([
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
    ])
    .args(["-nodes", "-days", "2", "-subj"])
    .arg(format!("/CN={host}/O={tag}"))
    .arg("-addext")
    .arg(format!("subjectAltName=DNS:{host}"))
    .arg("-keyout")
    .arg(&key)
    .arg("-out")
    .arg(&crt);
    openssl(cmd);
    (
        std::fs::read_to_string(&crt).expect("reading the certificate"),
        std::fs::read_to_string(&key).expect("reading the key"),
    )
}

/// The files Portcullis wrote for Secret `ns/name` in `dir` (`certs`, `certs/ca`,
/// `certs/client`), relative to the configuration directory `config_dir`: names are
/// `<dir>/<ns>_<name>_<content hash>.pem`, so a rotation adds a file.
pub fn secret_files(config_dir: &Path, dir: &str, ns: &str, name: &str) -> Vec<String> {
    let prefix = format!("{ns}_{name}_");
    let mut files: Vec<String> = std::fs::read_dir(config_dir.join(dir))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|f| {
                    f.strip_prefix(&prefix)
                        .and_then(|rest| rest.strip_suffix(".pem"))
                        .is_some_and(|hash| {
                            hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())
                        })
                })
                .map(|f| format!("{dir}/{f}"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The one file Portcullis wrote for Secret `ns/name` in `dir` (see [`secret_files`]).
pub fn secret_file(config_dir: &Path, dir: &str, ns: &str, name: &str) -> String {
    match secret_files(config_dir, dir, ns, name).as_slice() {
        [one] => one.clone(),
        other => panic!("expected one file for Secret {ns}/{name} in {dir}, found {other:?}"),
    }
}

/// The SHA-256 fingerprint of the first certificate in `pem`, as `openssl x509` prints it.
pub fn fingerprint(_dir: &Path, pem: &str) -> String {
    use rustls::pki_types::pem::PemObject as _;
    use sha2::Digest as _;
    let der = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .expect("a certificate in the PEM text")
        .expect("a readable certificate");
    let digest = sha2::Sha256::digest(der.as_ref());
    let hex: Vec<String> = digest.iter().map(|b| format!("{b:02X}")).collect();
    format!("sha256 Fingerprint={}", hex.join(":"))
}

/// A GET through TLS on `127.0.0.1:port` with SNI `server_name` (by `openssl s_client`).
pub fn https_get(port: u16, server_name: &str, host: &str, path: &str) -> Option<Answer> {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-servername")
        .arg(server_name);
    let request = request_bytes("GET", host, path, &[]);
    let out = output_with_input(cmd, Some(request.as_bytes()), Duration::from_secs(10));
    parse_response(&out.stdout)
}

/// Inserts `lines` (indented YAML, each ending in a newline) into the `metadata` of a manifest
/// made by this module, after its `namespace:` line.
pub fn with_metadata(doc: &str, lines: &str) -> String {
    let at = doc.find("  namespace: ").expect("a namespace line");
    let end = at + doc[at..].find('\n').expect("a line end") + 1;
    format!("{}{lines}{}", &doc[..end], &doc[end..])
}

/// `doc` (a manifest made by this module) with these annotations in its metadata.
pub fn annotated(doc: &str, annotations: &[(&str, &str)]) -> String {
    if annotations.is_empty() {
        return doc.to_string();
    }
    let mut lines = String::from("  annotations:\n");
    for (k, v) in annotations {
        lines.push_str(&format!("    {k}: {v:?}\n"));
    }
    with_metadata(doc, &lines)
}

/// A Service `name` in `ns` with these annotations and one ready endpoint (an echo server
/// named `name`), and an Ingress `name` routing `host` `/` to it with these annotations.
pub fn annotated_site(
    h: &mut Harness,
    (ns, name, host): (&str, &str, &str),
    service_annotations: &[(&str, &str)],
    ingress_annotations: &[(&str, &str)],
) -> String {
    let port = h.echo(name);
    let ing = ingress(
        ns,
        name,
        &[route(Some(host), "/", "Prefix", name)],
        None,
        &[],
    );
    format!(
        "{}---\n{}---\n{}",
        service(ns, name, service_annotations),
        endpoint_slices(ns, name, &[("0", port, true)]),
        annotated(&ing, ingress_annotations),
    )
}

/// The certificate served on `127.0.0.1:port` for SNI `server_name`, as PEM, if a handshake
/// succeeded. An in-process TLS handshake (rustls, any certificate accepted): fast enough to
/// check every SNI after every step of a churn test.
pub fn served_certificate(port: u16, server_name: &str) -> Option<String> {
    let der = served_certificate_der(port, server_name)?;
    Some(pem_encode("CERTIFICATE", &der))
}

/// The leaf certificate (DER) served on `127.0.0.1:port` for SNI `server_name`.
pub fn served_certificate_der(port: u16, server_name: &str) -> Option<Vec<u8>> {
    served_certificate_der_from(None, port, server_name)
}

/// A TCP connection to `127.0.0.1:port` from `source` (another loopback address, to look
/// like another client), or from the default address.
pub fn connect_from(source: Option<std::net::IpAddr>, port: u16) -> Option<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(("127.0.0.1", port)).ok();
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .ok()?;
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        socket.bind(SocketAddr::new(source, 0)).ok()?;
        let connect = socket.connect(SocketAddr::from(([127, 0, 0, 1], port)));
        tokio::time::timeout(IO_TIMEOUT, connect).await.ok()?.ok()
    })?;
    let stream = stream.into_std().ok()?;
    stream.set_nonblocking(false).ok()?;
    Some(stream)
}

/// A GET to HAProxy's HTTP frontend on `127.0.0.1:port` from `source` (see [`connect_from`]);
/// `None` when the connection or the answer failed.
pub fn http_get_from(
    source: std::net::IpAddr,
    port: u16,
    host: &str,
    path: &str,
) -> Option<Answer> {
    let mut stream = connect_from(Some(source), port)?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
    stream
        .write_all(request_bytes("GET", host, path, &[]).as_bytes())
        .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    parse_response(&raw)
}

/// [`served_certificate_der`] for a client connecting from `source` (see [`connect_from`]).
pub fn served_certificate_der_from(
    source: Option<std::net::IpAddr>,
    port: u16,
    server_name: &str,
) -> Option<Vec<u8>> {
    use std::io::Write as _;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).ok()?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut sock = connect_from(source, port)?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    sock.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).ok()?;
    }
    let der = conn.peer_certificates()?.first()?.as_ref().to_vec();
    conn.send_close_notify();
    let _ = conn.complete_io(&mut sock);
    let _ = sock.flush();
    Some(der)
}

/// The TLS version a handshake with `127.0.0.1:port` (SNI `server_name`) settles on, the
/// client offering only `versions`; `None` when the handshake fails.
pub fn negotiated_version(
    port: u16,
    server_name: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Option<rustls::ProtocolVersion> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).ok()?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut sock = TcpStream::connect(("127.0.0.1", port)).ok()?;
    sock.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    sock.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).ok()?;
    }
    conn.protocol_version()
}

/// A verifier for tests that want to see which certificate is served, whatever it is.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Standard base64 with padding (for PEM bodies and `Authorization: Basic`).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// PEM text of one DER object.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = base64(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

// ---------------------------------------------------------------------------------------------
// The harness

/// A manifest directory, echo backends, and `portcullis run` on top of them.
#[derive(Debug)]
pub struct Harness {
    /// A short directory under /tmp (Unix socket paths are limited to about 100 bytes).
    root: tempfile::TempDir,
    pub http_port: u16,
    pub https_port: u16,
    pub admin_port: u16,
    child: Option<Child>,
    master_pid: Option<u32>,
    /// Read the cluster through this kubeconfig instead of the manifest directory.
    kubeconfig: Option<PathBuf>,
    echoes: Vec<EchoServer>,
    /// Runs the echo servers; dropped after them.
    rt: tokio::runtime::Runtime,
}

impl Harness {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("pc")
            .tempdir_in("/tmp")
            .expect("creating a directory under /tmp");
        for sub in ["manifests", "config", "run", "work"] {
            std::fs::create_dir(root.path().join(sub)).expect("creating a directory");
        }
        // The IngressClass the Ingresses of [`ingress`] name: without it they are not served.
        write_atomically(
            &root.path().join("manifests/00-ingressclass.yaml"),
            INGRESS_CLASS,
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime for the echo servers");
        Self {
            root,
            http_port: free_port(),
            https_port: free_port(),
            admin_port: free_port(),
            child: None,
            master_pid: None,
            kubeconfig: None,
            echoes: Vec::new(),
            rt,
        }
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Makes `run` read the cluster through `kubeconfig` instead of the manifest directory.
    pub fn use_kubeconfig(&mut self, kubeconfig: &Path) {
        self.kubeconfig = Some(kubeconfig.to_path_buf());
    }

    pub fn manifests(&self) -> PathBuf {
        self.root.path().join("manifests")
    }

    pub fn runtime_dir(&self) -> PathBuf {
        self.root.path().join("run")
    }

    pub fn config_dir(&self) -> PathBuf {
        self.root.path().join("config")
    }

    /// A scratch directory for the test's own files (certificates, templates).
    pub fn work(&self) -> PathBuf {
        self.root.path().join("work")
    }

    /// Writes a manifest atomically (a hidden temporary file, which the loader skips, then a
    /// rename), so the controller never reads half a file.
    pub fn write(&self, name: &str, content: &str) {
        write_atomically(&self.manifests().join(name), content);
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests().join(name)).expect("removing a manifest");
    }

    /// Starts an echo server named `name` on 127.0.0.1 and returns its port.
    pub fn echo(&mut self, name: &str) -> u16 {
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let server = self
            .rt
            .block_on(spawn_echo(name.to_string(), addr))
            .expect("starting an echo server");
        let port = server.addr.port();
        self.echoes.push(server);
        port
    }

    /// A Service `name` in `ns` with one ready endpoint, an echo server named `name`.
    pub fn backend(&mut self, ns: &str, name: &str) -> String {
        let port = self.echo(name);
        format!(
            "{}---\n{}",
            service(ns, name, &[]),
            endpoint_slices(ns, name, &[("0", port, true)])
        )
    }

    /// The `portcullis run` command line for this harness, plus `extra` flags.
    pub fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_portcullis"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PORTCULLIS_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("NO_COLOR", "1").env_remove("KUBECONFIG").arg("run");
        match &self.kubeconfig {
            Some(path) => cmd.arg("--kubeconfig").arg(path),
            None => cmd.arg("--manifests").arg(self.manifests()),
        };
        cmd.arg("--config-dir")
            .arg(self.config_dir())
            .arg("--runtime-dir")
            .arg(self.runtime_dir())
            .args(["--ipv4-bind-address", "127.0.0.1"])
            .arg("--http-bind-port")
            .arg(self.http_port.to_string())
            .arg("--https-bind-port")
            .arg(self.https_port.to_string())
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{}", self.admin_port))
            .args(["--sync-debounce", "50ms", "--log-level", "info"])
            .args(extra);
        cmd
    }

    /// Starts `portcullis run` (output to `portcullis.log`) and waits until `/readyz` says 200.
    pub fn start(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "already started");
        let log = File::create(self.log_path()).expect("creating the log file");
        let child = self
            .command(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cloning the log file"))
            .stderr(log)
            .spawn()
            .expect("starting portcullis run");
        self.child = Some(child);
        let started = Instant::now();
        let max_polls = START_TIMEOUT.as_millis() / 20 + 10;
        for _ in 0..max_polls {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "portcullis run exited during start-up with {status}:\n{}",
                    self.log()
                );
            }
            if self.readyz().is_some_and(|(status, _)| status == 200) {
                self.master_pid = self.try_show_proc().map(|p| p.master_pid);
                return;
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "portcullis run was not ready within {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("portcullis run was not ready:\n{}", self.log());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("started").id()
    }

    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("portcullis.log")
    }

    /// Everything `portcullis run` (and HAProxy through it) printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// A request through HAProxy's HTTP frontend; `None` if the connection failed.
    pub fn try_get(&self, host: &str, path: &str) -> Option<Answer> {
        http_get(
            SocketAddr::from(([127, 0, 0, 1], self.http_port)),
            host,
            path,
        )
        .ok()
    }

    /// A request through HAProxy's HTTP frontend.
    pub fn get(&self, host: &str, path: &str) -> Answer {
        http_get(
            SocketAddr::from(([127, 0, 0, 1], self.http_port)),
            host,
            path,
        )
        .unwrap_or_else(|e| panic!("GET http://{host}{path} failed: {e}\n{}", self.log()))
    }

    /// A request through HAProxy's HTTP frontend with extra request headers.
    pub fn get_with(&self, host: &str, path: &str, extra: &[(&str, &str)]) -> Answer {
        http_get_with(
            SocketAddr::from(([127, 0, 0, 1], self.http_port)),
            host,
            path,
            extra,
        )
        .unwrap_or_else(|e| panic!("GET http://{host}{path} failed: {e}\n{}", self.log()))
    }

    /// Which backend answers `host` + `path` (`status <n>` when it is not a 200).
    pub fn who(&self, host: &str, path: &str) -> String {
        self.get(host, path).who()
    }

    /// Who answers `requests` requests in a row, as a set.
    pub fn answering(&self, host: &str, path: &str, requests: usize) -> BTreeSet<String> {
        (0..requests).map(|_| self.who(host, path)).collect()
    }

    /// A GET on the admin endpoint: `(status, body)`.
    pub fn admin(&self, path: &str) -> Option<Answer> {
        http_get(
            SocketAddr::from(([127, 0, 0, 1], self.admin_port)),
            "127.0.0.1",
            path,
        )
        .ok()
    }

    /// `/readyz`: status and JSON.
    pub fn readyz(&self) -> Option<(u16, serde_json::Value)> {
        let answer = self.admin("/readyz")?;
        let json = serde_json::from_str(&answer.body).ok()?;
        Some((answer.status, json))
    }

    /// The value of one series of `/metrics`, e.g. `portcullis_applies_total{outcome="reload"}`.
    pub fn try_metric(&self, series: &str) -> Option<f64> {
        let text = self.admin("/metrics")?.body;
        text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    pub fn metric(&self, series: &str) -> f64 {
        self.try_metric(series).unwrap_or_else(|| {
            panic!(
                "no series {series} in /metrics:\n{}",
                self.admin("/metrics").map(|a| a.body).unwrap_or_default()
            )
        })
    }

    /// `show proc` on the master CLI, if it answers.
    pub fn try_show_proc(&self) -> Option<Proc> {
        let answer = socket_command(&self.runtime_dir().join("master.sock"), "show proc\n").ok()?;
        parse_show_proc(&answer)
    }

    /// `show proc`, retried for a moment (the master re-executes itself on reload).
    pub fn show_proc(&self) -> Proc {
        poll(Duration::from_secs(10), || self.try_show_proc())
            .unwrap_or_else(|| panic!("the master CLI did not answer `show proc`\n{}", self.log()))
    }

    /// The master's counters: `(reloads, failed reloads)`.
    pub fn reloads(&self) -> (u64, u64) {
        let p = self.show_proc();
        (p.reloads, p.failed)
    }

    /// Waits until no worker of an earlier configuration is left, so that every new connection
    /// is served with the configuration in force.
    pub fn wait_old_workers_gone(&self) {
        wait_until(APPLY_TIMEOUT, "the old HAProxy workers are gone", || {
            self.try_show_proc()
                .is_some_and(|p| p.old_workers.is_empty() && !p.workers.is_empty())
        });
    }

    /// A command on the runtime API (`admin.sock`).
    pub fn runtime(&self, command: &str) -> String {
        socket_command(&self.runtime_dir().join("admin.sock"), command)
            .unwrap_or_else(|e| panic!("runtime API {command:?}: {e}"))
    }

    /// Waits (at most `timeout`) for `portcullis run` to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_child(&mut self.child, timeout)
    }

    /// Sends SIGTERM and waits (at most `timeout`) for `portcullis run` to exit.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        signal(self.child.as_ref()?.id(), "TERM");
        self.wait_exit(timeout)
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        stop_run(&mut self.child, self.master_pid, Duration::from_secs(15));
        if std::thread::panicking() {
            eprintln!(
                "---- last lines of portcullis run ({}) ----\n{}",
                self.root.path().display(),
                log_tail(&self.log(), 60)
            );
        }
    }
}

/// Waits (at most `timeout`) for `child` to exit; takes it when it did.
pub fn wait_child(child: &mut Option<Child>, timeout: Duration) -> Option<ExitStatus> {
    let running = child.as_mut()?;
    let started = Instant::now();
    let max_polls = timeout.as_millis() / 20 + 10;
    for _ in 0..max_polls {
        if let Ok(Some(status)) = running.try_wait() {
            *child = None;
            return Some(status);
        }
        if started.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Stops a `portcullis run`: SIGTERM and a wait; if it does not exit, SIGKILL, and then its
/// HAProxy master (which it could no longer stop) too.
pub fn stop_run(child: &mut Option<Child>, master_pid: Option<u32>, timeout: Duration) {
    let Some(pid) = child.as_ref().map(Child::id) else {
        return;
    };
    signal(pid, "TERM");
    if wait_child(child, timeout).is_some() {
        return;
    }
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    if let Some(pid) = master_pid.filter(|p| process_exists(*p)) {
        signal(pid, "KILL");
    }
}

/// The last `lines` lines of a log, without HAProxy's access log lines, which would drown the
/// rest.
pub fn log_tail(log: &str, lines: usize) -> String {
    let tail: Vec<&str> = log
        .lines()
        .filter(|l| !l.contains(" HTTP/1.1\""))
        .rev()
        .take(lines)
        .collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Writes `path` through a hidden temporary file in the same directory and a rename.
pub fn write_atomically(path: &Path, content: &str) {
    let dir = path.parent().expect("a parent directory");
    std::fs::create_dir_all(dir).expect("creating a directory");
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a file name");
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, content).expect("writing a file");
    std::fs::rename(&tmp, path).expect("renaming a file into place");
}

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating a directory");
    for entry in std::fs::read_dir(from).expect("reading a directory") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copying a file");
        }
    }
}

/// Ingress `api`: host `api.example.com`, `/` to Service `api` (a backend of its own, so
/// adding it reloads HAProxy).
pub fn api_ingress(ns: &str) -> String {
    ingress(
        ns,
        "api",
        &[route(Some("api.example.com"), "/", "Prefix", "api")],
        None,
        &[],
    )
}

/// Service `web` (one echo pod named `web`) and Ingress `secure` routing `host` to it, with
/// TLS from the Secret `secret`; all in namespace `ns`.
pub fn write_tls_site(h: &mut Harness, ns: &str, host: &str, secret: &str) {
    let web = h.backend(ns, "web");
    h.write("web.yaml", &web);
    h.write(
        "ingress.yaml",
        &ingress(
            ns,
            "secure",
            &[route(Some(host), "/", "Prefix", "web")],
            None,
            &[(secret, &[host])],
        ),
    );
}

/// An `openssl s_server -www` "pod" on 127.0.0.1:`port` serving `cert` and `key`, with `extra`
/// arguments (`-servername NAME -cert2 … -key2 …` for a second certificate by SNI); killed
/// when dropped.
pub struct TlsPod(Child);

impl TlsPod {
    pub fn start(port: u16, cert: &Path, key: &Path) -> Self {
        Self::start_with(port, cert, key, &[])
    }

    pub fn start_with(port: u16, cert: &Path, key: &Path, extra: &[&std::ffi::OsStr]) -> Self {
        let child = Command::new("openssl")
            .args(["s_server", "-www", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(cert)
            .arg("-key")
            .arg(key)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting openssl s_server");
        let pod = Self(child);
        wait_until(Duration::from_secs(10), "s_server listens", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        pod
    }
}

impl Drop for TlsPod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A certificate for `name` signed by the CA: `(certificate path, key path, cert PEM, key PEM)`.
pub fn make_signed(
    dir: &Path,
    ca: &(PathBuf, PathBuf, String),
    name: &str,
    tag: &str,
) -> (PathBuf, PathBuf, String, String) {
    let (crt, key) = sign_with_ca(dir, ca, &format!("/CN={name}/O={tag}"), Some(name), tag);
    let cert_pem = std::fs::read_to_string(&crt).expect("reading what openssl wrote");
    let key_pem = std::fs::read_to_string(&key).expect("reading what openssl wrote");
    (crt, key, cert_pem, key_pem)
}

/// Runs an `openssl` command to its end within 20 s; fails the test with its stderr otherwise.
pub fn openssl(cmd: Command) {
    let out = output_within(cmd, Duration::from_secs(20));
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA in `dir` named by `subject` (`/CN=…`), made by `openssl req`: `(certificate path,
/// key path, certificate PEM)`.
pub fn make_ca(dir: &Path, tag: &str, subject: &str) -> (PathBuf, PathBuf, String) {
    let crt = dir.join(format!("{tag}-ca.crt"));
    let key = dir.join(format!("{tag}-ca.key"));
    let mut cmd = Command::new("openssl");
    cmd.args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args(["-nodes", "-days", "2", "-subj", subject])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt);
    openssl(cmd);
    let pem = std::fs::read_to_string(&crt).unwrap();
    (crt, key, pem)
}

/// A certificate signed by the CA `ca` (from [`make_ca`]) for `subject` (`/CN=…`), with a DNS
/// subjectAltName when `san` is given: `(certificate path, key path)`, named after `tag`.
pub fn sign_with_ca(
    dir: &Path,
    ca: &(PathBuf, PathBuf, String),
    subject: &str,
    san: Option<&str>,
    tag: &str,
) -> (PathBuf, PathBuf) {
    let crt = dir.join(format!("{tag}.crt"));
    let key = dir.join(format!("{tag}.key"));
    let csr = dir.join(format!("{tag}.csr"));
    let mut req = Command::new("openssl");
    req.args(["req", "-new", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args(["-nodes", "-subj", subject])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr);
    openssl(req);
    let mut sign = Command::new("openssl");
    sign.args(["x509", "-req", "-days", "2", "-in"])
        .arg(&csr)
        .arg("-CA")
        .arg(&ca.0)
        .arg("-CAkey")
        .arg(&ca.1)
        .arg("-CAcreateserial");
    if let Some(name) = san {
        let ext = dir.join(format!("{tag}.ext"));
        std::fs::write(&ext, format!("subjectAltName=DNS:{name}\n")).unwrap();
        sign.arg("-extfile").arg(&ext);
    }
    sign.arg("-out").arg(&crt);
    openssl(sign);
    (crt, key)
}

/// The GatewayClass of the Gateway API tests: ours, under the default controller name.
pub const GATEWAY_CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: portcullis
spec:
  controllerName: portcullis.io/gateway-controller
";
