//! Stand-in backends for the quickstart: tiny HTTP echo servers on loopback addresses.
//!
//! The quickstart manifests (`deploy/examples/quickstart`) list EndpointSlices whose endpoints
//! are `127.0.0.1` on high ports. [`spawn_demo_backends`] starts one [`EchoServer`] on each
//! such address, so that HAProxy, driven by Portcullis, has real pods to send traffic to.
//!
//! An echo server answers every request with `200 OK` and a plain-text body saying which
//! "pod" answered and what it received, including every `X-` header, so that a newcomer (or a
//! test) can see what HAProxy forwarded and added:
//!
//! ```text
//! web-7c9f8d6b5-x2k4p GET /search?q=1 host=demo.localhost
//! x-forwarded-for: 127.0.0.1
//! ```
//!
//! It speaks just enough HTTP/1.x for that: one request per connection, request bodies are
//! ignored, anything malformed gets `400 Bad Request`. It is not a general-purpose server.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::objects::Object;

/// The request line and headers must fit in this many bytes.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client has to send the request line and headers.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// After answering, how long unread request bytes (a body) are drained before closing, so that
/// closing does not reset the connection under the client before it read the answer.
const LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// At most this many bytes are drained after answering.
const LINGER_MAX: usize = 1024 * 1024;
/// Pause after a failed `accept` (such as too many open files), so as not to spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running echo server. It stops when dropped, or with [`EchoServer::stop`].
#[derive(Debug)]
pub struct EchoServer {
    /// The address it listens on (the real port when asked for port 0).
    pub addr: SocketAddr,
    /// The name it answers with (`X-Served-By` and the first word of the body).
    pub name: String,
    task: JoinHandle<()>,
}

