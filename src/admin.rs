//! The admin HTTP endpoint: health, readiness, metrics, the configuration in force, and the
//! log filter.
//!
//! Hand-written on tokio rather than pulling in an HTTP stack: the surface is a handful of GET
//! routes with tiny bodies, one request per connection. Everything read from the network is
//! bounded (head size, body size, read time) and malformed input gets a 4xx, never a panic.
//!
//! | route                 | response                                                 |
//! |-----------------------|----------------------------------------------------------|
//! | `/healthz`            | 200 `ok`                                                 |
//! | `/readyz`             | 200 when ready, 503 when not; JSON detail as the body    |
//! | `/metrics`            | 200, Prometheus text format 0.0.4                        |
//! | `/debug/config`       | 200 the `haproxy.cfg` in force, 404 before the first one |
//! | `/debug/model`        | 200 the model in force as JSON, 404 before the first one |
//! | `/debug/log-level`    | GET: the log filter in force; PUT: replace it            |
//!
//! `PUT /debug/log-level` is the only request that changes anything. It is answered only for
//! clients on a loopback address (403 otherwise), whatever `--admin-addr` binds, and only as
//! `PUT`: browsers do not send a cross-origin `PUT` without a preflight (`OPTIONS`, which gets
//! 405), so a web page cannot change it through a local browser either.
//!
//! A listener serves one [`Surface`]. The probes surface (`/healthz`, `/readyz`, `/metrics`)
//! is what an `--admin-addr` exposed to kubelet and Prometheus serves once the debug pages
//! have their own listener (`--debug-addr`) or when it is not on loopback: then the debug
//! pages and the only mutating request are not on an address anyone else can reach. HAProxy
//! is kept from connecting to either listener by the rules of [`crate::translate::exposure`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the admin endpoint shows; implemented by the controller.
pub trait AdminState: Send + Sync + 'static {
    /// Ok(detail) when ready, Err(detail) when not; detail is a JSON object shown as the body.
    fn readiness(&self) -> Result<serde_json::Value, serde_json::Value>;
    /// Prometheus text.
    fn metrics(&self) -> String;
    /// The haproxy.cfg in force, if any.
    fn config(&self) -> Option<String>;
    /// The model in force as JSON, if any.
    fn model(&self) -> Option<String>;
    /// What `/debug/log-level` reads and changes: by default the control the binary installed
    /// with [`set_log_control`]; `None` answers 404.
    fn log_control(&self) -> Option<&dyn LogControl> {
        LOG_CONTROL.get().map(|c| &**c)
    }
}

/// Reads and replaces the log filter at run time (a `tracing` filter such as `info` or
/// `portcullis=debug,haproxy=warn`).
pub trait LogControl: Send + Sync + 'static {
    /// The filter in force.
    fn current(&self) -> String;
    /// Replaces the filter: `Ok` with the filter now in force, or `Err` with the reason it was
    /// refused, and then nothing changed.
    fn set(&self, filter: &str) -> Result<String, String>;
}

static LOG_CONTROL: OnceLock<Box<dyn LogControl>> = OnceLock::new();

/// Installs the process's log control (once: the subscriber is process-wide too). Returns
/// false when one was already installed.
pub fn set_log_control(control: Box<dyn LogControl>) -> bool {
    LOG_CONTROL.set(control).is_ok()
}

/// The route that changes the log filter.
const LOG_LEVEL: &str = "/debug/log-level";

/// Which routes a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Every route, the debug pages and `PUT /debug/log-level` included.
    All,
    /// `/healthz`, `/readyz` and `/metrics` only; everything else is 404.
    Probes,
}

impl Surface {
    /// Whether this surface serves `path` at all.
    fn serves(self, path: &str) -> bool {
        match self {
            Self::All => true,
            Self::Probes => matches!(path, "/healthz" | "/readyz" | "/metrics"),
        }
    }

    /// The surfaces of the admin listener and of the debug listener, if any: a separate
    /// `debug` address takes the debug pages; without one they stay on `admin` only when it
    /// is a loopback address.
    pub fn split(
        admin: SocketAddr,
        debug: Option<SocketAddr>,
    ) -> (Self, Option<(SocketAddr, Self)>) {
        match debug {
            Some(debug) => (Self::Probes, Some((debug, Self::All))),
            None if admin.ip().to_canonical().is_loopback() => (Self::All, None),
            None => (Self::Probes, None),
        }
    }
}

