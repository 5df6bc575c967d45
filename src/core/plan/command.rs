//! Typed runtime API and master CLI commands.
//!
//! Every argument is checked before it is put on the wire: the CLI splits commands on `;` and
//! lines, and words on spaces, so an argument holding any of them would be an injection. A
//! command that cannot be expressed safely is refused with [`CommandError`], and the caller
//! falls back to writing the change to disk and reloading.

use std::fmt;
use std::net::IpAddr;

/// A server's administrative state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    Ready,
    Drain,
    Maint,
}

impl ServerState {
    fn as_str(self) -> &'static str {
        match self {
            ServerState::Ready => "ready",
            ServerState::Drain => "drain",
            ServerState::Maint => "maint",
        }
    }
}

/// A command for the runtime API (stats socket) or the master CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Master CLI: processes with reload counters.
    ShowProc,
    /// Master CLI: reload (2.6 answers nothing; 2.7+ answers `Success=`).
    Reload,
    ShowInfo,
    /// Every server's address, port and states.
    ShowServersState,
    SetServerAddr {
        backend: String,
        server: String,
        addr: IpAddr,
        port: u16,
    },
    SetServerState {
        backend: String,
        server: String,
        state: ServerState,
    },
    /// A dynamic server: `add server <backend>/<server> <addr>:<port> id <id> <keywords…>`.
    /// HAProxy adds it in maintenance, with its health checks off.
    AddServer {
        backend: String,
        server: String,
        addr: IpAddr,
        port: u16,
        id: u32,
        /// What the backend's `default-server` line gives static servers (dynamic ones
        /// inherit nothing).
        keywords: Vec<String>,
    },
    /// Deletes a dynamic server; HAProxy refuses while it is not in maintenance or still has
    /// connections.
    DelServer {
        backend: String,
        server: String,
    },
    EnableHealth {
        backend: String,
        server: String,
    },
    /// Gives every server of a backend with dynamic cookies its cookie: HAProxy 2.6 computes
    /// none for a server added at run time.
    EnableDynamicCookie {
        backend: String,
    },
    /// Closes every stream on a server (a drain that ran out of time).
    ShutdownSessions {
        backend: String,
        server: String,
    },
    AddMap {
        map: String,
        key: String,
        value: String,
    },
    SetMap {
        map: String,
        key: String,
        value: String,
    },
    DelMap {
        map: String,
        key: String,
    },
    NewSslCert {
        path: String,
    },
    /// Starts (or updates) a certificate transaction with PEM content.
    SetSslCert {
        path: String,
        pem: String,
    },
    CommitSslCert {
        path: String,
    },
    AbortSslCert {
        path: String,
    },
    DelSslCert {
        path: String,
    },
    AddSslCrtList {
        crt_list: String,
        path: String,
        sni: Vec<String>,
    },
    DelSslCrtList {
        crt_list: String,
        path: String,
    },
}

/// A command argument that cannot be sent safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing to send {command}: argument {argument:?} {reason}")]
pub struct CommandError {
    pub command: &'static str,
    pub argument: String,
    pub reason: &'static str,
}