impl EchoServer {
    /// Stops accepting, ends open connections, and returns once the listening socket is
    /// closed (so the port can be bound again).
    pub async fn stop(mut self) {
        self.task.abort();
        // The task was aborted: the only outcome is a cancellation, nothing to report.
        let _ = (&mut self.task).await;
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` and serves echo answers signed `name` until the returned server is dropped
/// or stopped. Fails if the address cannot be bound, or if `name` is empty or holds control
/// characters (it goes into a header).
pub async fn spawn_echo(name: String, addr: SocketAddr) -> std::io::Result<EchoServer> {
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("echo server name {name:?} is empty or holds control characters"),
        ));
    }
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(serve(listener, Arc::from(name.as_str())));
    tracing::debug!(%addr, %name, "echo server listening");
    Ok(EchoServer { addr, name, task })
}

/// Every loopback endpoint address (127.0.0.0/8, ::1) of the EndpointSlices among `objects`,
/// with each port of its slice. Each is named after the endpoint's `targetRef.name` (the pod),
/// or else `<service>-<n>`, the service taken from the slice's `kubernetes.io/service-name`
/// label (the slice name without one) and `n` counting that service's endpoints from 1.
///
/// One entry per address, since one address can only be served once; when endpoints share an
/// address, a pod name is preferred over a made-up one, then the smaller name. Sorted by name,
/// then address.
pub fn loopback_endpoints(objects: &[Object]) -> Vec<(String, SocketAddr)> {
    // Per address: whether the name was made up (pod names are preferred), and the name.
    let mut by_addr: BTreeMap<SocketAddr, (bool, String)> = BTreeMap::new();
    let mut counters: BTreeMap<String, usize> = BTreeMap::new();
    for object in objects {
        let Object::EndpointSlice(slice) = object else {
            continue;
        };
        if !slice.address_type.is_ip() {
            continue;
        }
        let ports: Vec<u16> = slice
            .ports
            .iter()
            .filter_map(|p| p.port)
            .filter_map(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
            .collect();
        let service = slice
            .service
            .as_ref()
            .or(slice.metadata.name.as_ref())
            .cloned()
            .unwrap_or_default();
        for endpoint in &slice.endpoints {
            let counter = counters.entry(service.clone()).or_default();
            *counter += 1;
            let pod = endpoint
                .target
                .as_deref()
                .filter(|n| !n.is_empty() && !n.chars().any(char::is_control))
                .map(str::to_string);
            let candidate = match pod {
                Some(pod) => (false, pod),
                None => (true, format!("{service}-{counter}")),
            };
            if let Some(ip) = endpoint.address.filter(IpAddr::is_loopback) {
                for port in &ports {
                    let addr = SocketAddr::new(ip, *port);
                    let kept = by_addr.entry(addr).or_insert_with(|| candidate.clone());
                    if candidate < *kept {
                        kept.clone_from(&candidate);
                    }
                }
            }
        }
    }
    let mut endpoints: Vec<(String, SocketAddr)> = by_addr
        .into_iter()
        .map(|(addr, (_, name))| (name, addr))
        .collect();
    endpoints.sort();
    endpoints
}

/// Starts an echo server on every address [`loopback_endpoints`] finds. If one cannot be
/// started, those already started are stopped and the error names the endpoint.
pub async fn spawn_demo_backends(objects: &[Object]) -> std::io::Result<Vec<EchoServer>> {
    let mut servers = Vec::new();
    for (name, addr) in loopback_endpoints(objects) {
        let server = spawn_echo(name.clone(), addr).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("echo server {name} on {addr}: {e}"))
        })?;
        servers.push(server);
    }
    Ok(servers)
}

/// Accepts connections, each served in its own task. The tasks live in a [`JoinSet`] owned by
/// this future, so aborting the server ends them too.
async fn serve(listener: TcpListener, name: Arc<str>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(connection(stream, peer, Arc::clone(&name)));
                }
                Err(e) => {
                    tracing::warn!(server = %name, error = %e, "echo server cannot accept");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn connection(mut stream: TcpStream, peer: SocketAddr, name: Arc<str>) {
    if let Err(e) = exchange(&mut stream, &name).await {
        tracing::debug!(server = %name, %peer, error = %e, "echo connection ended");
    }
}

/// Reads one request head, writes one answer, then closes gracefully.
async fn exchange<S>(stream: &mut S, name: &str) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let answer = match tokio::time::timeout(HEAD_TIMEOUT, read_head(stream)).await {
        // Connected and closed without a word: a TCP health check.
        Ok(Ok(Head::Empty)) => return Ok(()),
        Ok(Ok(Head::Complete(head))) => match parse_head(&head) {
            Ok(request) => echo_response(name, &request),
            Err(reason) => error_response(name, 400, "Bad Request", reason),
        },
        Ok(Ok(Head::Incomplete)) => {
            error_response(name, 400, "Bad Request", "the request head ended early")
        }
        Ok(Ok(Head::TooLarge)) => error_response(
            name,
            400,
            "Bad Request",
            "the request head is larger than 16 KiB",
        ),
        Ok(Err(e)) => return Err(e),
        Err(_) => error_response(name, 408, "Request Timeout", "no complete request head"),
    };
    stream.write_all(&answer).await?;
    stream.flush().await?;
    stream.shutdown().await?;
    // Drain what the client still sends (a body we ignore) so that closing does not turn into
    // a reset that could destroy the answer before the client reads it.
    let _ = tokio::time::timeout(LINGER_TIMEOUT, drain(stream)).await;
    Ok(())
}

async fn drain<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    let mut total = 0usize;
    while total < LINGER_MAX {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n;
    }
    Ok(())
}

/// What arrived before the blank line ending the head.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// The client closed without sending anything.
    Empty,
    /// The request line and headers, up to and including the blank line.
    Complete(Vec<u8>),
    /// The client closed in the middle of the head.
    Incomplete,
    /// No blank line within [`MAX_HEAD`] bytes.
    TooLarge,
}

async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Head> {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(if buf.iter().all(|b| matches!(b, b'\r' | b'\n')) {
                Head::Empty
            } else {
                Head::Incomplete
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        // Empty lines before the request line are ignored (RFC 9112, section 2.2).
        let start = buf
            .iter()
            .position(|b| !matches!(b, b'\r' | b'\n'))
            .unwrap_or(buf.len());
        if let Some(end) = head_end(&buf[start..]) {
            if end > MAX_HEAD {
                return Ok(Head::TooLarge);
            }
            return Ok(Head::Complete(buf[start..start + end].to_vec()));
        }
        if buf.len() - start > MAX_HEAD {
            return Ok(Head::TooLarge);
        }
    }
}

/// The length of the head including the blank line that ends it (CRLF or bare LF endings).
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.iter().enumerate().find_map(|(i, b)| {
        if *b != b'\n' {
            return None;
        }
        let rest = &buf[i + 1..];
        if rest.starts_with(b"\r\n") {
            Some(i + 3)
        } else if rest.starts_with(b"\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// What the echo body reports about a request.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    target: String,
    host: String,
    /// `X-` headers: lowercased name and value, sorted by name, repeated headers in order.
    x_headers: Vec<(String, String)>,
}

fn parse_head(head: &[u8]) -> Result<Request, &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.is_empty());
    let request_line = lines.next().ok_or("no request line")?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the request line is not METHOD TARGET VERSION");
    };
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return Err("bad method");
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic() || b >= 0x80) {
        return Err("bad request target");
    }
    let minor = version.strip_prefix("HTTP/1.").ok_or("not HTTP/1.x")?;
    if minor.len() != 1 || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not HTTP/1.x");
    }
    let mut host: Option<String> = None;
    let mut x_headers = Vec::new();
    for line in lines {
        if line.starts_with([' ', '\t']) {
            return Err("folded header lines are not accepted");
        }
        let (field, value) = line.split_once(':').ok_or("a header line has no ':'")?;
        if field.is_empty() || !field.bytes().all(is_token_byte) {
            return Err("bad header name");
        }
        let value = value.trim_matches([' ', '\t']);
        if value.chars().any(|c| c.is_control() && c != '\t') {
            return Err("control character in a header value");
        }
        let field = field.to_ascii_lowercase();
        if field == "host" {
            if host.is_some() {
                return Err("more than one Host header");
            }
            host = Some(value.to_string());
        } else if field.starts_with("x-") {
            x_headers.push((field, value.to_string()));
        }
    }
    // Stable: repeated headers keep the order they came in.
    x_headers.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Request {
        method: method.to_string(),
        target: target.to_string(),
        host: host.unwrap_or_default(),
        x_headers,
    })
}

/// tchar (RFC 9110, section 5.6.2).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn echo_response(name: &str, request: &Request) -> Vec<u8> {
    let mut body = format!(
        "{name} {} {} host={}\n",
        request.method, request.target, request.host
    );
    for (field, value) in &request.x_headers {
        body.push_str(field);
        body.push_str(": ");
        body.push_str(value);
        body.push('\n');
    }
    let head_only = request.method == "HEAD";
    response(name, 200, "OK", &body, head_only)
}

fn error_response(name: &str, status: u16, reason: &str, detail: &str) -> Vec<u8> {
    let body = format!("{name} {status} {reason}: {detail}\n");
    response(name, status, reason, &body, false)
}

fn response(name: &str, status: u16, reason: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\n\
         Content-Type: text/plain\r\n\
         Content-Length: {}\r\n\
         Connection: close\r\n\
         X-Served-By: {name}\r\n\
         \r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    async fn echo(name: &str) -> EchoServer {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        spawn_echo(name.to_string(), addr).await.unwrap()
    }

    /// Sends `request`, then reads until the server closes.
    async fn send(addr: SocketAddr, request: &[u8]) -> String {
        tokio::time::timeout(WAIT, async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(request).await.unwrap();
            let mut out = Vec::new();
            stream.read_to_end(&mut out).await.unwrap();
            String::from_utf8(out).unwrap()
        })
        .await
        .expect("the echo server answered in time")
    }

    fn status_line(response: &str) -> &str {
        response.split("\r\n").next().unwrap()
    }

    #[tokio::test]
    async fn echoes_request_line_host_and_x_headers() {
        let server = echo("web-1").await;
        let response = send(
            server.addr,
            b"GET /api/users?page=2&q=a%20b HTTP/1.1\r\n\
              Host: demo.localhost\r\n\
              User-Agent: test\r\n\
              X-Forwarded-Proto: http\r\n\
              x-forwarded-for:  10.0.0.1 \r\n\
              X-B: second\r\n\
              X-A: first\r\n\
              X-B: third\r\n\
              Accept: */*\r\n\r\n",
        )
        .await;
        let body = "web-1 GET /api/users?page=2&q=a%20b host=demo.localhost\n\
                    x-a: first\n\
                    x-b: second\n\
                    x-b: third\n\
                    x-forwarded-for: 10.0.0.1\n\
                    x-forwarded-proto: http\n";
        let expected = format!(
            "HTTP/1.1 200 OK\r\n\
             Content-Type: text/plain\r\n\
             Content-Length: {}\r\n\
             Connection: close\r\n\
             X-Served-By: web-1\r\n\
             \r\n{body}",
            body.len()
        );
        assert_eq!(response, expected);
    }

    #[tokio::test]
    async fn head_gets_headers_only_and_bodies_are_ignored() {
        let server = echo("api-1").await;
        let response = send(server.addr, b"HEAD / HTTP/1.0\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.contains("Content-Length: 19\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\n"), "{response}");

        let body = vec![b'z'; 200_000];
        let mut request =
            b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 200000\r\n\r\n".to_vec();
        request.extend_from_slice(&body);
        let response = send(server.addr, &request).await;
        assert!(
            response.ends_with("\r\n\r\napi-1 POST /upload host=h\n"),
            "{response}"
        );
    }

    #[tokio::test]
    async fn health_check_connections_do_not_disturb_the_server() {
        let server = echo("admin-1").await;
        tokio::time::timeout(WAIT, async {
            // Connect and close at once, as HAProxy's TCP check does.
            drop(TcpStream::connect(server.addr).await.unwrap());
            // Connect, half-close, and expect the server to close without a word.
            let mut stream = TcpStream::connect(server.addr).await.unwrap();
            stream.shutdown().await.unwrap();
            let mut out = Vec::new();
            stream.read_to_end(&mut out).await.unwrap();
            assert!(out.is_empty(), "{out:?}");
        })
        .await
        .unwrap();
        let response = send(server.addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            response.ends_with("\r\n\r\nadmin-1 GET /healthz host=x\n"),
            "{response}"
        );
    }

    #[tokio::test]
    async fn bad_requests_get_400() {
        let server = echo("web-2").await;
        let too_large = {
            let mut r = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
            r.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
            r.extend_from_slice(b"\r\n\r\n");
            r
        };
        let cases: Vec<Vec<u8>> = vec![
            b"hello\r\n\r\n".to_vec(),
            b"GET /\r\n\r\n".to_vec(),
            b"GET / HTTP/2.0\r\n\r\n".to_vec(),
            b"GET  / HTTP/1.1\r\n\r\n".to_vec(),
            b"G(T / HTTP/1.1\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nno colon here\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nX-A: 1\r\n  folded\r\n\r\n".to_vec(),
            b"GET / HTTP/1.1\r\nX-A: \x01\r\n\r\n".to_vec(),
            b"GET /\xff HTTP/1.1\r\n\r\n".to_vec(),
            b"\x00\x01\x02\r\n\r\n".to_vec(),
            too_large,
        ];
        for request in cases {
            let response = send(server.addr, &request).await;
            assert_eq!(
                status_line(&response),
                "HTTP/1.1 400 Bad Request",
                "{:?}",
                String::from_utf8_lossy(&request[..request.len().min(60)])
            );
            assert!(response.contains("X-Served-By: web-2\r\n"), "{response}");
        }
        // A head cut short by the client closing its side.
        let response = tokio::time::timeout(WAIT, async {
            let mut stream = TcpStream::connect(server.addr).await.unwrap();
            stream.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
            stream.shutdown().await.unwrap();
            let mut out = String::new();
            stream.read_to_string(&mut out).await.unwrap();
            out
        })
        .await
        .unwrap();
        assert_eq!(status_line(&response), "HTTP/1.1 400 Bad Request");
        // The server still answers good requests afterwards.
        let response = send(server.addr, b"\r\nGET / HTTP/1.1\nHost: ok\n\n").await;
        assert!(response.ends_with("web-2 GET / host=ok\n"), "{response}");
    }

    #[tokio::test]
    async fn names_that_would_break_the_header_are_refused() {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for name in ["", "a\r\nX-Evil: 1"] {
            let err = spawn_echo(name.to_string(), addr).await.unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        }
    }

    #[tokio::test]
    async fn stop_releases_the_port() {
        let server = echo("web-3").await;
        let addr = server.addr;
        server.stop().await;
        let again = spawn_echo("web-3".to_string(), addr).await.unwrap();
        let response = send(again.addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(response.ends_with("web-3 GET / host=\n"), "{response}");
    }

    fn objects(yaml: &str) -> Vec<Object> {
        serde_saphyr::from_multiple_with_options::<serde_json::Value>(
            yaml,
            crate::source::files::yaml_options(),
        )
        .unwrap()
        .into_iter()
        .map(|v| Object::from_value(v).unwrap())
        .collect()
    }

    #[test]
    fn loopback_endpoints_of_parsed_slices() {
        let objects = objects(
            r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 18101}, {name: metrics, port: 19101}]
endpoints:
  - addresses: ["127.0.0.1"]
    targetRef: {kind: Pod, name: web-pod-a, namespace: demo}
  - addresses: ["10.0.0.7"]
    targetRef: {kind: Pod, name: remote, namespace: demo}
  - addresses: ["127.0.0.2"]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-b, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 18102}]
endpoints:
  - addresses: ["::1"]
    targetRef: {kind: Pod, name: web-pod-a, namespace: demo}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-c, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 18101}]
endpoints:
  - addresses: ["127.0.0.1"]
    targetRef: {kind: Pod, name: web-pod-a, namespace: demo}
  - addresses: ["127.0.0.1"]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: orphan, namespace: demo}
addressType: IPv4
ports: [{port: 18401}, {port: 0}]
endpoints:
  - addresses: ["127.0.0.1"]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: fqdn, namespace: demo, labels: {kubernetes.io/service-name: ext}}
addressType: FQDN
ports: [{port: 18501}]
endpoints:
  - addresses: ["localhost"]
"#,
        );
        let got: Vec<(String, String)> = loopback_endpoints(&objects)
            .into_iter()
            .map(|(name, addr)| (name, addr.to_string()))
            .collect();
        let want = [
            ("orphan-1", "127.0.0.1:18401"),
            ("web-3", "127.0.0.2:18101"),
            ("web-3", "127.0.0.2:19101"),
            ("web-pod-a", "127.0.0.1:18101"),
            ("web-pod-a", "127.0.0.1:19101"),
            ("web-pod-a", "[::1]:18102"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn quickstart_manifests_list_five_loopback_pods() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/quickstart");
        let loaded = crate::source::files::load_dir(&dir).unwrap();
        let ports: Vec<u16> = loopback_endpoints(&loaded.objects)
            .iter()
            .map(|(_, addr)| addr.port())
            .collect();
        assert_eq!(ports, [18301, 18201, 18202, 18101, 18102]);
    }

    #[tokio::test]
    async fn demo_backends_answer_on_every_endpoint() {
        // Free ports, found by binding port 0 and letting go.
        let mut ports = Vec::new();
        for _ in 0..2 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            ports.push(l.local_addr().unwrap().port());
        }
        let objects = objects(&format!(
            r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: s, namespace: demo, labels: {{kubernetes.io/service-name: api}}}}
addressType: IPv4
ports: [{{name: http, port: {}}}, {{name: alt, port: {}}}]
endpoints:
  - addresses: ["127.0.0.1"]
"#,
            ports[0], ports[1]
        ));
        let servers = spawn_demo_backends(&objects).await.unwrap();
        assert_eq!(servers.len(), 2);
        for server in &servers {
            assert_eq!(server.name, "api-1");
            let response = send(server.addr, b"GET /v1 HTTP/1.1\r\nHost: a\r\n\r\n").await;
            assert!(response.ends_with("api-1 GET /v1 host=a\n"), "{response}");
        }
        // A second start on the same addresses fails, naming the endpoint.
        let err = spawn_demo_backends(&objects).await.unwrap_err();
        assert!(
            err.to_string().contains("echo server api-1 on 127.0.0.1:"),
            "{err}"
        );
    }
}