/// Largest request head (request line, headers and the blank line) we accept.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long we wait for a client to take the response (and for its leftovers, see `finish`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept, so persistent errors (out of file descriptors) do not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Most leftover request bytes we read and discard before closing.
const MAX_DRAIN: usize = 64 * 1024;
/// Largest request body we read (a log filter).
const MAX_BODY: usize = 4 * 1024;

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Limits for one connection; tests shorten them.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_head: usize,
    read_timeout: Duration,
    write_timeout: Duration,
}

const LIMITS: Limits = Limits {
    max_head: MAX_HEAD,
    read_timeout: READ_TIMEOUT,
    write_timeout: WRITE_TIMEOUT,
};

/// Serves the admin endpoint on `listener` until `shutdown` completes.
///
/// Each connection runs in its own task. On shutdown we stop accepting and return; connections
/// already accepted finish on their own. Accept errors are logged and retried after a short
/// pause, so this only returns `Ok`; the `Result` leaves room for fatal listener errors.
pub async fn serve(
    listener: TcpListener,
    state: Arc<dyn AdminState>,
    surface: Surface,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    serve_with(listener, state, surface, shutdown, LIMITS).await
}

async fn serve_with(
    listener: TcpListener,
    state: Arc<dyn AdminState>,
    surface: Surface,
    shutdown: impl Future<Output = ()> + Send,
    limits: Limits,
) -> io::Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            // Shutdown wins over a pending connection.
            biased;
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let state = state.clone();
                    tokio::spawn(connection(stream, peer, state, surface, limits));
                }
                Err(error) => {
                    tracing::warn!(%error, "admin endpoint: accept failed");
                    tokio::select! {
                        biased;
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
            },
        }
    }
}

/// Reads one request, answers it and closes the connection.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    state: Arc<dyn AdminState>,
    surface: Surface,
    limits: Limits,
) {
    let head = tokio::time::timeout(limits.read_timeout, read_head(&mut stream, limits.max_head))
        .await
        .unwrap_or(Err(HeadError::TimedOut));
    let (head, leftover) = match head {
        Ok((head, leftover)) => (Ok(head), leftover),
        Err(e) => (Err(e), Vec::new()),
    };
    let (request, response) = match head.as_deref().map(parse_head) {
        Ok(Some(request)) => {
            let response = if !surface.serves(request.path) {
                Response::text(404, "not found\n")
            } else if request.path == LOG_LEVEL && request.method == "PUT" {
                put_log_level(&request, peer, &mut stream, leftover, &*state, limits).await
            } else {
                route(&request, &*state)
            };
            (Some(request), response)
        }
        Ok(None) | Err(HeadError::Truncated) => (None, Response::text(400, "bad request\n")),
        Err(HeadError::TimedOut) => (None, Response::text(408, "request timeout\n")),
        Err(HeadError::TooLarge) => (None, Response::text(431, "request head too large\n")),
        // The client left without asking anything (a TCP health check, a port scan).
        Err(HeadError::Closed) => return,
        Err(HeadError::Io(error)) => {
            tracing::debug!(%peer, %error, "admin endpoint: reading request failed");
            return;
        }
    };
    let status = response.status;
    if let Some(r) = &request {
        tracing::debug!(%peer, method = r.method, path = r.path, status, "admin request");
    } else {
        tracing::debug!(%peer, status, "admin request refused");
    }
    let head_only = request.as_ref().is_some_and(|r| r.method == "HEAD");
    let bytes = response.into_bytes(head_only);
    if tokio::time::timeout(limits.write_timeout, finish(&mut stream, &bytes))
        .await
        .is_err()
    {
        tracing::debug!(%peer, "admin endpoint: client too slow to take the response");
    }
}

