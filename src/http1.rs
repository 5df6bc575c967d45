//! One HTTP/1 request per connection, served by hyper: what the admin endpoint and the demo's
//! echo servers share.
//!
//! hyper reads and checks the request head, answers a malformed one (400) or one over the size
//! limit (431), and writes what the service answers. It ends two kinds of connection in
//! silence where a client is owed an answer: a head not complete in time (408), and a head the
//! client cut short by closing its side (400). [`serve_one`] takes the socket back from hyper
//! and writes the caller's answer for those. Then the connection is closed gracefully: our side
//! is shut down and what the client still sends is read and dropped, within bounds, because
//! closing a socket with unread input makes the kernel send a reset, which can destroy the
//! answer before the client reads it (a 431 to a head that was not read to its end, a body the
//! service did not want).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bounds on one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The largest request head (request line, headers and the blank line), in bytes.
    pub(crate) max_head: usize,
    /// How long the client may take to send the whole head.
    pub(crate) head_timeout: Duration,
    /// How long the whole exchange (head, body, answer) may take; then the connection is
    /// dropped without more ado.
    pub(crate) exchange_timeout: Duration,
    /// How long leftover input is read after answering, and how many bytes at most.
    pub(crate) linger_timeout: Duration,
    pub(crate) linger_max: usize,
}

/// Why hyper left a connection unanswered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// No complete head within [`Limits::head_timeout`].
    TimedOut,
    /// The client closed its side in the middle of the head.
    Truncated,
}

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The service answered, or the client left without asking anything.
    Served,
    /// hyper left the request unanswered; the caller's answer was sent.
    Answered(Unanswered),
    /// hyper refused the request (and answered it when HTTP allows), or the connection failed.
    Refused(hyper::Error),
    /// The exchange took longer than [`Limits::exchange_timeout`].
    TooSlow,
}

/// Serves one request on `stream` with `service`. `answer` gives the bytes sent when hyper
/// leaves the request unanswered (see [`plain`]).
pub(crate) async fn serve_one<S>(
    stream: TcpStream,
    service: S,
    limits: Limits,
    answer: impl FnOnce(Unanswered) -> Vec<u8>,
) -> Outcome
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>, Error = Infallible>,
{
    let mut connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_header_size(limits.max_head)
        .keep_alive(false)
        // A client may shut down its side once the request is sent, and still be answered.
        .half_close(true)
        .title_case_headers(true)
        .auto_date_header(false)
        .serve_connection(TokioIo::new(stream), service);
    let served = tokio::time::timeout(limits.exchange_timeout, &mut connection).await;
    let mut stream = connection.into_parts().io.into_inner();
    let outcome = match served {
        Err(_) => return Outcome::TooSlow,
        Ok(Ok(())) => Outcome::Served,
        Ok(Err(e)) if e.is_timeout() => Outcome::Answered(Unanswered::TimedOut),
        // With half-closes allowed, only a head cut short ends the connection this way.
        Ok(Err(e)) if e.is_incomplete_message() => Outcome::Answered(Unanswered::Truncated),
        Ok(Err(e)) => Outcome::Refused(e),
    };
    let close = async {
        if let Outcome::Answered(why) = outcome {
            if stream.write_all(&answer(why)).await.is_err() {
                return;
            }
        }
        // hyper has shut our side down when it answered; this is for the other cases.
        let _ = stream.shutdown().await;
        let mut scratch = [0u8; 4096];
        let mut drained = 0;
        while drained < limits.linger_max {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    };
    // A client that neither takes the answer nor closes is simply dropped.
    let _ = tokio::time::timeout(limits.linger_timeout, close).await;
    outcome
}

/// The wire form of a small answer written without hyper: `status`, `Content-Type`,
/// `Content-Length`, `Connection: close`, the `extra` headers, and `body`, in the order hyper
/// writes the answers of [`serve_one`]'s callers.
pub(crate) fn plain(
    status: StatusCode,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &str,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or_default(),
        body.len(),
    );
    for (name, value) in extra {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_answers_are_complete_http_messages() {
        let bytes = plain(
            StatusCode::REQUEST_TIMEOUT,
            "text/plain",
            &[("X-Served-By", "web-1")],
            "late\n",
        );
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\n\
             Content-Length: 5\r\nConnection: close\r\nX-Served-By: web-1\r\n\r\nlate\n"
        );
    }
}
