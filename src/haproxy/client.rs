//! A client for HAProxy's runtime API and master CLI over a Unix socket.
//!
//! One connection per command: send the line, half-close, read the answer to the end. The
//! half-close matters for the master CLI, which otherwise keeps the connection open. Every call
//! has a timeout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::command::{Command, CommandError};

/// Answers longer than this are cut (a `show map` of a huge map, say).
const MAX_ANSWER: usize = 64 << 20;

/// Lines longer than this end an answer read line by line with an error: HAProxy writes none.
const MAX_LINE: usize = 1 << 20;

/// A command did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Invalid(#[from] CommandError),
    #[error("connecting to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{command} on {path}: {source}")]
    Io {
        command: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{command} on {path}: no answer within {timeout:?}")]
    Timeout {
        command: String,
        path: PathBuf,
        timeout: Duration,
    },
    /// HAProxy answered with an error; its words are kept.
    #[error("{command}: HAProxy answered: {answer}")]
    Rejected { command: String, answer: String },
}

/// A runtime API or master CLI socket.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    timeout: Duration,
}

impl Client {
    pub fn new(path: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            path: path.into(),
            timeout,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends a typed command and checks HAProxy's answer.
    pub async fn execute(&self, command: &Command) -> Result<String, ClientError> {
        let wire = command.to_wire()?;
        let answer = self.exchange(&command.to_string(), &wire).await?;
        if command.answer_is_error(&answer) {
            return Err(ClientError::Rejected {
                command: command.to_string(),
                answer: answer.trim().to_string(),
            });
        }
        Ok(answer)
    }

    /// Sends a typed command and gives each line of HAProxy's answer to `each`, as it is
    /// read: an answer of hundreds of thousands of lines (`show servers state` at 10 000
    /// backends is some 40 MB) is never held whole. An answer whose first line says the
    /// command failed is an error, and `each` sees none of it.
    pub async fn execute_lines(
        &self,
        command: &Command,
        mut each: impl FnMut(&str) + Send,
    ) -> Result<(), ClientError> {
        let wire = command.to_wire()?;
        let label = command.to_string();
        let work = async {
            let stream = self.send(&label, &wire).await?;
            let mut reader = tokio::io::BufReader::new(stream);
            let mut line = Vec::new();
            let mut first = true;
            loop {
                line.clear();
                let read = (&mut reader)
                    .take(MAX_LINE as u64)
                    .read_until(b'\n', &mut line)
                    .await
                    .map_err(|e| self.io_error(&label, e))?;
                if read == 0 {
                    return Ok(());
                }
                if read == MAX_LINE && line.last() != Some(&b'\n') {
                    let long = std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("an answer line longer than {MAX_LINE} bytes"),
                    );
                    return Err(self.io_error(&label, long));
                }
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                if first {
                    first = false;
                    if command.answer_is_error(text) {
                        return Err(ClientError::Rejected {
                            command: label.clone(),
                            answer: text.trim().to_string(),
                        });
                    }
                }
                each(text);
            }
        };
        self.timed(&label, work).await
    }

    async fn exchange(&self, label: &str, wire: &str) -> Result<String, ClientError> {
        let work = async {
            let mut stream = self.send(label, wire).await?;
            let mut answer = Vec::new();
            (&mut stream)
                .take(MAX_ANSWER as u64)
                .read_to_end(&mut answer)
                .await
                .map_err(|e| self.io_error(label, e))?;
            // Not copied when it is UTF-8, as HAProxy's answers are.
            Ok(String::from_utf8(answer)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
        };
        self.timed(label, work).await
    }

    /// Connects, sends `wire` and half-closes: the stream then holds the answer.
    async fn send(&self, label: &str, wire: &str) -> Result<UnixStream, ClientError> {
        let mut stream =
            UnixStream::connect(&self.path)
                .await
                .map_err(|source| ClientError::Connect {
                    path: self.path.clone(),
                    source,
                })?;
        stream
            .write_all(wire.as_bytes())
            .await
            .map_err(|e| self.io_error(label, e))?;
        stream
            .shutdown()
            .await
            .map_err(|e| self.io_error(label, e))?;
        Ok(stream)
    }

    fn io_error(&self, label: &str, source: std::io::Error) -> ClientError {
        ClientError::Io {
            command: label.to_string(),
            path: self.path.clone(),
            source,
        }
    }

    /// `work` within the client's timeout.
    async fn timed<T>(
        &self,
        label: &str,
        work: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| ClientError::Timeout {
                command: label.to_string(),
                path: self.path.clone(),
                timeout: self.timeout,
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// A socket that answers every connection with `answer`, after reading the command.
    fn serve(answer: Vec<u8>) -> (tempfile::TempDir, Client) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut command = Vec::new();
                let _ = stream.read_to_end(&mut command).await;
                let _ = stream.write_all(&answer).await;
            }
        });
        (dir, Client::new(path, Duration::from_secs(10)))
    }

    #[tokio::test]
    async fn answers_are_read_line_by_line() {
        let mut answer = b"1\n# be_id be_name srv_id srv_name\n".to_vec();
        for i in 0..50_000 {
            answer.extend_from_slice(format!("3 be 1 SRV_{i} 10.0.0.1\r\n").as_bytes());
        }
        answer.extend_from_slice(b"last without newline");
        let (_dir, client) = serve(answer);
        let mut lines = Vec::new();
        client
            .execute_lines(&Command::ShowServersState, |l| lines.push(l.to_string()))
            .await
            .unwrap();
        assert_eq!(lines.len(), 50_003);
        assert_eq!(lines[0], "1");
        assert_eq!(lines[2], "3 be 1 SRV_0 10.0.0.1");
        assert_eq!(lines[50_001], "3 be 1 SRV_49999 10.0.0.1");
        assert_eq!(lines[50_002], "last without newline");
    }

    #[tokio::test]
    async fn a_refusal_or_an_endless_line_is_an_error() {
        let (_dir, client) = serve(b"Unknown command.\nmore\n".to_vec());
        let mut seen = 0;
        let refused = client
            .execute_lines(&Command::ShowServersState, |_| seen += 1)
            .await;
        assert!(
            matches!(&refused, Err(ClientError::Rejected { answer, .. }) if answer == "Unknown command."),
            "{refused:?}"
        );
        assert_eq!(seen, 0);
        let (_dir, client) = serve(vec![b'x'; MAX_LINE + 10]);
        let endless = client
            .execute_lines(&Command::ShowServersState, |_| seen += 1)
            .await;
        assert!(
            matches!(endless, Err(ClientError::Io { .. })),
            "{endless:?}"
        );
        assert_eq!(seen, 0);
    }
}