impl Command {
    /// A short name for metrics and messages.
    pub fn name(&self) -> &'static str {
        match self {
            Command::ShowProc => "show proc",
            Command::Reload => "reload",
            Command::ShowInfo => "show info",
            Command::ShowServersState => "show servers state",
            Command::SetServerAddr { .. } => "set server addr",
            Command::SetServerState { .. } => "set server state",
            Command::AddServer { .. } => "add server",
            Command::DelServer { .. } => "del server",
            Command::EnableHealth { .. } => "enable health",
            Command::EnableDynamicCookie { .. } => "enable dynamic-cookie backend",
            Command::ShutdownSessions { .. } => "shutdown sessions server",
            Command::AddMap { .. } => "add map",
            Command::SetMap { .. } => "set map",
            Command::DelMap { .. } => "del map",
            Command::NewSslCert { .. } => "new ssl cert",
            Command::SetSslCert { .. } => "set ssl cert",
            Command::CommitSslCert { .. } => "commit ssl cert",
            Command::AbortSslCert { .. } => "abort ssl cert",
            Command::DelSslCert { .. } => "del ssl cert",
            Command::AddSslCrtList { .. } => "add ssl crt-list",
            Command::DelSslCrtList { .. } => "del ssl crt-list",
        }
    }

    /// The text to send, ending with a newline.
    pub fn to_wire(&self) -> Result<String, CommandError> {
        let name = self.name();
        let w = |arg: &str| word(name, arg);
        let line = match self {
            Command::ShowProc | Command::Reload | Command::ShowInfo | Command::ShowServersState => {
                format!("{name}\n")
            }
            Command::SetServerAddr {
                backend,
                server,
                addr,
                port,
            } => format!(
                "set server {}/{} addr {addr} port {port}\n",
                w(backend)?,
                w(server)?
            ),
            Command::SetServerState {
                backend,
                server,
                state,
            } => format!(
                "set server {}/{} state {}\n",
                w(backend)?,
                w(server)?,
                state.as_str()
            ),
            Command::AddServer {
                backend,
                server,
                addr,
                port,
                id,
                keywords,
            } => {
                let mut line = match addr {
                    IpAddr::V4(v4) => {
                        format!("add server {}/{} {v4}:{port}", w(backend)?, w(server)?)
                    }
                    IpAddr::V6(v6) => {
                        format!("add server {}/{} [{v6}]:{port}", w(backend)?, w(server)?)
                    }
                };
                line.push_str(&format!(" id {id}"));
                for keyword in keywords {
                    line.push(' ');
                    line.push_str(&w(keyword)?);
                }
                line.push('\n');
                line
            }
            Command::DelServer { backend, server } => {
                format!("del server {}/{}\n", w(backend)?, w(server)?)
            }
            Command::EnableHealth { backend, server } => {
                format!("enable health {}/{}\n", w(backend)?, w(server)?)
            }
            Command::EnableDynamicCookie { backend } => {
                format!("enable dynamic-cookie backend {}\n", w(backend)?)
            }
            Command::ShutdownSessions { backend, server } => {
                format!("shutdown sessions server {}/{}\n", w(backend)?, w(server)?)
            }
            Command::AddMap { map, key, value } => {
                format!("add map {} {} {}\n", w(map)?, w(key)?, w(value)?)
            }
            Command::SetMap { map, key, value } => {
                format!("set map {} {} {}\n", w(map)?, w(key)?, w(value)?)
            }
            Command::DelMap { map, key } => format!("del map {} {}\n", w(map)?, w(key)?),
            Command::NewSslCert { path } => format!("new ssl cert {}\n", w(path)?),
            Command::SetSslCert { path, pem } => {
                format!("set ssl cert {} <<\n{}\n\n", w(path)?, payload(name, pem)?)
            }
            Command::CommitSslCert { path } => format!("commit ssl cert {}\n", w(path)?),
            Command::AbortSslCert { path } => format!("abort ssl cert {}\n", w(path)?),
            Command::DelSslCert { path } => format!("del ssl cert {}\n", w(path)?),
            Command::AddSslCrtList {
                crt_list,
                path,
                sni,
            } => {
                let mut entry = w(path)?;
                for s in sni {
                    entry.push(' ');
                    entry.push_str(&w(s)?);
                }
                format!("add ssl crt-list {} <<\n{entry}\n\n", w(crt_list)?)
            }
            Command::DelSslCrtList { crt_list, path } => {
                format!("del ssl crt-list {} {}\n", w(crt_list)?, w(path)?)
            }
        };
        Ok(line)
    }

    /// Whether HAProxy's answer means the command failed. The runtime API has no status
    /// codes: successful commands answer nothing or one of a few known phrases.
    pub fn answer_is_error(&self, answer: &str) -> bool {
        let a = answer.trim();
        match self {
            Command::ShowProc | Command::ShowInfo | Command::Reload => false,
            Command::ShowServersState => !a.starts_with('1'),
            Command::SetServerAddr { .. } => {
                !(a.is_empty() || a.contains("changed") || a.contains("no need to change"))
            }
            Command::AddServer { .. } => !a.starts_with("New server registered"),
            Command::DelServer { .. } => !a.starts_with("Server deleted"),
            Command::SetServerState { .. }
            | Command::EnableHealth { .. }
            | Command::EnableDynamicCookie { .. }
            | Command::ShutdownSessions { .. }
            | Command::AddMap { .. }
            | Command::SetMap { .. }
            | Command::DelMap { .. } => !a.is_empty(),
            Command::NewSslCert { .. } => !a.starts_with("New empty certificate store"),
            Command::SetSslCert { .. } => !a.starts_with("Transaction"),
            Command::CommitSslCert { .. } | Command::AddSslCrtList { .. } => {
                !a.contains("Success!")
            }
            Command::AbortSslCert { .. } => !a.contains("aborted"),
            Command::DelSslCert { .. } => !a.contains("deleted"),
            Command::DelSslCrtList { .. } => !a.contains("deleted"),
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_wire() {
            // Payloads are not shown: they may hold private keys.
            Ok(line) => write!(f, "{}", line.lines().next().unwrap_or_default()),
            Err(_) => write!(f, "{} (invalid)", self.name()),
        }
    }
}