/// Writes the response, then reads and discards what the client still sends until it closes.
///
/// Closing a socket with unread input makes the kernel send a reset, which can destroy the
/// response before the client reads it (think 431 on a head we stopped reading halfway).
async fn finish(stream: &mut TcpStream, response: &[u8]) {
    if stream.write_all(response).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let mut scratch = [0u8; 4096];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        match stream.read(&mut scratch).await {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

#[derive(Debug)]
enum HeadError {
    Io(io::Error),
    Closed,
    /// The client stopped sending (half-closed) before the head was complete.
    Truncated,
    TooLarge,
    TimedOut,
}

/// Reads up to and including the blank line that ends the request head; also returns the
/// bytes read past it (the start of a body).
async fn read_head(stream: &mut TcpStream, max: usize) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        // Scan only the new bytes (plus the two before them, where a terminator may begin).
        let scanned = buf.len().saturating_sub(2);
        let n = stream.read(&mut chunk).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(if buf.is_empty() {
                HeadError::Closed
            } else {
                HeadError::Truncated
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf, scanned) {
            if end > max {
                return Err(HeadError::TooLarge);
            }
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() >= max {
            return Err(HeadError::TooLarge);
        }
    }
}

/// The length of the head: up to the end of the first empty line. Bare LF line endings are
/// accepted as RFC 9112 allows.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len()).find_map(|i| {
        if buf[i] != b'\n' {
            return None;
        }
        match buf.get(i + 1..) {
            Some([b'\n', ..]) => Some(i + 2),
            Some([b'\r', b'\n', ..]) => Some(i + 3),
            _ => None,
        }
    })
}

/// The parts of a request we act on.
#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    method: &'a str,
    /// The target's path, without query or fragment.
    path: &'a str,
    /// `Content-Length`, when given.
    content_length: Option<usize>,
    /// A `Transfer-Encoding` header was sent (its body is not read).
    transfer_encoding: bool,
}

/// Parses the request line and checks that every header line is well-formed. `None` means
/// 400. Of the header values only `Content-Length` (one value, digits only) and whether
/// `Transfer-Encoding` is present are kept.
fn parse_head(head: &[u8]) -> Option<Request<'_>> {
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next()?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.bytes().all(is_tchar)
        || !matches!(version, "HTTP/1.1" | "HTTP/1.0")
        || !target.bytes().all(|b| b.is_ascii_graphic())
    {
        return None;
    }
    let mut content_length = None;
    let mut transfer_encoding = false;
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            let value = value.trim_matches([' ', '\t']);
            if value.is_empty() || value.len() > 12 || !value.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: usize = value.parse().ok()?;
            if content_length.is_some_and(|m| m != n) {
                return None;
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
        }
    }
    Some(Request {
        method,
        path: target_path(target)?,
        content_length,
        transfer_encoding,
    })
}

/// The path of a request target in origin form (`/metrics?x`) or absolute form
/// (`http://host/metrics`); `*` is passed through and simply matches no route.
fn target_path(target: &str) -> Option<&str> {
    let end = target.find(['?', '#']).unwrap_or(target.len());
    let target = &target[..end];
    if target.starts_with('/') || target == "*" {
        return Some(target);
    }
    let (scheme, rest) = target.split_once("://")?;
    let scheme_ok = scheme
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return None;
    }
    Some(rest.find('/').map_or("/", |i| &rest[i..]))
}

/// A token character (RFC 9110 `tchar`), as allowed in methods and header names.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn route(request: &Request<'_>, state: &dyn AdminState) -> Response {
    let known = matches!(
        request.path,
        "/healthz" | "/readyz" | "/metrics" | "/debug/config" | "/debug/model" | LOG_LEVEL
    );
    if !known {
        return Response::text(404, "not found\n");
    }
    if !matches!(request.method, "GET" | "HEAD") {
        let mut response = Response::text(405, "method not allowed\n");
        response.allow = Some(if request.path == LOG_LEVEL {
            "GET, HEAD, PUT"
        } else {
            "GET, HEAD"
        });
        return response;
    }
    match request.path {
        LOG_LEVEL => match state.log_control() {
            Some(control) => Response::text(200, &format!("{}\n", control.current())),
            None => Response::text(404, "the log level cannot be changed in this process\n"),
        },
        "/healthz" => Response::text(200, "ok\n"),
        "/readyz" => {
            let (status, detail) = match state.readiness() {
                Ok(detail) => (200, detail),
                Err(detail) => (503, detail),
            };
            Response::new(status, JSON, format!("{detail}\n"))
        }
        "/metrics" => Response::new(200, PROMETHEUS, state.metrics()),
        "/debug/config" => match state.config() {
            Some(config) => Response::new(200, TEXT, config),
            None => Response::text(404, "no configuration applied yet\n"),
        },
        // Only "/debug/model" is left among the known paths.
        _ => match state.model() {
            Some(model) => Response::new(200, JSON, model),
            None => Response::text(404, "no model applied yet\n"),
        },
    }
}

