//! End-to-end proof that replicas agree: two or three real `portcullis run` + HAProxy pairs on
//! distinct loopback addresses (127.0.0.2, .3, .4), each with its own manifest, config and
//! runtime directories, the same HTTP port and the same peers port, and Pod manifests that make
//! them pods of one Deployment. They must render the same configuration whatever order and
//! history their inputs came in, give every endpoint the same server name and id (whether the
//! server was written in haproxy.cfg or added at run time), share stick tables over the
//! HAProxy peers protocol, and follow peer membership with exactly one reload.
//!
//! Every loop is bounded in count and time; every port is handed out, never fixed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use portcullis::tools::demo::{EchoServer, spawn_echo};
use support::{
    APPLY_TIMEOUT, Answer, INGRESS_CLASS, Proc, START_TIMEOUT, free_port, holds_for, http_get,
    ingress, log_tail, parse_show_proc, poll, route, service, socket_command, stop_run, wait_until,
    with_metadata, write_atomically,
};

/// Namespace of the application objects.
const NS: &str = "shop";
/// Namespace of the controller's pods.
const POD_NS: &str = "ingress";
/// The ReplicaSet's pod-template-hash: pods are `portcullis-<RS>-<id>`.
const RS: &str = "7c9d8f5b6";
/// The persistent Service's backend.
const BACKEND: &str = "shop_web_80";
const HOST: &str = "sticky.example.com";
/// How long the peers protocol may take to connect and push an entry (HAProxy retries a
/// failed peer connection after about 5 s, so a peer that started later is seen late).
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Echo backends: one per loopback address, all on one port, so that EndpointSlices can group
// several endpoints under one port, as in a cluster.

#[derive(Debug)]
struct Echoes {
    servers: Vec<EchoServer>,
    port: u16,
    /// Runs the echo servers; dropped after them (field order).
    _rt: tokio::runtime::Runtime,
}

impl Echoes {
    /// `n` echo servers `echo-<i>` on `127.0.1.<i>:<port>`, i = 1..=n.
    fn start(n: u8) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime for the echo servers");
        for _ in 0..50 {
            let first = rt
                .block_on(spawn_echo(
                    "echo-1".to_string(),
                    SocketAddr::from(([127, 0, 1, 1], 0)),
                ))
                .expect("starting an echo server");
            let port = first.addr.port();
            let mut servers = vec![first];
            for i in 2..=n {
                match rt.block_on(spawn_echo(
                    format!("echo-{i}"),
                    SocketAddr::from(([127, 0, 1, i], port)),
                )) {
                    Ok(s) => servers.push(s),
                    Err(_) => break,
                }
            }
            if servers.len() == usize::from(n) {
                return Self {
                    servers,
                    port,
                    _rt: rt,
                };
            }
        }
        panic!("no port free on 127.0.1.1..{n} for the echo servers");
    }

    /// `(address, name)` of each echo server.
    fn endpoints(&self) -> Vec<(String, String)> {
        self.servers
            .iter()
            .map(|s| (s.addr.ip().to_string(), s.name.clone()))
            .collect()
    }

    fn name_of(&self, address: &str) -> Option<String> {
        self.servers
            .iter()
            .find(|s| s.addr.ip().to_string() == address)
            .map(|s| s.name.clone())
    }
}

// ---------------------------------------------------------------------------------------------
// Manifests

fn pod_name(id: &str) -> String {
    format!("portcullis-{RS}-{id}")
}

/// A running pod of the portcullis Deployment (through its ReplicaSet).
fn pod(id: &str, ip: Ipv4Addr) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {POD_NS}\n  \
         labels: {{app: portcullis, pod-template-hash: \"{RS}\"}}\n  \
         ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: portcullis-{RS}, \
         uid: 0d6c1f0e-rs, controller: true, blockOwnerDeletion: true}}]\n\
         spec:\n  containers: [{{name: controller, image: portcullis}}]\n\
         status: {{phase: Running, podIP: \"{ip}\", podIPs: [{{ip: \"{ip}\"}}]}}\n",
        name = pod_name(id)
    )
}

fn pods(list: &[(&str, Ipv4Addr)]) -> String {
    list.iter()
        .map(|(id, ip)| pod(id, *ip))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// One EndpointSlice of Service `svc` listing `addresses` (in this order) on `port`.
fn slice(svc: &str, name: &str, port: u16, addresses: &[&str]) -> String {
    let mut out = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  \
         namespace: {NS}\n  labels: {{kubernetes.io/service-name: {svc}}}\n\
         addressType: IPv4\nports:\n  - {{name: http, port: {port}, protocol: TCP}}\n\
         endpoints:\n"
    );
    if addresses.is_empty() {
        out.push_str("  []\n");
    }
    for a in addresses {
        out.push_str(&format!(
            "  - addresses: [\"{a}\"]\n    conditions: {{ready: true}}\n"
        ));
    }
    out
}

/// The persistent Service: source-ip-persistence on the Service, round robin.
fn web_service() -> String {
    service(
        NS,
        "web",
        &[
            ("haproxy.org/source-ip-persistence", "true"),
            ("haproxy.org/load-balance", "roundrobin"),
        ],
    )
}

fn web_ingress() -> String {
    ingress(
        NS,
        "web",
        &[route(Some(HOST), "/", "Prefix", "web")],
        None,
        &[],
    )
}

// ---------------------------------------------------------------------------------------------
// Ports

/// A port free on 127.0.0.1 (handed out once by `free_port`) and on every replica address.
fn free_replica_port() -> u16 {
    for _ in 0..200 {
        let port = free_port();
        let free_everywhere = [2u8, 3, 4]
            .iter()
            .all(|i| TcpListener::bind(SocketAddr::from(([127, 0, 0, *i], port))).is_ok());
        if free_everywhere {
            return port;
        }
    }
    panic!("no port free on 127.0.0.2-4");
}

