//! The admin HTTP endpoint: health, readiness, metrics, the configuration in force, and the
//! log filter.
//!
//! HTTP/1 on hyper (through [`crate::http1`]), one request per connection. Everything read
//! from the network is bounded (head size, body size, read time) and malformed input gets a
//! 4xx, never a panic.
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

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Bytes, Incoming};
use hyper::ext::ReasonPhrase;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use tokio::net::{TcpListener, TcpStream};

use crate::http1::{self, Outcome, Unanswered};

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
/// How long a client may take to send its request head, and then its body.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long we wait for a client to take the response (and for its leftovers).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept, so persistent errors (out of file descriptors) do not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Most leftover request bytes we read and discard before closing.
const MAX_DRAIN: usize = 64 * 1024;
/// Largest request body we read (a log filter).
const MAX_BODY: usize = 4 * 1024;

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
/// The exposition format is the metrics encoder's to name.
const PROMETHEUS: &str = crate::metrics::CONTENT_TYPE;

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

impl Limits {
    /// The bounds of one connection: the head and then the body each within `read_timeout`,
    /// the answer taken within `write_timeout`.
    fn connection(self) -> http1::Limits {
        http1::Limits {
            max_head: self.max_head,
            head_timeout: self.read_timeout,
            exchange_timeout: self.read_timeout * 2 + self.write_timeout,
            linger_timeout: self.write_timeout,
            linger_max: MAX_DRAIN,
        }
    }
}

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

/// Serves one request and closes the connection.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<dyn AdminState>,
    surface: Surface,
    limits: Limits,
) {
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(answer(request, peer, &*state, surface, limits).await) }
    });
    let unanswered = |why| match why {
        Unanswered::TimedOut => {
            http1::plain(StatusCode::REQUEST_TIMEOUT, TEXT, &[], "request timeout\n")
        }
        Unanswered::Truncated => http1::plain(StatusCode::BAD_REQUEST, TEXT, &[], "bad request\n"),
    };
    match http1::serve_one(stream, service, limits.connection(), unanswered).await {
        Outcome::Served => {}
        Outcome::Answered(why) => {
            tracing::debug!(%peer, ?why, "admin request refused");
        }
        Outcome::Refused(error) => {
            tracing::debug!(%peer, %error, "admin request refused");
        }
        Outcome::TooSlow => {
            tracing::debug!(%peer, "admin endpoint: client too slow to send or take");
        }
    }
}

/// The answer to one request.
async fn answer(
    request: Request<Incoming>,
    peer: SocketAddr,
    state: &dyn AdminState,
    surface: Surface,
    limits: Limits,
) -> Response<Full<Bytes>> {
    let method = request.method().clone();
    let Some(path) = target_path(request.uri()).map(str::to_owned) else {
        tracing::debug!(%peer, %method, target = %request.uri(), "admin request refused");
        return Reply::text(StatusCode::BAD_REQUEST, "bad request\n").into_response(false);
    };
    let reply = if !surface.serves(&path) {
        Reply::text(StatusCode::NOT_FOUND, "not found\n")
    } else if path == LOG_LEVEL && method == Method::PUT {
        put_log_level(request, peer, state, limits).await
    } else {
        route(&method, &path, state)
    };
    tracing::debug!(%peer, %method, path, status = reply.status.as_u16(), "admin request");
    reply.into_response(method == Method::HEAD)
}

/// The path of a request target in origin form (`/metrics?x`) or absolute form
/// (`http://host/metrics`); `*` is passed through and simply matches no route. hyper lets
/// through what the `http` crate parses, which includes a bare authority (`healthz`, no path)
/// and an empty scheme (`://host/x`): those are `None`.
fn target_path(uri: &Uri) -> Option<&str> {
    let path = uri.path();
    let scheme_ok = uri.scheme_str().is_none_or(|s| !s.is_empty());
    (scheme_ok && (path.starts_with('/') || path == "*")).then_some(path)
}