/// Whether a client may change state (the log filter): only from the machine (or pod) itself.
fn may_change_state(peer: SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// `PUT /debug/log-level`: the body is the new filter. Refused (403) unless the client is on
/// loopback; the body must come with a `Content-Length` of at most [`MAX_BODY`] bytes.
async fn put_log_level(
    request: &Request<'_>,
    peer: SocketAddr,
    stream: &mut TcpStream,
    mut body: Vec<u8>,
    state: &dyn AdminState,
    limits: Limits,
) -> Response {
    if !may_change_state(peer) {
        tracing::warn!(%peer, "admin endpoint: log level change refused: not from loopback");
        return Response::text(
            403,
            "the log level can only be changed from a loopback address\n",
        );
    }
    let Some(control) = state.log_control() else {
        return Response::text(404, "the log level cannot be changed in this process\n");
    };
    if request.transfer_encoding {
        return Response::text(411, "send the filter with a Content-Length\n");
    }
    let Some(length) = request.content_length else {
        return Response::text(411, "send the filter with a Content-Length\n");
    };
    if length > MAX_BODY {
        return Response::text(413, "the filter is too long\n");
    }
    let read = async {
        let mut chunk = [0u8; 1024];
        while body.len() < length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        true
    };
    match tokio::time::timeout(limits.read_timeout, read).await {
        Ok(true) => {}
        Ok(false) => return Response::text(400, "the body ended early\n"),
        Err(_) => return Response::text(408, "request timeout\n"),
    }
    body.truncate(length);
    let Ok(text) = std::str::from_utf8(&body) else {
        return Response::text(400, "the filter is not UTF-8 text\n");
    };
    let filter = text.trim();
    if filter.is_empty() {
        return Response::text(400, "send a filter, e.g. `info` or `portcullis=debug`\n");
    }
    let old = control.current();
    match control.set(filter) {
        Ok(new) => {
            tracing::info!(%peer, from = %old, to = %new, "log filter changed");
            Response::text(200, &format!("{new}\n"))
        }
        Err(error) => Response::text(
            400,
            &format!("invalid filter, the filter in force is still {old:?}: {error}\n"),
        ),
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
    /// The methods sent in `Allow` (with 405).
    allow: Option<&'static str>,
}

impl Response {
    fn new(status: u16, content_type: &'static str, body: String) -> Self {
        Self {
            status,
            content_type,
            body,
            allow: None,
        }
    }

    fn text(status: u16, body: &str) -> Self {
        Self::new(status, TEXT, body.to_owned())
    }

    /// The wire form. A HEAD response carries the headers a GET would, without the body.
    fn into_bytes(self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len(),
        );
        if let Some(methods) = self.allow {
            out.push_str("Allow: ");
            out.push_str(methods);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if !head_only {
            bytes.extend_from_slice(self.body.as_bytes());
        }
        bytes
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use serde_json::json;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    /// Generous: only reached when something is broken.
    const DEADLINE: Duration = Duration::from_secs(5);

    #[derive(Default)]
    struct Fake {
        ready: Mutex<bool>,
        config: Option<String>,
        model: Option<String>,
        log: Option<FakeLog>,
    }

    /// A log control that accepts any filter made of letters, digits, `=`, `,`, `_` and `:`.
    struct FakeLog(Mutex<String>);

    impl LogControl for FakeLog {
        fn current(&self) -> String {
            self.0.lock().unwrap().clone()
        }
        fn set(&self, filter: &str) -> Result<String, String> {
            if !filter
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"=,_:".contains(&b))
            {
                return Err(format!("bad filter {filter:?}"));
            }
            *self.0.lock().unwrap() = filter.to_owned();
            Ok(filter.to_owned())
        }
    }

    impl AdminState for Fake {
        fn readiness(&self) -> Result<serde_json::Value, serde_json::Value> {
            if *self.ready.lock().unwrap() {
                Ok(json!({"ready": true}))
            } else {
                Err(json!({"ready": false, "reason": "no configuration applied yet"}))
            }
        }
        fn metrics(&self) -> String {
            "# TYPE portcullis_ready gauge\nportcullis_ready 1\n".to_owned()
        }
        fn config(&self) -> Option<String> {
            self.config.clone()
        }
        fn model(&self) -> Option<String> {
            self.model.clone()
        }
        fn log_control(&self) -> Option<&dyn LogControl> {
            self.log.as_ref().map(|l| l as &dyn LogControl)
        }
    }

    struct Server {
        addr: SocketAddr,
        stop: oneshot::Sender<()>,
        task: JoinHandle<io::Result<()>>,
    }

    async fn start(state: Fake, limits: Limits) -> Server {
        start_surface(state, Surface::All, limits).await
    }

    async fn start_surface(state: Fake, surface: Surface, limits: Limits) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve_with(
            listener,
            Arc::new(state),
            surface,
            shutdown,
            limits,
        ));
        Server { addr, stop, task }
    }

    fn applied() -> Fake {
        Fake {
            ready: Mutex::new(true),
            config: Some("global\n    maxconn 100\n".to_owned()),
            model: Some("{\"frontends\":[]}".to_owned()),
            log: Some(FakeLog(Mutex::new("info".to_owned()))),
        }
    }

    /// A parsed response: status line, headers (names lowercased) and body.
    #[derive(Debug)]
    struct Reply {
        status_line: String,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// Sends `raw`, reads until the server closes, and parses the reply.
    async fn exchange(addr: SocketAddr, raw: &[u8]) -> Reply {
        let text = tokio::time::timeout(DEADLINE, async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(raw).await.unwrap();
            let mut out = Vec::new();
            stream.read_to_end(&mut out).await.unwrap();
            String::from_utf8(out).unwrap()
        })
        .await
        .expect("no response before the deadline");
        let (head, body) = text.split_once("\r\n\r\n").expect("no end of head");
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap().to_owned();
        let headers = lines
            .map(|l| {
                let (n, v) = l.split_once(": ").unwrap();
                (n.to_ascii_lowercase(), v.to_owned())
            })
            .collect();
        Reply {
            status_line,
            headers,
            body: body.to_owned(),
        }
    }

    async fn get(addr: SocketAddr, target: &str) -> Reply {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: admin\r\nUser-Agent: test\r\n\r\n");
        exchange(addr, raw.as_bytes()).await
    }

    /// Status line, content type, and a Content-Length that matches the body.
    fn check(reply: &Reply, status_line: &str, content_type: &str) {
        assert_eq!(reply.status_line, status_line, "{reply:?}");
        assert_eq!(
            reply.header("content-type"),
            Some(content_type),
            "{reply:?}"
        );
        assert_eq!(reply.header("connection"), Some("close"), "{reply:?}");
        let length: usize = reply.header("content-length").unwrap().parse().unwrap();
        assert_eq!(length, reply.body.len(), "{reply:?}");
    }

    #[tokio::test]
    async fn every_route_when_applied() {
        let server = start(applied(), LIMITS).await;
        let addr = server.addr;

        let r = get(addr, "/healthz").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
        assert_eq!(r.body, "ok\n");

        let r = get(addr, "/readyz").await;
        check(&r, "HTTP/1.1 200 OK", JSON);
        assert_eq!(r.body, "{\"ready\":true}\n");

        let r = get(addr, "/metrics?name[]=portcullis_ready").await;
        check(&r, "HTTP/1.1 200 OK", PROMETHEUS);
        assert_eq!(
            r.body,
            "# TYPE portcullis_ready gauge\nportcullis_ready 1\n"
        );

        let r = get(addr, "/debug/config").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
        assert_eq!(r.body, "global\n    maxconn 100\n");

        let r = get(addr, "/debug/model").await;
        check(&r, "HTTP/1.1 200 OK", JSON);
        assert_eq!(r.body, "{\"frontends\":[]}");

        // Absolute form, as sent to a proxy.
        let r = get(addr, "http://admin:9000/healthz?verbose").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
        assert_eq!(r.body, "ok\n");
    }

    #[tokio::test]
    async fn not_ready_and_nothing_applied() {
        let server = start(Fake::default(), LIMITS).await;
        let addr = server.addr;

        let r = get(addr, "/readyz").await;
        check(&r, "HTTP/1.1 503 Service Unavailable", JSON);
        let detail: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(detail["ready"], json!(false));

        let r = get(addr, "/debug/config").await;
        check(&r, "HTTP/1.1 404 Not Found", TEXT);
        assert_eq!(r.body, "no configuration applied yet\n");

        let r = get(addr, "/debug/model").await;
        check(&r, "HTTP/1.1 404 Not Found", TEXT);
        assert_eq!(r.body, "no model applied yet\n");

        // Liveness does not depend on readiness.
        let r = get(addr, "/healthz").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
    }

    #[tokio::test]
    async fn head_has_headers_without_body() {
        let server = start(applied(), LIMITS).await;
        let r = exchange(server.addr, b"HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.status_line, "HTTP/1.1 200 OK");
        assert_eq!(r.header("content-length"), Some("3"));
        assert_eq!(r.body, "");
    }

    #[tokio::test]
    async fn wrong_method_and_unknown_path() {
        let server = start(applied(), LIMITS).await;
        let addr = server.addr;

        let r = exchange(
            addr,
            b"POST /readyz HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        )
        .await;
        check(&r, "HTTP/1.1 405 Method Not Allowed", TEXT);
        assert_eq!(r.header("allow"), Some("GET, HEAD"));

        let r = exchange(addr, b"DELETE /debug/config HTTP/1.0\r\n\r\n").await;
        check(&r, "HTTP/1.1 405 Method Not Allowed", TEXT);
        assert_eq!(r.header("allow"), Some("GET, HEAD"));

        for target in ["/", "/nope", "/healthz/", "/HEALTHZ", "*"] {
            let r = get(addr, target).await;
            check(&r, "HTTP/1.1 404 Not Found", TEXT);
            assert_eq!(r.header("allow"), None);
        }
    }

    #[tokio::test]
    async fn lenient_where_harmless() {
        let server = start(applied(), LIMITS).await;
        // HTTP/1.0, bare LF line endings, no headers at all.
        let r = exchange(server.addr, b"GET /healthz HTTP/1.0\n\n").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
        assert_eq!(r.body, "ok\n");
    }

    #[tokio::test]
    async fn malformed_requests_get_400() {
        let server = start(applied(), LIMITS).await;
        let cases: &[&[u8]] = &[
            b"hello\r\n\r\n",
            b"\r\n\r\n",
            b"GET /healthz\r\n\r\n",
            b"GET  /healthz HTTP/1.1\r\n\r\n",
            b"GET /healthz HTTP/1.1 extra\r\n\r\n",
            b"GET /healthz HTTP/2.0\r\n\r\n",
            b"GET healthz HTTP/1.1\r\n\r\n",
            b"G(T /healthz HTTP/1.1\r\n\r\n",
            b"GET /health\x01z HTTP/1.1\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n folded: x\r\n\r\n",
            b"\xff\xfe\x00\x01 / HTTP/1.1\r\n\r\n",
        ];
        for raw in cases {
            let r = exchange(server.addr, raw).await;
            check(&r, "HTTP/1.1 400 Bad Request", TEXT);
        }
    }

    #[tokio::test]
    async fn oversized_head_gets_431() {
        let server = start(applied(), LIMITS).await;
        let mut raw = b"GET /healthz HTTP/1.1\r\n".to_vec();
        while raw.len() <= MAX_HEAD + 1024 {
            raw.extend_from_slice(
                b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        // Without the terminating blank line: the limit alone must end the read.
        let r = exchange(server.addr, &raw).await;
        check(&r, "HTTP/1.1 431 Request Header Fields Too Large", TEXT);

        // Complete but too long.
        raw.extend_from_slice(b"\r\n");
        let r = exchange(server.addr, &raw).await;
        check(&r, "HTTP/1.1 431 Request Header Fields Too Large", TEXT);

        // Just under the limit is fine.
        let mut raw = b"GET /healthz HTTP/1.1\r\nX-Filler: ".to_vec();
        raw.resize(MAX_HEAD - 4, b'a');
        raw.extend_from_slice(b"\r\n\r\n");
        assert_eq!(raw.len(), MAX_HEAD);
        let r = exchange(server.addr, &raw).await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
    }

    #[tokio::test]
    async fn silent_client_times_out_with_408() {
        let limits = Limits {
            read_timeout: Duration::from_millis(100),
            ..LIMITS
        };
        let server = start(applied(), limits).await;
        let r = exchange(server.addr, b"GET /healthz HTTP/1.1\r\n").await;
        check(&r, "HTTP/1.1 408 Request Timeout", TEXT);
    }

    #[tokio::test]
    async fn client_leaving_early_does_not_hurt() {
        let server = start(applied(), LIMITS).await;
        let stream = TcpStream::connect(server.addr).await.unwrap();
        drop(stream);
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream.write_all(b"GET /heal").await.unwrap();
        drop(stream);
        let r = get(server.addr, "/healthz").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
    }

    #[tokio::test]
    async fn half_closed_partial_head_gets_400() {
        let server = start(applied(), LIMITS).await;
        let reply = tokio::time::timeout(DEADLINE, async {
            let mut stream = TcpStream::connect(server.addr).await.unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\n")
                .await
                .unwrap();
            stream.shutdown().await.unwrap();
            let mut out = String::new();
            stream.read_to_string(&mut out).await.unwrap();
            out
        })
        .await
        .unwrap();
        assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");
    }

    #[tokio::test]
    async fn serve_returns_after_shutdown() {
        let server = start(applied(), LIMITS).await;
        let r = get(server.addr, "/healthz").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);

        server.stop.send(()).unwrap();
        let result = tokio::time::timeout(DEADLINE, server.task)
            .await
            .expect("serve did not return after shutdown")
            .unwrap();
        assert!(result.is_ok());
        // The listener is gone with it.
        assert!(TcpStream::connect(server.addr).await.is_err());
    }

    fn put(target: &str, body: &str) -> Vec<u8> {
        format!(
            "PUT {target} HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn log_level_is_read_and_changed() {
        let server = start(applied(), LIMITS).await;
        let addr = server.addr;

        let r = get(addr, LOG_LEVEL).await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
        assert_eq!(r.body, "info\n");

        let r = exchange(addr, &put(LOG_LEVEL, "portcullis=debug,haproxy=warn\n")).await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
        assert_eq!(r.body, "portcullis=debug,haproxy=warn\n");
        assert_eq!(
            get(addr, LOG_LEVEL).await.body,
            "portcullis=debug,haproxy=warn\n"
        );

        // Refused filters leave the one in force.
        let r = exchange(addr, &put(LOG_LEVEL, "debug;rm -rf /")).await;
        check(&r, "HTTP/1.1 400 Bad Request", TEXT);
        assert!(
            r.body.contains("still \"portcullis=debug,haproxy=warn\""),
            "{r:?}"
        );
        let r = exchange(addr, &put(LOG_LEVEL, "  \n")).await;
        check(&r, "HTTP/1.1 400 Bad Request", TEXT);
        assert_eq!(
            get(addr, LOG_LEVEL).await.body,
            "portcullis=debug,haproxy=warn\n"
        );

        // The body may come after the head, in pieces.
        let reply = tokio::time::timeout(DEADLINE, async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(b"PUT /debug/log-level HTTP/1.1\r\nContent-Length: 4\r\n\r\nwa")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            stream.write_all(b"rn").await.unwrap();
            let mut out = String::new();
            stream.read_to_string(&mut out).await.unwrap();
            out
        })
        .await
        .unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.ends_with("\r\n\r\nwarn\n"), "{reply}");

        // Framing problems.
        let r = exchange(addr, b"PUT /debug/log-level HTTP/1.1\r\n\r\n").await;
        check(&r, "HTTP/1.1 411 Length Required", TEXT);
        let r = exchange(
            addr,
            b"PUT /debug/log-level HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ninfo\r\n0\r\n\r\n",
        )
        .await;
        check(&r, "HTTP/1.1 411 Length Required", TEXT);
        let r = exchange(addr, &put(LOG_LEVEL, &"a".repeat(MAX_BODY + 1))).await;
        check(&r, "HTTP/1.1 413 Content Too Large", TEXT);
        let r = exchange(addr, &put(LOG_LEVEL, "\u{e9}")).await;
        check(&r, "HTTP/1.1 400 Bad Request", TEXT);
        assert_eq!(get(addr, LOG_LEVEL).await.body, "warn\n");

        // Only PUT changes it; the other routes stay read-only.
        let r = exchange(
            addr,
            b"POST /debug/log-level HTTP/1.1\r\nContent-Length: 4\r\n\r\ninfo",
        )
        .await;
        check(&r, "HTTP/1.1 405 Method Not Allowed", TEXT);
        assert_eq!(r.header("allow"), Some("GET, HEAD, PUT"));
        let r = exchange(addr, b"OPTIONS /debug/log-level HTTP/1.1\r\n\r\n").await;
        check(&r, "HTTP/1.1 405 Method Not Allowed", TEXT);
        let r = exchange(addr, &put("/metrics", "info")).await;
        check(&r, "HTTP/1.1 405 Method Not Allowed", TEXT);
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        assert_eq!(get(addr, LOG_LEVEL).await.body, "warn\n");
    }

    #[tokio::test]
    async fn log_level_without_control_is_404() {
        let server = start(Fake::default(), LIMITS).await;
        let r = get(server.addr, LOG_LEVEL).await;
        check(&r, "HTTP/1.1 404 Not Found", TEXT);
        let r = exchange(server.addr, &put(LOG_LEVEL, "debug")).await;
        check(&r, "HTTP/1.1 404 Not Found", TEXT);
    }

    #[tokio::test]
    async fn the_probes_surface_serves_no_debug_page_and_changes_nothing() {
        let server = start_surface(applied(), Surface::Probes, LIMITS).await;
        let addr = server.addr;
        check(&get(addr, "/healthz").await, "HTTP/1.1 200 OK", TEXT);
        check(&get(addr, "/readyz").await, "HTTP/1.1 200 OK", JSON);
        check(&get(addr, "/metrics").await, "HTTP/1.1 200 OK", PROMETHEUS);
        for path in ["/debug/config", "/debug/model", LOG_LEVEL, "/debug/"] {
            let r = get(addr, path).await;
            check(&r, "HTTP/1.1 404 Not Found", TEXT);
            assert!(!r.body.contains("maxconn"), "{path}: {}", r.body);
        }
        let r = exchange(addr, &put(LOG_LEVEL, "debug")).await;
        check(&r, "HTTP/1.1 404 Not Found", TEXT);
    }

    #[test]
    fn debug_pages_stay_on_loopback_or_on_their_own_listener() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            Surface::split(addr("127.0.0.1:6060"), None),
            (Surface::All, None)
        );
        assert_eq!(
            Surface::split(addr("[::1]:6060"), None),
            (Surface::All, None)
        );
        assert_eq!(
            Surface::split(addr("0.0.0.0:6060"), None),
            (Surface::Probes, None)
        );
        assert_eq!(
            Surface::split(addr("10.0.0.5:6060"), None),
            (Surface::Probes, None)
        );
        assert_eq!(
            Surface::split(addr("127.0.0.1:6060"), Some(addr("127.0.0.1:6061"))),
            (
                Surface::Probes,
                Some((addr("127.0.0.1:6061"), Surface::All))
            )
        );
    }

    #[test]
    fn only_loopback_may_change_state() {
        for peer in [
            "127.0.0.1:1",
            "127.9.8.7:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(may_change_state(peer.parse().unwrap()), "{peer}");
        }
        for peer in [
            "10.0.0.1:1",
            "0.0.0.0:1",
            "[::ffff:10.0.0.1]:1",
            "[fe80::1]:1",
        ] {
            assert!(!may_change_state(peer.parse().unwrap()), "{peer}");
        }
    }

    #[test]
    fn parses_request_heads() {
        let r = parse_head(b"GET /metrics?x=1#f HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(
            r,
            Request {
                method: "GET",
                path: "/metrics",
                content_length: None,
                transfer_encoding: false,
            }
        );
        let r = parse_head(b"PUT /x HTTP/1.1\r\ncontent-length: 12\r\nContent-Length:12 \r\n\r\n")
            .unwrap();
        assert_eq!(r.content_length, Some(12));
        let r = parse_head(b"PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert!(r.transfer_encoding);
        for bad in [
            &b"PUT /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"[..],
            b"PUT /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"PUT /x HTTP/1.1\r\nContent-Length: 1,1\r\n\r\n",
            b"PUT /x HTTP/1.1\r\nContent-Length:\r\n\r\n",
        ] {
            assert_eq!(parse_head(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        let r = parse_head(b"GET https://h:1 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(r.path, "/");
        assert_eq!(parse_head(b"GET ://h/x HTTP/1.1\r\n\r\n"), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody", 0), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\nA: b\n\nbody", 0), Some(21));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
    }
}