/// Ports every replica of one test shares (each binds its own address).
#[derive(Debug, Clone, Copy)]
struct SharedPorts {
    http: u16,
    https: u16,
    peer: u16,
}

impl SharedPorts {
    fn new() -> Self {
        Self {
            http: free_replica_port(),
            https: free_replica_port(),
            peer: free_replica_port(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A replica: `portcullis run` with its own directories, address and pod identity.

#[derive(Debug)]
struct Replica {
    /// A short directory under /tmp (Unix socket paths are short).
    root: tempfile::TempDir,
    label: &'static str,
    ip: Ipv4Addr,
    pod: String,
    ports: SharedPorts,
    admin_port: u16,
    child: Option<Child>,
    master_pid: Option<u32>,
}

impl Replica {
    /// Directories for the replica `label` with pod `portcullis-<RS>-<id>` on `ip`.
    fn new(label: &'static str, id: &str, ip: Ipv4Addr, ports: SharedPorts) -> Self {
        let root = tempfile::Builder::new()
            .prefix("pp")
            .tempdir_in("/tmp")
            .expect("creating a directory under /tmp");
        for sub in ["m", "c", "r"] {
            std::fs::create_dir(root.path().join(sub)).expect("creating a directory");
        }
        // The IngressClass the Ingresses name: without it they are not served.
        write_atomically(&root.path().join("m/00-ingressclass.yaml"), INGRESS_CLASS);
        Self {
            root,
            label,
            ip,
            pod: pod_name(id),
            ports,
            admin_port: free_port(),
            child: None,
            master_pid: None,
        }
    }

    fn manifests(&self) -> PathBuf {
        self.root.path().join("m")
    }

    fn runtime_dir(&self) -> PathBuf {
        self.root.path().join("r")
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join("portcullis.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn write(&self, name: &str, content: &str) {
        write_atomically(&self.manifests().join(name), content);
    }

    fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests().join(name)).expect("removing a manifest");
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_portcullis"));
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("PORTCULLIS_") || k.starts_with("POD_") {
                cmd.env_remove(&key);
            }
        }
        cmd.env("NO_COLOR", "1")
            .arg("run")
            .arg("--manifests")
            .arg(self.manifests())
            .arg("--config-dir")
            .arg(self.root.path().join("c"))
            .arg("--runtime-dir")
            .arg(self.runtime_dir())
            .arg("--ipv4-bind-address")
            .arg(self.ip.to_string())
            .arg("--http-bind-port")
            .arg(self.ports.http.to_string())
            .arg("--https-bind-port")
            .arg(self.ports.https.to_string())
            .arg("--pod-name")
            .arg(&self.pod)
            .arg("--pod-namespace")
            .arg(POD_NS)
            .arg("--pod-ip")
            .arg(self.ip.to_string())
            .arg("--localpeer-port")
            .arg(self.ports.peer.to_string())
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{}", self.admin_port))
            .args(["--sync-debounce", "50ms", "--log-level", "info"]);
        cmd
    }

    /// Starts `portcullis run`, output to the log file; see [`Replica::wait_ready`].
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "already started");
        let log = File::create(self.log_path()).expect("creating the log file");
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cloning the log file"))
            .stderr(log)
            .spawn()
            .expect("starting portcullis run");
        self.child = Some(child);
    }

    /// Waits until `/readyz` says 200.
    fn wait_ready(&mut self) {
        let started = Instant::now();
        let max_polls = START_TIMEOUT.as_millis() / 20 + 10;
        for _ in 0..max_polls {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "replica {} exited during start-up with {status}:\n{}",
                    self.label,
                    self.log()
                );
            }
            if self.readyz().is_some_and(|(status, _)| status == 200) {
                self.master_pid = self.try_show_proc().map(|p| p.master_pid);
                return;
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "replica {} was not ready within {START_TIMEOUT:?}:\n{}",
                self.label,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("replica {} was not ready:\n{}", self.label, self.log());
    }

    fn admin(&self, path: &str) -> Option<Answer> {
        http_get(
            SocketAddr::from(([127, 0, 0, 1], self.admin_port)),
            "127.0.0.1",
            path,
        )
        .ok()
    }

    fn readyz(&self) -> Option<(u16, serde_json::Value)> {
        let answer = self.admin("/readyz")?;
        let json = serde_json::from_str(&answer.body).ok()?;
        Some((answer.status, json))
    }

    /// The haproxy.cfg in force (`/debug/config`).
    fn config(&self) -> String {
        poll(Duration::from_secs(10), || {
            self.admin("/debug/config").filter(|a| a.status == 200)
        })
        .map(|a| a.body)
        .unwrap_or_else(|| panic!("replica {}: no /debug/config", self.label))
    }

    fn try_show_proc(&self) -> Option<Proc> {
        let answer = socket_command(&self.runtime_dir().join("master.sock"), "show proc\n").ok()?;
        parse_show_proc(&answer)
    }

    fn show_proc(&self) -> Proc {
        poll(Duration::from_secs(10), || self.try_show_proc()).unwrap_or_else(|| {
            panic!(
                "replica {}: the master CLI did not answer `show proc`\n{}",
                self.label,
                self.log()
            )
        })
    }

    /// The master's reload counter.
    fn reloads(&self) -> u64 {
        self.show_proc().reloads
    }

    /// A runtime API command (`admin.sock`); `None` if the socket did not answer.
    fn try_runtime(&self, command: &str) -> Option<String> {
        socket_command(&self.runtime_dir().join("admin.sock"), command).ok()
    }

    fn runtime(&self, command: &str) -> String {
        poll(Duration::from_secs(10), || self.try_runtime(command)).unwrap_or_else(|| {
            panic!(
                "replica {}: runtime API {command:?} did not answer",
                self.label
            )
        })
    }