/// One word: non-empty, printable, no spaces, no `;` (command separator), no `#`, at most
/// 4096 bytes.
fn word(command: &'static str, arg: &str) -> Result<String, CommandError> {
    let refuse = |reason| CommandError {
        command,
        argument: arg.to_string(),
        reason,
    };
    if arg.is_empty() {
        return Err(refuse("is empty"));
    }
    if arg.len() > 4096 {
        return Err(refuse("is too long"));
    }
    if arg.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(refuse("contains whitespace or a control character"));
    }
    if arg.contains(';') || arg.contains('#') || arg.contains('\\') {
        return Err(refuse(
            "contains ';', '#' or '\\', which the CLI would interpret",
        ));
    }
    Ok(arg.to_string())
}

/// A multi-line payload: ends at the first empty line, so it must not contain one.
fn payload<'a>(command: &'static str, text: &'a str) -> Result<&'a str, CommandError> {
    let text = text.trim_end_matches('\n');
    let bad = text.is_empty()
        || text.lines().any(|l| l.trim().is_empty())
        || text.chars().any(|c| c.is_control() && c != '\n');
    if bad {
        return Err(CommandError {
            command,
            argument: "<payload>".to_string(),
            reason: "is empty, holds an empty line or a control character",
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injections_are_refused() {
        for bad in [
            "a;shutdown sessions",
            "a b",
            "a\nshow info",
            "",
            "a#b",
            "a\\;b",
        ] {
            let cmd = Command::AddMap {
                map: "maps/exact.map".into(),
                key: bad.into(),
                value: "be".into(),
            };
            assert!(cmd.to_wire().is_err(), "{bad:?}");
        }
        let cert = Command::SetSslCert {
            path: "certs/a.pem".into(),
            pem: "-----BEGIN X-----\n\nshow info\n-----END X-----".into(),
        };
        assert!(cert.to_wire().is_err());
    }

    #[test]
    fn wire_format() {
        let cmd = Command::SetServerAddr {
            backend: "ns_web_80".into(),
            server: "SRV_3".into(),
            addr: "10.0.0.1".parse().unwrap(),
            port: 8080,
        };
        assert_eq!(
            cmd.to_wire().unwrap(),
            "set server ns_web_80/SRV_3 addr 10.0.0.1 port 8080\n"
        );
        let v6 = Command::SetServerAddr {
            backend: "b".into(),
            server: "s".into(),
            addr: "2001:db8::1".parse().unwrap(),
            port: 80,
        };
        assert_eq!(
            v6.to_wire().unwrap(),
            "set server b/s addr 2001:db8::1 port 80\n"
        );
        let add = Command::AddSslCrtList {
            crt_list: "certs/crt-list.txt".into(),
            path: "certs/a.pem".into(),
            sni: vec!["a.example.com".into()],
        };
        assert_eq!(
            add.to_wire().unwrap(),
            "add ssl crt-list certs/crt-list.txt <<\ncerts/a.pem a.example.com\n\n"
        );
    }

    #[test]
    fn dynamic_servers_on_the_wire() {
        let add = Command::AddServer {
            backend: "ns_web_80".into(),
            server: "SRV_77".into(),
            addr: "10.0.0.1".parse().unwrap(),
            port: 8080,
            id: 77,
            keywords: vec!["check".into(), "inter".into(), "2000".into()],
        };
        assert_eq!(
            add.to_wire().unwrap(),
            "add server ns_web_80/SRV_77 10.0.0.1:8080 id 77 check inter 2000\n"
        );
        assert!(!add.answer_is_error("New server registered."));
        assert!(add.answer_is_error("'cookie' option is not accepted for dynamic server"));
        let v6 = Command::AddServer {
            backend: "b".into(),
            server: "s".into(),
            addr: "2001:db8::1".parse().unwrap(),
            port: 80,
            id: 1,
            keywords: Vec::new(),
        };
        assert_eq!(
            v6.to_wire().unwrap(),
            "add server b/s [2001:db8::1]:80 id 1\n"
        );
        let hostile = Command::AddServer {
            backend: "b".into(),
            server: "s".into(),
            addr: "10.0.0.1".parse().unwrap(),
            port: 80,
            id: 1,
            keywords: vec!["check;shutdown".into()],
        };
        assert!(hostile.to_wire().is_err());
        let del = Command::DelServer {
            backend: "b".into(),
            server: "s".into(),
        };
        assert_eq!(del.to_wire().unwrap(), "del server b/s\n");
        assert!(!del.answer_is_error("Server deleted."));
        assert!(
            del.answer_is_error("Server still has connections attached to it, cannot remove it.")
        );
    }

    #[test]
    fn answers() {
        let state = Command::SetServerState {
            backend: "b".into(),
            server: "s".into(),
            state: ServerState::Ready,
        };
        assert!(!state.answer_is_error(""));
        assert!(state.answer_is_error("No such server."));
    }
}
