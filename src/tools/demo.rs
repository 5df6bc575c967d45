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
//! It serves HTTP/1 through hyper (see [`crate::http1`]), one request per connection; request
//! bodies are ignored, anything malformed gets `400 Bad Request`, a head over 16 KiB `431`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::http1::{self, Outcome, Unanswered};
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
/// The bounds of one connection; the answer needs no more time than the head.
const LIMITS: http1::Limits = http1::Limits {
    max_head: MAX_HEAD,
    head_timeout: HEAD_TIMEOUT,
    exchange_timeout: Duration::from_secs(20),
    linger_timeout: LINGER_TIMEOUT,
    linger_max: LINGER_MAX,
};
/// The header naming the server that answered.
const SERVED_BY: HeaderName = HeaderName::from_static("x-served-by");
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
    let task = tokio::spawn(serve(listener, Arc::from(name.as_str()), LIMITS));
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
async fn serve(listener: TcpListener, name: Arc<str>, limits: http1::Limits) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(connection(stream, peer, Arc::clone(&name), limits));
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

/// Answers one request, then closes gracefully.
async fn connection(stream: TcpStream, peer: SocketAddr, name: Arc<str>, limits: http1::Limits) {
    let service = {
        let name = Arc::clone(&name);
        hyper::service::service_fn(move |request| {
            std::future::ready(Ok::<_, Infallible>(echo(&name, &request)))
        })
    };
    let unanswered = |why| match why {
        Unanswered::TimedOut => error_answer(
            &name,
            StatusCode::REQUEST_TIMEOUT,
            "no complete request head",
        ),
        Unanswered::Truncated => error_answer(
            &name,
            StatusCode::BAD_REQUEST,
            "the request head ended early",
        ),
    };
    match http1::serve_one(stream, service, limits, unanswered).await {
        Outcome::Served => {}
        outcome => tracing::debug!(server = %name, %peer, ?outcome, "echo connection ended"),
    }
}

/// What the echo body reports about a request: `<name> <method> <target> host=<host>`, then
/// each `X-` header as `name: value` (names lowercased, sorted, repeated headers in order).
fn echo_body(name: &str, request: &Request<Incoming>) -> Result<String, &'static str> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (_, Some(_)) => return Err("more than one Host header"),
        (Some(host), None) => text(host)?,
        (None, None) => "",
    };
    let mut x_headers = Vec::new();
    for (field, value) in request.headers() {
        if field.as_str().starts_with("x-") {
            x_headers.push((field.as_str(), text(value)?));
        }
    }
    // Stable: repeated headers keep the order they came in.
    x_headers.sort_by(|a, b| a.0.cmp(b.0));
    let mut body = format!(
        "{name} {} {} host={host}\n",
        request.method(),
        request.uri()
    );
    for (field, value) in x_headers {
        body.push_str(field);
        body.push_str(": ");
        body.push_str(value);
        body.push('\n');
    }
    Ok(body)
}

/// A header value as text (UTF-8, surrounding blanks trimmed).
fn text(value: &HeaderValue) -> Result<&str, &'static str> {
    std::str::from_utf8(value.as_bytes())
        .map(|v| v.trim_matches([' ', '\t']))
        .map_err(|_| "a header value is not UTF-8")
}

fn echo(name: &str, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body) = match echo_body(name, request) {
        Ok(body) => (StatusCode::OK, body),
        Err(reason) => (
            StatusCode::BAD_REQUEST,
            format!("{name} 400 Bad Request: {reason}\n"),
        ),
    };
    let length = HeaderValue::from(body.len());
    let body = if request.method() == Method::HEAD {
        Full::default()
    } else {
        Full::new(Bytes::from(body))
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(header::CONTENT_LENGTH, length);
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    // `spawn_echo` refused names with control characters, the only ones a header cannot hold.
    if let Ok(served_by) = HeaderValue::from_str(name) {
        headers.insert(SERVED_BY, served_by);
    }
    response
}

/// The answer to a request hyper leaves unanswered.
fn error_answer(name: &str, status: StatusCode, detail: &str) -> Vec<u8> {
    let reason = status.canonical_reason().unwrap_or_default();
    let body = format!("{name} {} {reason}: {detail}\n", status.as_str());
    http1::plain(status, "text/plain", &[("X-Served-By", name)], &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        // An HTTP/1.0 client is answered in HTTP/1.0.
        let response = send(server.addr, b"HEAD / HTTP/1.0\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.0 200 OK\r\n"), "{response}");
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
        // Refused by hyper, before the echo sees them.
        let cases: &[&[u8]] = &[
            b"hello\r\n\r\n",
            b"GET /\r\n\r\n",
            b"GET / HTTP/2.0\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
            b"G(T / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-A: 1\r\n  folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-A: \x01\r\n\r\n",
            b"GET /\xff HTTP/1.1\r\n\r\n",
            b"\x00\x01\x02\r\n\r\n",
        ];
        for request in cases {
            let response = send(server.addr, request).await;
            assert_eq!(
                status_line(&response),
                "HTTP/1.1 400 Bad Request",
                "{:?}",
                String::from_utf8_lossy(request)
            );
        }
        // Refused by the echo, which signs its answer.
        let response = send(server.addr, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").await;
        assert_eq!(status_line(&response), "HTTP/1.1 400 Bad Request");
        assert!(response.contains("X-Served-By: web-2\r\n"), "{response}");
        assert!(
            response.ends_with("\r\n\r\nweb-2 400 Bad Request: more than one Host header\n"),
            "{response}"
        );
        // A head over the limit.
        let mut too_large = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
        too_large.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        too_large.extend_from_slice(b"\r\n\r\n");
        let response = send(server.addr, &too_large).await;
        assert_eq!(
            status_line(&response),
            "HTTP/1.1 431 Request Header Fields Too Large"
        );
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
        assert!(
            response.ends_with("\r\n\r\nweb-2 400 Bad Request: the request head ended early\n"),
            "{response}"
        );
        assert!(response.contains("X-Served-By: web-2\r\n"), "{response}");
        // The server still answers good requests afterwards.
        let response = send(server.addr, b"\r\nGET / HTTP/1.1\nHost: ok\n\n").await;
        assert!(response.ends_with("web-2 GET / host=ok\n"), "{response}");
    }

    #[tokio::test]
    async fn a_silent_client_gets_408() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = http1::Limits {
            head_timeout: Duration::from_millis(100),
            ..LIMITS
        };
        let task = tokio::spawn(serve(listener, Arc::from("web-4"), limits));
        let response = send(addr, b"GET / HTTP/1.1\r\nHost: a\r\n").await;
        task.abort();
        assert_eq!(
            response,
            "HTTP/1.1 408 Request Timeout\r\n\
             Content-Type: text/plain\r\n\
             Content-Length: 52\r\n\
             Connection: close\r\n\
             X-Served-By: web-4\r\n\
             \r\nweb-4 408 Request Timeout: no complete request head\n"
        );
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