    /// `show servers state <backend>`: the servers HAProxy runs.
    fn servers_state(&self, backend: &str) -> Vec<ServerState> {
        parse_servers_state(&self.runtime(&format!("show servers state {backend}\n")))
    }

    /// `show table <backend>`: `key -> server_id`.
    fn table(&self, backend: &str) -> BTreeMap<String, u32> {
        parse_table(&self.runtime(&format!("show table {backend}\n")))
    }

    /// The flags of the peers section (`show peers`), if it has one.
    fn peers_flags(&self) -> Option<u32> {
        let text = self.try_runtime("show peers\n")?;
        let first = text.lines().find(|l| l.contains("id=localinstance"))?;
        let hex = first
            .split_whitespace()
            .find_map(|w| w.strip_prefix("flags=0x"))?;
        u32::from_str_radix(hex, 16).ok()
    }

    /// Waits until HAProxy's peers section finished its initial resync (flags 0x1: from the
    /// local peer, 0x2: from a remote one, or given up after its timeout). Until then HAProxy
    /// does not hand its tables to the process of a reload.
    fn wait_peers_resynced(&self) {
        wait_until(
            Duration::from_secs(20),
            &format!("replica {}: the peers resync is finished", self.label),
            || self.peers_flags().is_some_and(|f| f & 0x3 == 0x3),
        );
    }

    /// A request through this replica's HTTP frontend (`<ip>:<http>`), from 127.0.0.1.
    fn get(&self, host: &str, path: &str) -> Answer {
        let addr = SocketAddr::new(IpAddr::V4(self.ip), self.ports.http);
        http_get(addr, host, path).unwrap_or_else(|e| {
            panic!(
                "GET http://{host}{path} through replica {} ({addr}) failed: {e}\n{}",
                self.label,
                self.log()
            )
        })
    }

    fn who(&self, host: &str, path: &str) -> String {
        self.get(host, path).who()
    }

    /// Waits until HAProxy runs exactly the servers of the configuration in force (the
    /// configuration is applied, through the runtime API or a reload) and no old worker is
    /// left; returns the enabled servers `name -> address:port`.
    fn wait_applied(&self, backend: &str) -> BTreeMap<String, String> {
        let mut last = (BTreeMap::new(), BTreeMap::new());
        let settled = poll(APPLY_TIMEOUT, || {
            let wanted = config_servers(&self.config(), backend);
            let running = active_servers(&self.servers_state(backend));
            let no_old = self
                .try_show_proc()
                .is_some_and(|p| p.old_workers.is_empty() && !p.workers.is_empty());
            let same = wanted == running;
            last = (wanted.clone(), running);
            (same && no_old).then_some(wanted)
        });
        settled.unwrap_or_else(|| {
            panic!(
                "replica {}: HAProxy does not run the servers of /debug/config for {backend}\n\
                 wanted:  {:?}\nrunning: {:?}\n{}",
                self.label,
                last.0,
                last.1,
                self.log()
            )
        })
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        stop_run(&mut self.child, self.master_pid, Duration::from_secs(15));
        if std::thread::panicking() {
            eprintln!(
                "---- last lines of replica {} ({}) ----\n{}",
                self.label,
                self.root.path().display(),
                log_tail(&self.log(), 40)
            );
        }
    }
}

/// Starts the replicas together and waits until each is ready.
fn start_all(replicas: &mut [&mut Replica]) {
    for r in replicas.iter_mut() {
        r.spawn();
    }
    for r in replicas.iter_mut() {
        r.wait_ready();
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing what HAProxy and the controller show

/// One row of `show servers state`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServerState {
    id: u32,
    name: String,
    addr: String,
    port: u16,
    admin_state: u32,
}

impl ServerState {
    /// Not in maintenance: forced (0x01), inherited (0x02), from a resolver (0x20) or from a
    /// hostname (0x40). 0x04 (CMAINT) only remembers `disabled` in the configuration; it stays
    /// set after `set server state ready`.
    fn active(&self) -> bool {
        self.admin_state & 0x63 == 0
    }
}

/// Parses `show servers state` (format 1: a version line, a `# be_id be_name ...` header and
/// one row per server), columns found by name.
fn parse_servers_state(text: &str) -> Vec<ServerState> {
    let mut columns: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("# ") {
            columns = header.split_whitespace().collect();
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if columns.is_empty() || words.len() < columns.len().min(19) {
            continue;
        }
        let col = |name: &str| -> Option<&str> {
            let i = columns.iter().position(|c| *c == name)?;
            words.get(i).copied()
        };
        let (Some(id), Some(name), Some(addr), Some(admin), Some(port)) = (
            col("srv_id").and_then(|v| v.parse().ok()),
            col("srv_name"),
            col("srv_addr"),
            col("srv_admin_state").and_then(|v| v.parse().ok()),
            col("srv_port").and_then(|v| v.parse().ok()),
        ) else {
            continue;
        };
        out.push(ServerState {
            id,
            name: name.to_string(),
            addr: addr.to_string(),
            port,
            admin_state: admin,
        });
    }
    out
}

/// The active servers: `name -> address:port`.
fn active_servers(state: &[ServerState]) -> BTreeMap<String, String> {
    state
        .iter()
        .filter(|s| s.active())
        .map(|s| (s.name.clone(), format!("{}:{}", s.addr, s.port)))
        .collect()
}

/// The active servers with HAProxy's numeric id: `name -> (id, address:port)` (the peers
/// protocol replicates a stick entry's server by id).
fn active_servers_with_ids(state: &[ServerState]) -> BTreeMap<String, (u32, String)> {
    state
        .iter()
        .filter(|s| s.active())
        .map(|s| (s.name.clone(), (s.id, format!("{}:{}", s.addr, s.port))))
        .collect()
}

/// Parses `show table <name>`: `key -> server_id` for each entry that has one.
fn parse_table(text: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        if let (Some(key), Some(id)) = (field("key"), field("server_id")) {
            if let Ok(id) = id.parse() {
                out.insert(key, id);
            }
        }
    }
    out
}