fn route(method: &Method, path: &str, state: &dyn AdminState) -> Reply {
    let known = matches!(
        path,
        "/healthz" | "/readyz" | "/metrics" | "/debug/config" | "/debug/model" | LOG_LEVEL
    );
    if !known {
        return Reply::text(StatusCode::NOT_FOUND, "not found\n");
    }
    if !matches!(*method, Method::GET | Method::HEAD) {
        let mut reply = Reply::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        reply.allow = Some(if path == LOG_LEVEL {
            "GET, HEAD, PUT"
        } else {
            "GET, HEAD"
        });
        return reply;
    }
    match path {
        LOG_LEVEL => match state.log_control() {
            Some(control) => Reply::text(StatusCode::OK, &format!("{}\n", control.current())),
            None => Reply::text(
                StatusCode::NOT_FOUND,
                "the log level cannot be changed in this process\n",
            ),
        },
        "/healthz" => Reply::text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            let (status, detail) = match state.readiness() {
                Ok(detail) => (StatusCode::OK, detail),
                Err(detail) => (StatusCode::SERVICE_UNAVAILABLE, detail),
            };
            Reply::new(status, JSON, format!("{detail}\n"))
        }
        "/metrics" => Reply::new(StatusCode::OK, PROMETHEUS, state.metrics()),
        "/debug/config" => match state.config() {
            Some(config) => Reply::new(StatusCode::OK, TEXT, config),
            None => Reply::text(StatusCode::NOT_FOUND, "no configuration applied yet\n"),
        },
        // Only "/debug/model" is left among the known paths.
        _ => match state.model() {
            Some(model) => Reply::new(StatusCode::OK, JSON, model),
            None => Reply::text(StatusCode::NOT_FOUND, "no model applied yet\n"),
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
    request: Request<Incoming>,
    peer: SocketAddr,
    state: &dyn AdminState,
    limits: Limits,
) -> Reply {
    if !may_change_state(peer) {
        tracing::warn!(%peer, "admin endpoint: log level change refused: not from loopback");
        return Reply::text(
            StatusCode::FORBIDDEN,
            "the log level can only be changed from a loopback address\n",
        );
    }
    let Some(control) = state.log_control() else {
        return Reply::text(
            StatusCode::NOT_FOUND,
            "the log level cannot be changed in this process\n",
        );
    };
    let headers = request.headers();
    // hyper has checked the framing: with a Content-Length and no Transfer-Encoding, the
    // body's exact size is that length.
    let length = request.body().size_hint().exact();
    let (false, true, Some(length)) = (
        headers.contains_key(header::TRANSFER_ENCODING),
        headers.contains_key(header::CONTENT_LENGTH),
        length,
    ) else {
        return Reply::text(
            StatusCode::LENGTH_REQUIRED,
            "send the filter with a Content-Length\n",
        );
    };
    if length > MAX_BODY as u64 {
        return Reply::text(StatusCode::PAYLOAD_TOO_LARGE, "the filter is too long\n");
    }
    let body = Limited::new(request.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(limits.read_timeout, body).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(_)) => return Reply::text(StatusCode::BAD_REQUEST, "the body ended early\n"),
        Err(_) => return Reply::text(StatusCode::REQUEST_TIMEOUT, "request timeout\n"),
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return Reply::text(StatusCode::BAD_REQUEST, "the filter is not UTF-8 text\n");
    };
    let filter = text.trim();
    if filter.is_empty() {
        return Reply::text(
            StatusCode::BAD_REQUEST,
            "send a filter, e.g. `info` or `portcullis=debug`\n",
        );
    }
    let old = control.current();
    match control.set(filter) {
        Ok(new) => {
            tracing::info!(%peer, from = %old, to = %new, "log filter changed");
            Reply::text(StatusCode::OK, &format!("{new}\n"))
        }
        Err(error) => Reply::text(
            StatusCode::BAD_REQUEST,
            &format!("invalid filter, the filter in force is still {old:?}: {error}\n"),
        ),
    }
}

/// An answer before it becomes a hyper response.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    content_type: &'static str,
    body: String,
    /// The methods sent in `Allow` (with 405).
    allow: Option<&'static str>,
}

impl Reply {
    fn new(status: StatusCode, content_type: &'static str, body: String) -> Self {
        Self {
            status,
            content_type,
            body,
            allow: None,
        }
    }

    fn text(status: StatusCode, body: &str) -> Self {
        Self::new(status, TEXT, body.to_owned())
    }

