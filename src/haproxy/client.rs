//! A client for HAProxy's runtime API and master CLI over a Unix socket.
//!
//! One connection per command: send the line, half-close, read the answer to the end. The
//! half-close matters for the master CLI, which otherwise keeps the connection open. Every call
//! has a timeout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::command::{Command, CommandError};

/// Answers longer than this are cut (a `show map` of a huge map, say).
const MAX_ANSWER: usize = 64 << 20;

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

    async fn exchange(&self, label: &str, wire: &str) -> Result<String, ClientError> {
        let io = |source| ClientError::Io {
            command: label.to_string(),
            path: self.path.clone(),
            source,
        };
        let work = async {
            let mut stream =
                UnixStream::connect(&self.path)
                    .await
                    .map_err(|source| ClientError::Connect {
                        path: self.path.clone(),
                        source,
                    })?;
            stream.write_all(wire.as_bytes()).await.map_err(io)?;
            stream.shutdown().await.map_err(io)?;
            let mut answer = Vec::new();
            (&mut stream)
                .take(MAX_ANSWER as u64)
                .read_to_end(&mut answer)
                .await
                .map_err(io)?;
            Ok(String::from_utf8_lossy(&answer).into_owned())
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| ClientError::Timeout {
                command: label.to_string(),
                path: self.path.clone(),
                timeout: self.timeout,
            })?
    }
}