/// The section of haproxy.cfg that starts with the line `header` (up to the next unindented
/// line), or `None`.
fn section(cfg: &str, header: &str) -> Option<String> {
    let mut lines = cfg.lines().skip_while(|l| *l != header);
    let first = lines.next()?;
    let mut out = vec![first];
    out.extend(lines.take_while(|l| l.is_empty() || l.starts_with(' ') || l.starts_with('\t')));
    while out.last().is_some_and(|l| l.trim().is_empty()) {
        out.pop();
    }
    Some(out.join("\n"))
}

/// The enabled servers of `backend` in haproxy.cfg: `name -> address:port`.
fn config_servers(cfg: &str, backend: &str) -> BTreeMap<String, String> {
    let Some(text) = section(cfg, &format!("backend {backend}")) else {
        return BTreeMap::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            if words.next() != Some("server") {
                return None;
            }
            let name = words.next()?;
            let addr = words.next()?;
            if words.any(|w| w == "disabled") {
                return None;
            }
            Some((name.to_string(), addr.to_string()))
        })
        .collect()
}

/// The peer lines of the peers section: `name -> address:port`.
fn peer_lines(cfg: &str) -> Vec<String> {
    section(cfg, "peers localinstance")
        .map(|s| {
            s.lines()
                .filter(|l| l.trim_start().starts_with("peer "))
                .map(|l| l.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// haproxy.cfg with what legitimately differs between two replicas on one machine replaced by
/// placeholders: the local peer name, the bind addresses and the runtime socket (each replica
/// has its own runtime directory here; in a cluster it is the same path in every pod).
fn normalized(cfg: &str, r: &Replica) -> String {
    let runtime = r.runtime_dir().display().to_string();
    cfg.lines()
        .map(|l| {
            let trimmed = l.trim_start();
            if trimmed == format!("localpeer {}", r.pod) {
                l.replace(&r.pod, "<self>")
            } else if trimmed.starts_with("bind ") {
                l.replace(&format!("{}:", r.ip), "<ip>:")
            } else if trimmed.starts_with("stats socket ") {
                l.replace(&runtime, "<runtime>")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines that differ between two texts (both ways), for failure messages.
fn line_diff(a: &str, b: &str) -> String {
    let la: BTreeSet<&str> = a.lines().collect();
    let lb: BTreeSet<&str> = b.lines().collect();
    let mut out = Vec::new();
    for l in la.difference(&lb) {
        out.push(format!("- {l}"));
    }
    for l in lb.difference(&la) {
        out.push(format!("+ {l}"));
    }
    if out.is_empty() && a != b {
        out.push("(same lines, different order or count)".to_string());
    }
    out.join("\n")
}

// ---------------------------------------------------------------------------------------------
// Test 1

/// Replicas A and B reach the same cluster through different files and histories, and render
/// byte-identical configurations (but for the local peer name, the bind addresses and the
/// runtime socket), and HAProxy on both runs the same SRV_n -> endpoint map.
#[test]
fn replicas_render_the_same() {
    let echoes = Echoes::start(8);
    let port = echoes.port;
    let addrs: Vec<String> = echoes.endpoints().into_iter().map(|(a, _)| a).collect();
    let a_ = |i: usize| addrs[i - 1].as_str();
    let ports = SharedPorts::new();
    let ip_a = Ipv4Addr::new(127, 0, 0, 2);
    let ip_b = Ipv4Addr::new(127, 0, 0, 3);
    let mut a = Replica::new("A", "aaaaa", ip_a, ports);
    let mut b = Replica::new("B", "bbbbb", ip_b, ports);

    // A: the final cluster, written plainly: one slice, sorted, everything in one file each.
    a.write("pods.yaml", &pods(&[("aaaaa", ip_a), ("bbbbb", ip_b)]));
    let all: Vec<&str> = (1..=8).map(a_).collect();
    a.write(
        "web.yaml",
        &format!(
            "{}---\n{}",
            web_service(),
            slice("web", "web-all", port, &all)
        ),
    );
    a.write("ingress.yaml", &web_ingress());

    // B: a different start (an extra temporary Service and its route, other endpoints,
    // one that never existed in A's cluster), pods in the other order and in separate files.
    b.write("pod-b.yaml", &pods(&[("bbbbb", ip_b)]));
    b.write("pod-a.yaml", &pods(&[("aaaaa", ip_a)]));
    // A third replica for a while, and a pod of another Deployment that is never a peer.
    b.write(
        "pod-t.yaml",
        &pods(&[("ttttt", Ipv4Addr::new(127, 0, 0, 5))]),
    );
    b.write(
        "other-pod.yaml",
        &pod("xxxxx", Ipv4Addr::new(127, 0, 0, 6))
            .replace(&format!("portcullis-{RS}"), "other-5f5f5f")
            .replace(&format!("\"{RS}\""), "\"5f5f5f\""),
    );
    b.write("web-service.yaml", &web_service());
    b.write(
        "web-slice-x.yaml",
        &slice("web", "web-x", port, &[a_(3), a_(1), "127.0.9.1", a_(2)]),
    );
    let temp_backend = format!(
        "{}---\n{}---\n{}",
        service(NS, "temp", &[("haproxy.org/load-balance", "leastconn")]),
        slice("temp", "temp-1", port, &[a_(7), a_(8)]),
        ingress(
            NS,
            "temp",
            &[route(Some("temp.example.com"), "/", "Prefix", "temp")],
            None,
            &[]
        )
    );
    b.write("temp.yaml", &temp_backend);
    b.write("ingress.yaml", &web_ingress());
    start_all(&mut [&mut a, &mut b]);

    let a_servers = a.wait_applied(BACKEND);
    let want: BTreeSet<String> = all.iter().map(|x| format!("{x}:{port}")).collect();
    assert_eq!(
        a_servers.values().cloned().collect::<BTreeSet<_>>(),
        want,
        "A serves every endpoint"
    );
    let b_start = b.config();
    assert!(b_start.contains("backend shop_temp_80"));
    assert_eq!(peer_lines(&b_start).len(), 3, "B starts with three peers");
    assert!(!b_start.contains("other-5f5f5f"));
    b.wait_applied(BACKEND);

    // B's history; each step is applied before the next.
    let dead: Vec<String> = (1..=40).map(|i| format!("127.0.9.{i}")).collect();
    let dead_refs: Vec<&str> = dead.iter().map(String::as_str).collect();
    // (what, files written, files removed, whether it reloads)
    type Step<'a> = (&'a str, Vec<(&'a str, String)>, Vec<&'a str>, bool);
    let steps: Vec<Step<'_>> = vec![
        (
            "endpoints added and one removed, split over two slices",
            vec![
                (
                    "web-slice-x.yaml",
                    slice("web", "web-x", port, &[a_(3), a_(1), a_(2), a_(5)]),
                ),
                (
                    "web-slice-y.yaml",
                    slice("web", "web-y", port, &[a_(6), a_(4)]),
                ),
            ],
            vec![],
            false,
        ),
        (
            "more endpoints than a former block of slots (46), added at run time",
            vec![(
                "web-slice-dead.yaml",
                slice("web", "web-dead", port, &dead_refs),
            )],
            vec![],
            false,
        ),
        (
            "the temporary Service, the third replica and the extra endpoints go",
            vec![],
            vec!["temp.yaml", "web-slice-dead.yaml", "pod-t.yaml"],
            true,
        ),
        (
            "one endpoint removed",
            vec![(
                "web-slice-x.yaml",
                slice("web", "web-x", port, &[a_(3), a_(5), a_(1)]),
            )],
            vec![],
            false,
        ),
        (
            "the final state: three slices, other names, other order",
            vec![
                (
                    "web-slice-z.yaml",
                    slice("web", "web-z", port, &[a_(8), a_(2), a_(7)]),
                ),
                (
                    "web-slice-x.yaml",
                    slice("web", "web-x", port, &[a_(5), a_(3), a_(1)]),
                ),
            ],
            vec![],
            false,
        ),
    ];
    let mut b_servers = BTreeMap::new();
    for (what, writes, removes, reloads) in &steps {
        let before = b.config();
        let reloads_before = b.reloads();
        for (file, content) in writes {
            b.write(file, content);
        }
        for file in removes {
            b.remove(file);
        }
        wait_until(APPLY_TIMEOUT, &format!("B takes in: {what}"), || {
            b.config() != before
        });
        b_servers = b.wait_applied(BACKEND);
        assert_eq!(
            b.reloads() > reloads_before,
            *reloads,
            "B after {what}: {} reloads, {reloads_before} before",
            b.reloads()
        );
    }
    assert_eq!(
        b_servers.values().cloned().collect::<BTreeSet<_>>(),
        want,
        "B serves every endpoint at the end"
    );

    // The configurations.
    let cfg_a = a.config();
    let cfg_b = b.config();
    for (r, cfg) in [(&a, &cfg_a), (&b, &cfg_b)] {
        assert!(
            cfg.contains(&format!("\n  localpeer {}\n", r.pod)),
            "replica {}: no `localpeer {}`:\n{cfg}",
            r.label,
            r.pod
        );
        assert!(
            cfg.contains(&format!("bind {}:{}", r.ip, ports.http)),
            "replica {}: no bind on its own address:\n{cfg}",
            r.label
        );
    }
    for header in [
        format!("backend {BACKEND}"),
        "peers localinstance".to_string(),
    ] {
        let sa = section(&cfg_a, &header).unwrap_or_else(|| panic!("A has no `{header}`"));
        let sb = section(&cfg_b, &header).unwrap_or_else(|| panic!("B has no `{header}`"));
        assert_eq!(
            sa,
            sb,
            "`{header}` differs between A and B:\n{}",
            line_diff(&sa, &sb)
        );
    }
    let backend = section(&cfg_a, &format!("backend {BACKEND}")).unwrap();
    assert!(
        backend.contains("\n  balance roundrobin\n")
            && backend.contains("\n  stick on src\n")
            && backend.contains("peers localinstance"),
        "persistence with round robin on peers:\n{backend}"
    );
    assert_eq!(
        peer_lines(&cfg_a),
        [
            format!("peer {} {ip_a}:{}", pod_name("aaaaa"), ports.peer),
            format!("peer {} {ip_b}:{}", pod_name("bbbbb"), ports.peer),
        ]
    );
    let (na, nb) = (normalized(&cfg_a, &a), normalized(&cfg_b, &b));
    assert!(
        na == nb,
        "A and B differ beyond localpeer, bind and the runtime socket:\n{}",
        line_diff(&na, &nb)
    );
    // Only those lines differ, and each of them does.
    let differing = line_diff(&cfg_a, &cfg_b);
    for l in differing.lines() {
        let l = &l[2..];
        let t = l.trim_start();
        assert!(
            t.starts_with("localpeer ") || t.starts_with("bind ") || t.starts_with("stats socket "),
            "unexpected differing line {l:?}"
        );
    }

    // What HAProxy runs.
    let sa = a.servers_state(BACKEND);
    let sb = b.servers_state(BACKEND);
    let (ma, mb) = (active_servers_with_ids(&sa), active_servers_with_ids(&sb));
    assert_eq!(ma.len(), 8, "A runs 8 servers: {sa:?}");
    assert_eq!(ma, mb, "SRV_n -> address:port differs between A and B");
    // Every server has the same HAProxy id on both (a stick entry names its server by id),
    // the id of its name, and only endpoints have servers: B's removed ones were drained and
    // deleted.
    let ids = |s: &[ServerState]| -> BTreeMap<String, u32> {
        s.iter().map(|x| (x.name.clone(), x.id)).collect()
    };
    let sb = poll(APPLY_TIMEOUT, || {
        let sb = b.servers_state(BACKEND);
        (sb.len() == 8).then_some(sb)
    })
    .unwrap_or_else(|| {
        panic!(
            "B still runs removed servers: {:?}",
            b.servers_state(BACKEND)
        )
    });
    assert_eq!(ids(&sa), ids(&sb));
    assert_eq!(sa.len(), 8, "only the endpoints' servers on A: {sa:?}");
    for s in &sa {
        assert_eq!(s.name, format!("SRV_{}", s.id), "{s:?}");
        let line = format!("server {} {}:{} id {}", s.name, s.addr, s.port, s.id);
        assert!(
            backend.lines().any(|l| l.trim() == line),
            "{s:?} not in:\n{backend}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Test 2

/// The final cluster of test 1 plus `plain`, the same endpoints without persistence.
fn write_cluster(r: &Replica, echoes: &Echoes, pod_list: &[(&str, Ipv4Addr)]) {
    let addrs: Vec<String> = echoes.endpoints().into_iter().map(|(a, _)| a).collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    write_cluster_with(r, echoes, pod_list, &refs);
}

/// [`write_cluster`] with the endpoints `refs` for both Services.
fn write_cluster_with(r: &Replica, echoes: &Echoes, pod_list: &[(&str, Ipv4Addr)], refs: &[&str]) {
    let refs = refs.to_vec();
    r.write("pods.yaml", &pods(pod_list));
    r.write(
        "web.yaml",
        &format!(
            "{}---\n{}---\n{}---\n{}",
            web_service(),
            slice("web", "web-all", echoes.port, &refs),
            service(NS, "plain", &[("haproxy.org/load-balance", "roundrobin")]),
            slice("plain", "plain-all", echoes.port, &refs),
        ),
    );
    r.write(
        "ingress.yaml",
        &ingress(
            NS,
            "web",
            &[
                route(Some(HOST), "/", "Prefix", "web"),
                route(Some("plain.example.com"), "/", "Prefix", "plain"),
            ],
            None,
            &[],
        ),
    );
}

/// A client's stick entry made through A is pushed to B with the same server id, and B sends
/// the same client to the same endpoint. A starts with every endpoint (its servers are lines
/// of haproxy.cfg); B starts with none and gets them at run time (`add server`), so the ids
/// agree across both ways a server comes to be.
#[test]
fn stick_tables_are_shared() {
    let echoes = Echoes::start(8);
    let ports = SharedPorts::new();
    let ip_a = Ipv4Addr::new(127, 0, 0, 2);
    let ip_b = Ipv4Addr::new(127, 0, 0, 3);
    let mut a = Replica::new("A", "aaaaa", ip_a, ports);
    let mut b = Replica::new("B", "bbbbb", ip_b, ports);
    let pod_list = [("aaaaa", ip_a), ("bbbbb", ip_b)];
    write_cluster(&a, &echoes, &pod_list);
    write_cluster_with(&b, &echoes, &pod_list, &[]);
    start_all(&mut [&mut a, &mut b]);
    a.wait_applied(BACKEND);
    let b_start = b.reloads();
    write_cluster(&b, &echoes, &pod_list);
    wait_until(APPLY_TIMEOUT, "B takes in the endpoints", || {
        config_servers(&b.config(), BACKEND).len() == 8
    });
    let b_servers = b.wait_applied(BACKEND);
    assert_eq!(b_servers.len(), 8, "B runs every endpoint: {b_servers:?}");
    assert_eq!(b.reloads(), b_start, "B's endpoints came without a reload");
    assert!(
        !b.config().contains("server-template"),
        "no pre-allocated slots"
    );
    assert!(a.table(BACKEND).is_empty() && b.table(BACKEND).is_empty());

    // Control: without persistence, round robin spreads the same client over the endpoints.
    let spread: BTreeSet<String> = (0..16).map(|_| b.who("plain.example.com", "/")).collect();
    assert!(
        spread.len() >= 4,
        "round robin without persistence spreads: {spread:?}"
    );

    // The first request through A picks a server and records it.
    let first = a.who(HOST, "/");
    assert!(first.starts_with("echo-"), "A answered {first}");
    let entry =
        poll(APPLY_TIMEOUT, || a.table(BACKEND).get("127.0.0.1").copied()).unwrap_or_else(|| {
            panic!(
                "no entry for 127.0.0.1 in A's table: {:?}",
                a.table(BACKEND)
            )
        });
    let state_a = a.servers_state(BACKEND);
    let by_id = state_a
        .iter()
        .find(|s| s.id == entry)
        .unwrap_or_else(|| panic!("server id {entry} not in A's servers: {state_a:?}"));
    assert_eq!(
        echoes.name_of(&by_id.addr).as_deref(),
        Some(first.as_str()),
        "A's entry names the server that answered"
    );

    // The peers protocol pushes it to B, with the same server id.
    let mut seen = BTreeMap::new();
    let synced = poll(SYNC_TIMEOUT, || {
        seen = b.table(BACKEND);
        seen.get("127.0.0.1").copied()
    });
    assert_eq!(
        synced,
        Some(entry),
        "B's table after {SYNC_TIMEOUT:?}: {seen:?}\nA's log:\n{}\nB's log:\n{}",
        a.log(),
        b.log()
    );

    let state_b = b.servers_state(BACKEND);
    let on_b = state_b.iter().find(|s| s.id == entry);
    assert_eq!(
        on_b.map(|s| (s.name.as_str(), s.addr.as_str(), s.port)),
        Some((by_id.name.as_str(), by_id.addr.as_str(), by_id.port)),
        "server id {entry} is the same endpoint on B as on A"
    );

    // The same client through B: always the same endpoint as through A.
    let mut answers = Vec::new();
    for i in 0..16 {
        let via = if i % 4 == 3 { &a } else { &b };
        answers.push((via.label, via.who(HOST, "/")));
    }
    assert!(
        answers.iter().all(|(_, who)| *who == first),
        "A sent 127.0.0.1 to {first}; then: {answers:?}"
    );
    assert_eq!(b.table(BACKEND).get("127.0.0.1"), Some(&entry));
}

// ---------------------------------------------------------------------------------------------
// Test 3

/// A Pod leaving the Deployment leaves the peers sections of the others, with one reload each,
/// and the shared stick table survives that reload; an endpoint change after that is a runtime
/// change.
#[test]
fn peer_membership_changes() {
    let echoes = Echoes::start(6);
    let ports = SharedPorts::new();
    let ip_a = Ipv4Addr::new(127, 0, 0, 2);
    let ip_b = Ipv4Addr::new(127, 0, 0, 3);
    let ip_c = Ipv4Addr::new(127, 0, 0, 4);
    let mut a = Replica::new("A", "aaaaa", ip_a, ports);
    let mut b = Replica::new("B", "bbbbb", ip_b, ports);
    let mut c = Replica::new("C", "ccccc", ip_c, ports);
    let all = [("aaaaa", ip_a), ("bbbbb", ip_b), ("ccccc", ip_c)];
    for r in [&a, &b, &c] {
        write_cluster(r, &echoes, &all);
    }
    start_all(&mut [&mut a, &mut b, &mut c]);
    let peer_line = |id: &str, ip: Ipv4Addr| format!("peer {} {ip}:{}", pod_name(id), ports.peer);
    let three = vec![
        peer_line("aaaaa", ip_a),
        peer_line("bbbbb", ip_b),
        peer_line("ccccc", ip_c),
    ];
    let mut before = Vec::new();
    for r in [&a, &b] {
        r.wait_applied(BACKEND);
        let cfg = r.config();
        assert_eq!(peer_lines(&cfg), three, "replica {}", r.label);
        before.push((cfg, r.reloads()));
    }
    assert_eq!(peer_lines(&c.config()), three, "replica C");
    // A client made sticky through A, known to B.
    let sticky = a.who(HOST, "/");
    let entry = poll(SYNC_TIMEOUT, || {
        let id = a.table(BACKEND).get("127.0.0.1").copied()?;
        (b.table(BACKEND).get("127.0.0.1") == Some(&id)).then_some(id)
    })
    .unwrap_or_else(|| {
        panic!(
            "the entry made through A did not reach B: A {:?}, B {:?}",
            a.table(BACKEND),
            b.table(BACKEND)
        )
    });
    // HAProxy hands its tables to the process of a reload only once its own initial resync is
    // over (at most 5 s after a cold start when no peer has anything to teach). Every replica
    // here started a moment ago; in a cluster they have been running for a while.
    for r in [&a, &b] {
        r.wait_peers_resynced();
    }

    // C's Pod goes from A's and B's cluster.
    for r in [&a, &b] {
        r.write("pods.yaml", &pods(&[("aaaaa", ip_a), ("bbbbb", ip_b)]));
    }
    let c_line = format!("  {}\n", peer_line("ccccc", ip_c));
    let mut after = Vec::new();
    for (r, (cfg_before, reloads_before)) in [&a, &b].into_iter().zip(&before) {
        wait_until(
            APPLY_TIMEOUT,
            &format!("replica {} drops C from its peers", r.label),
            || !r.config().contains(&c_line),
        );
        wait_until(
            APPLY_TIMEOUT,
            &format!("replica {} reloads", r.label),
            || {
                r.try_show_proc()
                    .is_some_and(|p| p.reloads > *reloads_before)
            },
        );
        r.wait_applied(BACKEND);
        let cfg = r.config();
        assert_eq!(
            cfg,
            cfg_before.replacen(&c_line, "", 1),
            "replica {}: the configuration changed beyond C's peer line:\n{}",
            r.label,
            line_diff(cfg_before, &cfg)
        );
        assert_eq!(
            peer_lines(&cfg),
            three[..2],
            "replica {}: peers without C",
            r.label
        );
        let peers = r.runtime("show peers\n");
        assert!(
            !peers.contains(&pod_name("ccccc")) && peers.contains(&pod_name("bbbbb")),
            "replica {}: HAProxy still knows C as a peer:\n{peers}",
            r.label
        );
        after.push(reloads_before + 1);
    }
    // Exactly one reload each, also a moment later.
    holds_for(
        Duration::from_millis(800),
        "one reload each on A and B",
        || [&a, &b].iter().zip(&after).all(|(r, n)| r.reloads() == *n),
    );

    // The reload kept the shared table, so the client keeps its server on both.
    for r in [&a, &b] {
        assert_eq!(
            r.table(BACKEND).get("127.0.0.1"),
            Some(&entry),
            "replica {}: the stick entry survives the peers reload",
            r.label
        );
        let seen: BTreeSet<String> = (0..6).map(|_| r.who(HOST, "/")).collect();
        assert_eq!(
            seen,
            BTreeSet::from([sticky.clone()]),
            "replica {} after the reload",
            r.label
        );
    }

    // An endpoint-only change: a runtime change on both, no reload.
    let addrs: Vec<String> = echoes.endpoints().into_iter().map(|(x, _)| x).collect();
    let fewer: Vec<&str> = addrs[..5].iter().map(String::as_str).collect();
    for r in [&a, &b] {
        r.write(
            "web.yaml",
            &format!(
                "{}---\n{}---\n{}---\n{}",
                web_service(),
                slice("web", "web-all", echoes.port, &fewer),
                service(NS, "plain", &[("haproxy.org/load-balance", "roundrobin")]),
                slice("plain", "plain-all", echoes.port, &fewer),
            ),
        );
    }
    for r in [&a, &b] {
        wait_until(
            APPLY_TIMEOUT,
            &format!("replica {} serves 5 endpoints", r.label),
            || config_servers(&r.config(), BACKEND).len() == 5,
        );
        let running = r.wait_applied(BACKEND);
        assert_eq!(running.len(), 5);
    }
    holds_for(
        Duration::from_millis(800),
        "no reload for an endpoint change",
        || [&a, &b].iter().zip(&after).all(|(r, n)| r.reloads() == *n),
    );
    let ma = active_servers_with_ids(&a.servers_state(BACKEND));
    let mb = active_servers_with_ids(&b.servers_state(BACKEND));
    assert_eq!(ma, mb, "A and B still agree on the slots");
}

// ---------------------------------------------------------------------------------------------
// Test 4

/// source-ip-persistence set only on an Ingress is ignored, with a warning; on the Service it
/// works on the same replica.
#[test]
fn ingress_only_persistence_is_ignored() {
    let echoes = Echoes::start(2);
    let ports = SharedPorts::new();
    let ip_a = Ipv4Addr::new(127, 0, 0, 2);
    let mut a = Replica::new("A", "aaaaa", ip_a, ports);
    let addrs: Vec<String> = echoes.endpoints().into_iter().map(|(x, _)| x).collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    a.write("pods.yaml", &pods(&[("aaaaa", ip_a)]));
    a.write(
        "services.yaml",
        &format!(
            "{}---\n{}---\n{}---\n{}",
            service(NS, "plain", &[]),
            slice("plain", "plain-1", echoes.port, &refs),
            web_service(),
            slice("web", "web-1", echoes.port, &refs),
        ),
    );
    a.write(
        "ingress.yaml",
        &with_metadata(
            &ingress(
                NS,
                "shop",
                &[
                    route(Some("plain.example.com"), "/", "Prefix", "plain"),
                    route(Some(HOST), "/", "Prefix", "web"),
                ],
                None,
                &[],
            ),
            "  annotations:\n    haproxy.org/source-ip-persistence: \"true\"\n    \
             haproxy.org/source-ip-persistence-size: 10k\n",
        ),
    );
    start_all(&mut [&mut a]);
    a.wait_applied("shop_plain_80");
    let cfg = a.config();
    let plain = section(&cfg, "backend shop_plain_80").expect("the plain backend");
    assert!(
        !plain.contains("stick"),
        "persistence set only on the Ingress must not reach the backend:\n{plain}"
    );
    let web = section(&cfg, &format!("backend {BACKEND}")).expect("the web backend");
    assert!(
        web.contains("\n  stick on src\n")
            && web.contains("stick-table type ip size 1m expire 1800000 peers localinstance"),
        "persistence on the Service works, and the Ingress' size is not taken:\n{web}"
    );
    assert_eq!(
        peer_lines(&cfg),
        [format!("peer {} {ip_a}:{}", pod_name("aaaaa"), ports.peer)]
    );
    let diagnostics = a
        .readyz()
        .and_then(|(_, j)| j["diagnostics"].as_u64())
        .unwrap_or(0);
    assert!(diagnostics > 0, "/readyz reports the ignored annotation");
    wait_until(Duration::from_secs(5), "the warning is logged", || {
        a.log().lines().any(|l| {
            l.contains("Ingress shop/shop")
                && l.contains("ignored: source-ip-persistence is read from the Service")
        })
    });
    // HAProxy agrees: the plain backend has no table and its requests spread.
    let tables = a.runtime("show table\n");
    assert!(
        tables.contains(&format!("# table: {BACKEND},")) && !tables.contains("shop_plain_80"),
        "tables in HAProxy:\n{tables}"
    );
    let seen: BTreeSet<String> = (0..6).map(|_| a.who("plain.example.com", "/")).collect();
    assert_eq!(seen.len(), 2, "round robin over both endpoints: {seen:?}");
}

#[test]
fn parsers() {
    let state = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state \
                 srv_uweight srv_iweight srv_time_since_last_change srv_check_status \
                 srv_check_result srv_check_health srv_check_state srv_agent_state \
                 bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl \
                 srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
                 3 shop_web_80 1 SRV_1 127.0.1.3 2 0 1 1 4 6 3 4 6 0 0 0 - 41000 - 0 0 - - 0\n\
                 3 shop_web_80 2 SRV_2 127.0.0.1 0 1 1 1 4 1 0 0 14 0 0 0 - 1 - 0 0 - - 0\n";
    let parsed = parse_servers_state(state);
    assert_eq!(parsed.len(), 2);
    assert_eq!(
        active_servers(&parsed),
        BTreeMap::from([("SRV_1".to_string(), "127.0.1.3:41000".to_string())])
    );
    let table = "# table: shop_web_80, type: ip, size:1048576, used:1\n\
                 0x55d0c8a0: key=127.0.0.1 use=0 exp=1799000 server_id=3 server_key=SRV_3\n";
    assert_eq!(
        parse_table(table),
        BTreeMap::from([("127.0.0.1".to_string(), 3)])
    );
    let cfg = "global\n  a\n\npeers localinstance\n  peer x 1.2.3.4:5\n\nbackend b\n  \
               server SRV_1 1.1.1.1:80\n  server SRV_2 127.0.0.1:1 disabled\n";
    assert_eq!(peer_lines(cfg), ["peer x 1.2.3.4:5"]);
    assert_eq!(config_servers(cfg, "b").len(), 1);
}