    /// The response. A HEAD response carries the headers a GET would, without the body.
    fn into_response(self, head_only: bool) -> Response<Full<Bytes>> {
        let length = HeaderValue::from(self.body.len());
        let body = if head_only {
            Full::default()
        } else {
            Full::new(Bytes::from(self.body))
        };
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        // RFC 9110's name; the `http` crate still has the older "Payload Too Large".
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            response
                .extensions_mut()
                .insert(ReasonPhrase::from_static(b"Content Too Large"));
        }
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        );
        headers.insert(header::CONTENT_LENGTH, length);
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        if let Some(methods) = self.allow {
            headers.insert(header::ALLOW, HeaderValue::from_static(methods));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
        /// `/metrics` when set; a one-line exposition otherwise.
        metrics: Option<String>,
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
            self.metrics
                .clone()
                .unwrap_or_else(|| "# TYPE portcullis_ready gauge\nportcullis_ready 1\n".to_owned())
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
            metrics: None,
        }
    }

    /// A parsed response: status line, headers (names lowercased) and body.
    #[derive(Debug)]
    struct Wire {
        status_line: String,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Wire {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// Sends `raw`, reads until the server closes, and parses the reply.
    async fn exchange(addr: SocketAddr, raw: &[u8]) -> Wire {
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
        Wire {
            status_line,
            headers,
            body: body.to_owned(),
        }
    }

    async fn get(addr: SocketAddr, target: &str) -> Wire {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: admin\r\nUser-Agent: test\r\n\r\n");
        exchange(addr, raw.as_bytes()).await
    }

    /// Status line, content type, and a Content-Length that matches the body.
    fn check(reply: &Wire, status_line: &str, content_type: &str) {
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

    /// A request hyper refuses before any route sees it: the status line, and an empty body
    /// on a connection that closes.
    fn refused(reply: &Wire, status_line: &str) {
        assert_eq!(reply.status_line, status_line, "{reply:?}");
        assert_eq!(reply.header("connection"), Some("close"), "{reply:?}");
        assert_eq!(reply.header("content-length"), Some("0"), "{reply:?}");
        assert_eq!(reply.body, "", "{reply:?}");
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

        // An HTTP/1.0 client is answered in HTTP/1.0.
        let r = exchange(addr, b"DELETE /debug/config HTTP/1.0\r\n\r\n").await;
        check(&r, "HTTP/1.0 405 Method Not Allowed", TEXT);
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
        check(&r, "HTTP/1.0 200 OK", TEXT);
        assert_eq!(r.body, "ok\n");
        // Empty lines before the request line are skipped (RFC 9112, section 2.2).
        let r = exchange(server.addr, b"\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n").await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
    }

    #[tokio::test]
    async fn malformed_requests_get_400() {
        let server = start(applied(), LIMITS).await;
        let cases: &[&[u8]] = &[
            b"hello\r\n\r\n",
            b"GET /healthz\r\n\r\n",
            b"GET  /healthz HTTP/1.1\r\n\r\n",
            b"GET /healthz HTTP/1.1 extra\r\n\r\n",
            b"GET /healthz HTTP/2.0\r\n\r\n",
            b"G(T /healthz HTTP/1.1\r\n\r\n",
            b"GET /health\x01z HTTP/1.1\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n folded: x\r\n\r\n",
            b"\xff\xfe\x00\x01 / HTTP/1.1\r\n\r\n",
        ];
        for raw in cases {
            let r = exchange(server.addr, raw).await;
            refused(&r, "HTTP/1.1 400 Bad Request");
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
        refused(&r, "HTTP/1.1 431 Request Header Fields Too Large");

        // Complete but too long.
        raw.extend_from_slice(b"\r\n");
        let r = exchange(server.addr, &raw).await;
        refused(&r, "HTTP/1.1 431 Request Header Fields Too Large");

        // One long header, complete, a byte over.
        let mut raw = b"GET /healthz HTTP/1.1\r\nX-Filler: ".to_vec();
        raw.resize(MAX_HEAD - 3, b'a');
        raw.extend_from_slice(b"\r\n\r\n");
        let r = exchange(server.addr, &raw).await;
        refused(&r, "HTTP/1.1 431 Request Header Fields Too Large");

        // Just under the limit is fine.
        let mut raw = b"GET /healthz HTTP/1.1\r\nX-Filler: ".to_vec();
        raw.resize(MAX_HEAD - 4, b'a');
        raw.extend_from_slice(b"\r\n\r\n");
        assert_eq!(raw.len(), MAX_HEAD);
        let r = exchange(server.addr, &raw).await;
        check(&r, "HTTP/1.1 200 OK", TEXT);
    }

    #[tokio::test]
    async fn more_than_100_header_lines_get_431() {
        let server = start(applied(), LIMITS).await;
        let head = |lines: usize| {
            let mut raw = b"GET /healthz HTTP/1.1\r\n".to_vec();
            for i in 0..lines {
                raw.extend_from_slice(format!("X-{i}: a\r\n").as_bytes());
            }
            raw.extend_from_slice(b"\r\n");
            raw
        };
        check(
            &exchange(server.addr, &head(100)).await,
            "HTTP/1.1 200 OK",
            TEXT,
        );
        let r = exchange(server.addr, &head(101)).await;
        refused(&r, "HTTP/1.1 431 Request Header Fields Too Large");
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
        assert_eq!(r.body, "request timeout\n");
        // Silent from the start.
        let r = exchange(server.addr, b"").await;
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
        assert!(reply.ends_with("\r\n\r\nbad request\n"), "{reply}");
    }

    /// Sends `raw`, closes our side, and reads the answer.
    async fn send_and_close(addr: SocketAddr, raw: &[u8]) -> String {
        tokio::time::timeout(DEADLINE, async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(raw).await.unwrap();
            stream.shutdown().await.unwrap();
            let mut out = String::new();
            stream.read_to_string(&mut out).await.unwrap();
            out
        })
        .await
        .expect("no response before the deadline")
    }

    #[tokio::test]
    async fn half_closed_clients_are_answered() {
        let server = start(applied(), LIMITS).await;
        let reply = send_and_close(server.addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.ends_with("\r\n\r\nok\n"), "{reply}");

        // A body cut short changes nothing.
        let reply = send_and_close(
            server.addr,
            b"PUT /debug/log-level HTTP/1.1\r\nContent-Length: 10\r\n\r\ndebug",
        )
        .await;
        assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");
        assert!(reply.ends_with("\r\n\r\nthe body ended early\n"), "{reply}");
        assert_eq!(get(server.addr, LOG_LEVEL).await.body, "info\n");
    }

    #[tokio::test]
    async fn slow_body_times_out_with_408() {
        let limits = Limits {
            read_timeout: Duration::from_millis(200),
            ..LIMITS
        };
        let server = start(applied(), limits).await;
        let r = exchange(
            server.addr,
            b"PUT /debug/log-level HTTP/1.1\r\nContent-Length: 5\r\n\r\nde",
        )
        .await;
        check(&r, "HTTP/1.1 408 Request Timeout", TEXT);
        assert_eq!(r.body, "request timeout\n");
        assert_eq!(get(server.addr, LOG_LEVEL).await.body, "info\n");
    }

    #[tokio::test]
    async fn large_answers_arrive_whole() {
        // Far more than a socket's send buffer: the answer is written in many rounds.
        let metrics: String = (0..100_000)
            .map(|i| format!("portcullis_test{{n=\"{i}\"}} 1\n"))
            .collect();
        let server = start(
            Fake {
                metrics: Some(metrics.clone()),
                ..applied()
            },
            LIMITS,
        )
        .await;
        let r = get(server.addr, "/metrics").await;
        check(&r, "HTTP/1.1 200 OK", PROMETHEUS);
        assert!(
            r.body == metrics,
            "{} bytes of {}",
            r.body.len(),
            metrics.len()
        );
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

    #[tokio::test]
    async fn framing_and_targets_are_checked() {
        let server = start(applied(), LIMITS).await;
        let addr = server.addr;
        // A query and an absolute-form target with no path.
        check(
            &get(addr, "/metrics?x=1").await,
            "HTTP/1.1 200 OK",
            PROMETHEUS,
        );
        let r = get(addr, "https://h:1").await;
        check(&r, "HTTP/1.1 404 Not Found", TEXT);
        // Conflicting or malformed lengths.
        for raw in [
            &b"PUT /debug/log-level HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"[..],
            b"PUT /debug/log-level HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"PUT /debug/log-level HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        ] {
            let r = exchange(addr, raw).await;
            refused(&r, "HTTP/1.1 400 Bad Request");
        }
        // hyper takes these for an authority and an empty scheme.
        for target in ["healthz", "://h/healthz"] {
            check(&get(addr, target).await, "HTTP/1.1 400 Bad Request", TEXT);
        }
        assert_eq!(get(addr, LOG_LEVEL).await.body, "info\n");
    }
}
