//! The webhook's HTTPS endpoint: `POST /validate` with an AdmissionReview v1 of bounded size,
//! answered within a deadline. The serving certificate is read again when its files change
//! (cert-manager or a rotation job replacing the mounted Secret), without a restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::review::{self, ReviewConfig};
use crate::policy::PolicyEngine;

/// The largest AdmissionReview read. The API server sends the object twice at most (old and
/// new) and objects are at most about 1.5 MiB.
pub const MAX_BODY: usize = 3 << 20;

/// How the webhook serves.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The longest a review may take; the API server's own timeout should be longer.
    pub deadline: Duration,
    pub review: ReviewConfig,
}

/// Serves until `shutdown` completes. Fails only when the certificate cannot be read at start
/// or the address cannot be bound.
pub async fn serve(
    engine: Arc<PolicyEngine>,
    config: ServeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let certificate = Arc::new(ReloadingCertificate::load(
        config.cert_file.clone(),
        config.key_file.clone(),
    )?);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(certificate.clone());
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("binding {}: {e}", config.listen))?;
    tracing::info!(address = %config.listen, "admission webhook serving");
    let config = Arc::new(config);
    let refresh = {
        let certificate = certificate.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                certificate.refresh();
            }
        })
    };
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let engine = engine.clone();
        let config = config.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
            let stream = match handshake.await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper::service::service_fn(move |request| {
                let engine = engine.clone();
                let config = config.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(engine, &config, request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .max_buf_size(64 << 10)
                .serve_connection(TokioIo::new(stream), service);
            // A connection lives at most as long as a few reviews could.
            let _ = tokio::time::timeout(Duration::from_secs(60), connection).await;
        });
    }
    refresh.abort();
    Ok(())
}

async fn handle(
    engine: Arc<PolicyEngine>,
    config: &ServeConfig,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.uri().path() != "/validate" {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::POST {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview\n");
    }
    let declared = request
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return plain(StatusCode::PAYLOAD_TOO_LARGE, "too large\n");
    }
    let read = tokio::time::timeout(config.deadline, read_body(request.into_body())).await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(status)) => return plain(status, "too large or cut short\n"),
        Err(_) => return plain(StatusCode::REQUEST_TIMEOUT, "request timeout\n"),
    };
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return plain(StatusCode::BAD_REQUEST, "not JSON\n");
    };
    let review_config = config.review.clone();
    // The hooks are CPU work bounded by their budget; the deadline guards the rest.
    let work =
        tokio::task::spawn_blocking(move || review::answer(&engine, &review_config, &review));
    match tokio::time::timeout(config.deadline, work).await {
        Ok(Ok(Ok(answer))) => Response::builder()
            .status(StatusCode::OK)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(answer.to_string())))
            .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "\n")),
        Ok(Ok(Err(bad))) => plain(StatusCode::BAD_REQUEST, &format!("{bad}\n")),
        Ok(Err(_)) => plain(StatusCode::INTERNAL_SERVER_ERROR, "review failed\n"),
        // The API server applies the webhook's failurePolicy to a late answer anyway; say so
        // sooner.
        Err(_) => plain(StatusCode::SERVICE_UNAVAILABLE, "review not done in time\n"),
    }
}

/// A body of at most [`MAX_BODY`] bytes. Past the limit the rest is read and dropped, up to
/// as much again, so that the client is not reset before it reads the 413 (closing a socket
/// with unread input makes the kernel send a reset).
async fn read_body(mut body: Incoming) -> Result<Vec<u8>, StatusCode> {
    let mut out = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(StatusCode::BAD_REQUEST);
        };
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen <= MAX_BODY {
                out.extend_from_slice(&data);
            } else if seen > 2 * MAX_BODY {
                break;
            }
        }
    }
    if seen > MAX_BODY {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    Ok(out)
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_string())));
    *response.status_mut() = status;
    response
}

/// The serving certificate, read again when either file's modification time changes. A pair
/// that does not load keeps the last good one in service.
#[derive(Debug)]
struct ReloadingCertificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, [Option<SystemTime>; 2])>,
}

impl ReloadingCertificate {
    fn load(cert_file: PathBuf, key_file: PathBuf) -> Result<Self, String> {
        let stamps = stamps(&cert_file, &key_file);
        let key = certified_key(&cert_file, &key_file)?;
        Ok(Self {
            cert_file,
            key_file,
            current: RwLock::new((key, stamps)),
        })
    }

    fn refresh(&self) {
        let now = stamps(&self.cert_file, &self.key_file);
        let known = self.current.read().map(|c| c.1).unwrap_or_default();
        if now == known {
            return;
        }
        match certified_key(&self.cert_file, &self.key_file) {
            Ok(key) => {
                if let Ok(mut current) = self.current.write() {
                    *current = (key, now);
                }
                tracing::info!("admission webhook certificate reloaded");
            }
            Err(e) => tracing::warn!("admission webhook certificate not reloaded: {e}"),
        }
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.0.clone())
    }
}

fn stamps(cert: &std::path::Path, key: &std::path::Path) -> [Option<SystemTime>; 2] {
    [cert, key].map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
}

fn certified_key(
    cert_file: &std::path::Path,
    key_file: &std::path::Path,
) -> Result<Arc<CertifiedKey>, String> {
    let read = |f: &std::path::Path| std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert_file)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate", cert_file.display()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key_file)?)
        .map_err(|e| format!("{}: {e}", key_file.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map(Arc::new)
        .map_err(|e| format!("{}: {e}", key_file.display()))
}
