//! The HAProxy master-worker process: starting it, reloading it through the master CLI and
//! verifying that the reload took, and stopping it.
//!
//! HAProxy 2.6 answers nothing to `reload`; 2.7 and later answer `Success=0|1`. Verification
//! therefore reads `show proc` before and after: the master's reload counter must move, and
//! its failed-reload counter must not.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command as Process};
use tokio::sync::mpsc::UnboundedSender;

use super::client::{Client, ClientError};
use super::command::Command;

/// The shortest and longest pause of the reader of HAProxy's output after a read. HAProxy
/// writes each request log line on its own. A reader woken for every line (and the runtime's
/// event loop, woken by every write to a pipe it watches) cost about 5 µs of CPU per request,
/// taken from the data plane on a small machine; a reader pausing 2 ms after each read still
/// cost 1.2–2 µs a request at 20 000 requests a second, nearly all of it per read (waking,
/// reading, writing), not per line. See [`output_pace`].
const OUTPUT_PACE_MIN: Duration = Duration::from_millis(2);
const OUTPUT_PACE_MAX: Duration = Duration::from_millis(20);

/// The capacity asked for the pipe of HAProxy's stdout, where its request log goes (Linux
/// grants up to `/proc/sys/fs/pipe-max-size`, 1 MiB by default, to any process): room for the
/// reader's longer pauses.
const OUTPUT_PIPE_CAPACITY: usize = 1 << 20;

/// How long the reader pauses after a read of `read` bytes that came `since` after the read
/// before: long enough for about a quarter of the pipe's `capacity` to gather at that rate,
/// between [`OUTPUT_PACE_MIN`] and [`OUTPUT_PACE_MAX`]. HAProxy drops a log line it cannot
/// write, so the pipe must not fill: at the rate of the last read it holds a quarter of its
/// capacity when the reader comes back, leaving room for the rate to quadruple meanwhile.
/// The longest pause shrinks with a smaller pipe (a burst after a quiet spell is not
/// foreseen by the last rate): a default 64 KiB pipe gets the 2 ms it always had.
fn output_pace(read: usize, since: Duration, capacity: usize) -> Duration {
    let longest = OUTPUT_PACE_MAX
        .mul_f64((capacity as f64 / OUTPUT_PIPE_CAPACITY as f64).min(1.0))
        .max(OUTPUT_PACE_MIN);
    if read == 0 {
        return longest;
    }
    let secs = since.as_secs_f64() * (capacity / 4) as f64 / read as f64;
    Duration::from_secs_f64(secs.min(longest.as_secs_f64())).clamp(OUTPUT_PACE_MIN, longest)
}

/// Logs HAProxy's output (stdout or stderr) line by line under the `haproxy` target, and sends
/// each line to `start_up` while someone is listening there, until the end of the stream.
/// Blocking reads on a thread of its own: an idle pipe costs nothing. The lines of one read
/// reach the log with one write (`logwriter::batch`). Bytes that are not UTF-8
/// (a request log can carry them) are replaced, never a reason to stop reading, since a pipe
/// left unread would silence HAProxy's log.
fn forward_output(
    mut stream: impl std::io::Read,
    which: Stream,
    capacity: usize,
    start_up: &UnboundedSender<String>,
    alerts: &std::sync::Mutex<Alerts>,
) {
    let mut buffer = vec![0u8; 256 * 1024];
    let mut pending = Vec::new();
    let mut last_read = std::time::Instant::now();
    loop {
        let read = match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let now = std::time::Instant::now();
        // A full buffer: more is waiting, read it at once.
        let pace = if read == buffer.len() {
            Duration::ZERO
        } else {
            output_pace(read, now - last_read, capacity)
        };
        last_read = now;
        pending.extend_from_slice(&buffer[..read]);
        let complete = pending
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        emit_output_lines(&pending[..complete], which, start_up, alerts);
        pending.drain(..complete);
        std::thread::sleep(pace);
    }
    emit_output_lines(&pending, which, start_up, alerts);
}

/// Which of HAProxy's output streams a reader reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// `log stdout`: the request log, and what HAProxy also logs about its proxies.
    Stdout,
    /// HAProxy's own messages, `[NOTICE]`, `[WARNING]`, `[ALERT]` with its process id.
    Stderr,
}

/// HAProxy's `[ALERT]` lines as they were read from its stderr, numbered, the last
/// [`KEPT_ALERTS`] kept: what a reload that failed said, so that its verdict can be traced to
/// the objects it names (`attribution`).
#[derive(Debug, Default)]
pub struct Alerts {
    next: u64,
    lines: std::collections::VecDeque<(u64, String)>,
}

/// How many `[ALERT]` lines [`Alerts`] keeps.
const KEPT_ALERTS: usize = 64;

impl Alerts {
    fn push(&mut self, line: String) {
        if self.lines.len() == KEPT_ALERTS {
            self.lines.pop_front();
        }
        self.lines.push_back((self.next, line));
        self.next += 1;
    }

    /// Where the lines stand now: [`Alerts::since`] this mark gives the lines read after it.
    pub fn mark(&self) -> u64 {
        self.next
    }

    /// The lines read since `mark`, oldest first.
    pub fn since(&self, mark: u64) -> Vec<String> {
        self.lines
            .iter()
            .filter(|(n, _)| *n >= mark)
            .map(|(_, l)| l.clone())
            .collect()
    }
}

/// Whether a line of the request log stream is one of HAProxy's notices about a proxy
/// starting, pausing or stopping. HAProxy writes those twice: to its log (`log stdout`) and,
/// with their severity and process id, to stderr; the stderr copy is the one kept.
fn proxy_notice(line: &[u8]) -> bool {
    const NOTICES: [&[u8]; 6] = [
        b"Proxy ",
        b"Stopping proxy ",
        b"Stopping frontend ",
        b"Stopping backend ",
        b"Pausing proxy ",
        b"Resuming proxy ",
    ];
    NOTICES.iter().any(|n| line.starts_with(n))
}

/// Logs the lines of `text` (one write for all) and sends them to `start_up` while someone
/// listens there.
fn emit_output_lines(
    text: &[u8],
    which: Stream,
    start_up: &UnboundedSender<String>,
    alerts: &std::sync::Mutex<Alerts>,
) {
    let lines = || {
        text.split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .filter(|line| !line.is_empty())
            .filter(move |line| which == Stream::Stderr || !proxy_notice(line))
    };
    if !start_up.is_closed() {
        for line in lines() {
            let _ = start_up.send(String::from_utf8_lossy(line).into_owned());
        }
    }
    if which == Stream::Stderr {
        let marker: &[u8] = b"[ALERT]";
        let mut alerts = alerts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for line in lines().filter(|l| l.windows(marker.len()).any(|w| w == marker)) {
            alerts.push(String::from_utf8_lossy(line).into_owned());
        }
    }
    if !tracing::enabled!(target: "haproxy", tracing::Level::INFO) {
        return;
    }
    crate::logwriter::batch(&mut std::io::stderr(), || {
        for line in lines() {
            tracing::info!(target: "haproxy", "{}", String::from_utf8_lossy(line));
        }
    });
}

/// Something went wrong with the HAProxy process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start {bin}: {source}")]
    Spawn { bin: String, source: std::io::Error },
    #[error("HAProxy exited during start-up ({status}): {output}")]
    ExitedAtStart { status: String, output: String },
    #[error("HAProxy's master CLI at {path} did not answer within {timeout:?}: {last_error}")]
    StartTimeout {
        path: PathBuf,
        timeout: Duration,
        last_error: String,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("unexpected `show proc` answer: {0}")]
    ShowProc(String),
    /// The new configuration did not load; the previous workers keep serving.
    #[error("reload failed: {0}")]
    ReloadFailed(String),
    #[error("reload not confirmed within {0:?}")]
    ReloadTimeout(Duration),
}

/// The master's view of itself, from `show proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStatus {
    pub master_pid: u32,
    pub reloads: u64,
    /// Failed reloads (2.6 prints `[failed: N]`; absent in some versions).
    pub failed: Option<u64>,
    pub workers: Vec<u32>,
}

/// Parses the master CLI's `show proc`.
pub fn parse_show_proc(text: &str) -> Result<ProcStatus, ProcessError> {
    let bad = || ProcessError::ShowProc(text.trim().to_string());
    let mut master = None;
    let mut workers = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let pid: u32 = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        match words.next() {
            Some("master") => {
                let reloads = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
                let failed = line
                    .split("[failed: ")
                    .nth(1)
                    .and_then(|rest| rest.split(']').next())
                    .and_then(|n| n.trim().parse().ok());
                master = Some((pid, reloads, failed));
            }
            Some("worker") => workers.push(pid),
            _ => {}
        }
    }
    let (master_pid, reloads, failed) = master.ok_or_else(bad)?;
    Ok(ProcStatus {
        master_pid,
        reloads,
        failed,
        workers,
    })
}

/// Reads `show proc` from the master CLI.
pub async fn show_proc(master: &Client) -> Result<ProcStatus, ProcessError> {
    parse_show_proc(&master.execute(&Command::ShowProc).await?)
}

/// Reloads through the master CLI and waits until the outcome is known.
pub async fn reload(master: &Client, timeout: Duration) -> Result<ProcStatus, ProcessError> {
    let before = show_proc(master).await?;
    let answer = master.execute(&Command::Reload).await?;
    if answer.contains("Success=0") {
        return Err(ProcessError::ReloadFailed(answer.trim().to_string()));
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        // The master re-executes itself: its socket may refuse connections for a moment.
        if let Ok(now) = show_proc(master).await {
            if now.reloads > before.reloads {
                if now.failed.unwrap_or(0) > before.failed.unwrap_or(0) {
                    return Err(ProcessError::ReloadFailed(
                        "HAProxy could not load the new configuration; the previous workers keep serving"
                            .to_string(),
                    ));
                }
                if answer.contains("Success=1") || !now.workers.is_empty() {
                    return Ok(now);
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ProcessError::ReloadTimeout(timeout));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A master-worker HAProxy started and owned by Portcullis.
#[derive(Debug)]
pub struct Haproxy {
    child: Child,
    master: Client,
    /// The `[ALERT]` lines HAProxy wrote, kept by the stderr reader.
    alerts: std::sync::Arc<std::sync::Mutex<Alerts>>,
}

impl Haproxy {
    /// Starts `bin -W -db -S <master_socket> -f <config>` and waits until the master CLI
    /// reports a worker. HAProxy's own output is passed to our log.
    pub async fn start(
        bin: &str,
        config: &Path,
        master_socket: &Path,
        timeout: Duration,
    ) -> Result<Self, ProcessError> {
        let _ = std::fs::remove_file(master_socket);
        // Absolute, since HAProxy runs in the configuration's directory.
        let config = &std::path::absolute(config).unwrap_or_else(|_| config.to_path_buf());
        let master_socket =
            &std::path::absolute(master_socket).unwrap_or_else(|_| master_socket.to_path_buf());
        let mut process = Process::new(bin);
        // HAProxy 2.6 reads servers' client certificates (`server-crt`) relative to its working
        // directory rather than `default-path config`.
        if let Some(dir) = config.parent().filter(|d| !d.as_os_str().is_empty()) {
            process.current_dir(dir);
        }
        process
            .arg("-W")
            .arg("-db")
            .arg("-S")
            .arg(format!("{},mode,600", master_socket.display()))
            .arg("-f")
            .arg(config)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let spawn_error = |source| ProcessError::Spawn {
            bin: bin.to_string(),
            source,
        };
        // Our own blocking pipes, read on threads (see `forward_output`).
        let (stdout, stdout_writer) = std::io::pipe().map_err(spawn_error)?;
        let (stderr, stderr_writer) = std::io::pipe().map_err(spawn_error)?;
        // Where the kernel refuses the larger pipe, the reader paces for the one it has.
        let _ = rustix::pipe::fcntl_setpipe_size(&stdout, OUTPUT_PIPE_CAPACITY);
        let capacity = |pipe: &std::io::PipeReader| {
            rustix::pipe::fcntl_getpipe_size(pipe).unwrap_or(64 * 1024)
        };
        let capacities = [capacity(&stdout), capacity(&stderr)];
        process
            .stdout(Stdio::from(stdout_writer))
            .stderr(Stdio::from(stderr_writer));
        let spawned = process.spawn();
        // The command holds the pipes' writing ends; the readers see the end of the output
        // only once HAProxy and this copy are gone.
        drop(process);
        let mut child = spawned.map_err(spawn_error)?;
        let (lines_tx, mut lines_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let streams = [
            ("haproxy-stdout", Stream::Stdout, stdout),
            ("haproxy-stderr", Stream::Stderr, stderr),
        ];
        let alerts = std::sync::Arc::new(std::sync::Mutex::new(Alerts::default()));
        for ((name, which, stream), capacity) in streams.into_iter().zip(capacities) {
            let tx = lines_tx.clone();
            let kept = alerts.clone();
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || forward_output(stream, which, capacity, &tx, &kept))
                .map_err(spawn_error)?;
        }
        drop(lines_tx);
        let master = Client::new(master_socket, Duration::from_secs(5));
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_error;
        loop {
            if let Some(status) = child.try_wait().map_err(|source| ProcessError::Spawn {
                bin: bin.to_string(),
                source,
            })? {
                // The readers end at the end of the pipes, which closed with the process;
                // wait (briefly) for them so that the message has all HAProxy said.
                let mut output = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(line) = lines_rx.recv().await {
                        output.push(line);
                    }
                })
                .await;
                return Err(ProcessError::ExitedAtStart {
                    status: status.to_string(),
                    output: output.join("\n"),
                });
            }
            match show_proc(&master).await {
                Ok(p) if !p.workers.is_empty() => break,
                Ok(_) => last_error = "no worker yet".to_string(),
                Err(e) => last_error = e.to_string(),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProcessError::StartTimeout {
                    path: master_socket.to_path_buf(),
                    timeout,
                    last_error,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The output is kept only to explain a failed start. Closing the channel now turns
        // each later send into a failed check: no copy is queued and no task is woken per
        // request log line (HAProxy's output is still read and logged, so it never blocks).
        drop(lines_rx);
        Ok(Self {
            child,
            master,
            alerts,
        })
    }

    pub fn master(&self) -> &Client {
        &self.master
    }

    /// Where HAProxy's `[ALERT]` lines stand now (see [`Haproxy::alerts_since`]).
    pub fn alert_mark(&self) -> u64 {
        self.alerts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .mark()
    }

    /// The `[ALERT]` lines HAProxy wrote since `mark`, waiting up to `wait` for the first one:
    /// after a failed reload, the reader may not have read them yet.
    pub async fn alerts_since(&self, mark: u64, wait: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let lines = self
                .alerts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .since(mark);
            if !lines.is_empty() || tokio::time::Instant::now() >= deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Graceful stop: SIGUSR1 lets workers finish their connections; after `timeout` the
    /// master is killed.
    pub async fn stop(mut self, timeout: Duration) {
        if let Some(pid) = self.child.id() {
            // No `unsafe` in this crate, so the signal goes through kill(1).
            let _ = Process::new("kill")
                .arg("-USR1")
                .arg(pid.to_string())
                .status()
                .await;
        }
        if tokio::time::timeout(timeout, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// Whether the master is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed start reports what HAProxy said, read by the output threads to the end.
    #[tokio::test]
    async fn a_failed_start_reports_haproxy_output() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("haproxy.cfg");
        std::fs::write(&config, "global\n  no-such-keyword-here\n").unwrap();
        let started = Haproxy::start(
            "haproxy",
            &config,
            &dir.path().join("master.sock"),
            Duration::from_secs(10),
        )
        .await;
        match started {
            Err(ProcessError::ExitedAtStart { output, .. }) => {
                assert!(output.contains("no-such-keyword-here"), "{output}");
            }
            Err(other) => panic!("expected ExitedAtStart, got {other}"),
            Ok(_) => panic!("HAProxy started on a configuration it cannot parse"),
        }
    }

    /// A reload that fails on an address another process holds (which `haproxy -c` passes)
    /// leaves HAProxy's own words in the alerts, for tracing them to objects.
    #[tokio::test]
    async fn a_failed_reload_keeps_haproxys_alerts() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("haproxy.cfg");
        let port = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let base = format!(
            "global\n  log stdout format raw local0\ndefaults\n  mode http\n  timeout client 5s\n  \
             timeout server 5s\n  timeout connect 5s\nfrontend a\n  bind 127.0.0.1:{}\n  \
             http-request return status 200\n",
            port()
        );
        std::fs::write(&config, &base).unwrap();
        let haproxy = Haproxy::start(
            "haproxy",
            &config,
            &dir.path().join("master.sock"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let held = holder.local_addr().unwrap().port();
        std::fs::write(
            &config,
            format!(
                "{base}frontend grab\n  bind 127.0.0.1:{held}\n  http-request return status 200\n"
            ),
        )
        .unwrap();
        let mark = haproxy.alert_mark();
        let reloaded = reload(haproxy.master(), Duration::from_secs(20)).await;
        assert!(reloaded.is_err(), "the reload should fail: {reloaded:?}");
        let alerts = haproxy.alerts_since(mark, Duration::from_secs(5)).await;
        haproxy.stop(Duration::from_secs(5)).await;
        drop(holder);
        let bind = alerts
            .iter()
            .find(|a| a.contains("cannot bind socket"))
            .unwrap_or_else(|| panic!("no bind alert in {alerts:?}"));
        let pointer = crate::attribution::pointer(bind);
        assert_eq!(
            pointer.bind,
            Some(("127.0.0.1".to_string(), held)),
            "{bind}"
        );
    }

    #[test]
    fn the_reader_paces_for_a_quarter_of_the_pipe_at_the_last_rate() {
        let ms = Duration::from_millis;
        // 3 MB/s (20 000 request lines a second) into a 1 MiB pipe: the longest pause, at
        // which 60 KB gather; into 256 KiB, a quarter of the longest pause (5 ms, where 64 KiB
        // would take 5.5 ms at that rate).
        assert_eq!(output_pace(60_000, ms(20), 1 << 20), OUTPUT_PACE_MAX);
        assert_eq!(output_pace(60_000, ms(20), 256 * 1024), ms(5));
        // A default 64 KiB pipe (the kernel refused more): 2 ms at most, as always, even
        // after a quiet spell.
        assert_eq!(output_pace(60_000, ms(20), 64 * 1024), OUTPUT_PACE_MIN);
        assert_eq!(output_pace(10, ms(60_000), 64 * 1024), OUTPUT_PACE_MIN);
        // A fast writer: never less than the shortest pause, and a quarter of the pipe at
        // most at the rate seen.
        assert_eq!(output_pace(1 << 20, ms(2), 1 << 20), OUTPUT_PACE_MIN);
        // 50 MB/s: a quarter of 1 MiB gathers in 5.2 ms.
        let pace = output_pace(250_000, ms(5), 1 << 20);
        assert!(pace > ms(5) && pace < ms(6), "{pace:?}");
        // Nothing read, or an hour since the last line: the longest pause.
        assert_eq!(output_pace(0, ms(1), 1 << 20), OUTPUT_PACE_MAX);
        assert_eq!(output_pace(10, ms(3_600_000), 1 << 20), OUTPUT_PACE_MAX);
    }

    #[test]
    fn output_is_read_to_the_end_past_bytes_that_are_not_utf8() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Read in small pieces, so that lines span reads.
        let output: &[u8] =
            b"[NOTICE] loading\nGET /caf\xe9 HTTP/1.1\r\n\nlast line without newline";
        forward_output(
            std::io::Read::chain(&output[..10], &output[10..]),
            Stream::Stderr,
            64 * 1024,
            &tx,
            &std::sync::Mutex::default(),
        );
        drop(tx);
        let mut lines = Vec::new();
        while let Some(line) = rx.blocking_recv() {
            lines.push(line);
        }
        assert_eq!(
            lines,
            [
                "[NOTICE] loading",
                "GET /caf\u{fffd} HTTP/1.1",
                "last line without newline"
            ]
        );
    }

    #[test]
    fn proxy_notices_are_kept_from_stderr_only() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let stdout: &[u8] = b"Proxy http stopped (cumulated conns: FE: 1, BE: 0).\n\
            127.0.0.1:5432 [05/Dec/2026:03:33:05.658] http b/SRV_1 0/0/0/1/1 200 12 - - ---- 1/1/0/0/0 0/0 \"GET /Proxy HTTP/1.1\"\n\
            Stopping frontend http in 0 ms.\n";
        let alerts = std::sync::Mutex::default();
        forward_output(stdout, Stream::Stdout, 64 * 1024, &tx, &alerts);
        let stderr: &[u8] =
            b"[WARNING]  (13284) : Proxy http stopped (cumulated conns: FE: 1, BE: 0).\n";
        forward_output(stderr, Stream::Stderr, 64 * 1024, &tx, &alerts);
        drop(tx);
        let mut lines = Vec::new();
        while let Some(line) = rx.blocking_recv() {
            lines.push(line);
        }
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("\"GET /Proxy HTTP/1.1\""), "{lines:?}");
        assert!(lines[1].starts_with("[WARNING]"), "{lines:?}");
    }

    #[test]
    fn alert_lines_are_kept_for_the_reload_that_follows() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let alerts = std::sync::Mutex::new(Alerts::default());
        let before: &[u8] = b"[ALERT]    (1) : an old alert\n[WARNING]  (1) : a warning\n";
        forward_output(before, Stream::Stderr, 64 * 1024, &tx, &alerts);
        let mark = alerts.lock().unwrap().mark();
        // An `[ALERT]` on stdout is a request log line that happens to say it: not kept.
        forward_output(
            &b"GET /[ALERT]\n"[..],
            Stream::Stdout,
            64 * 1024,
            &tx,
            &alerts,
        );
        let after: &[u8] = b"[ALERT]    (2) : Starting frontend tcp_x: cannot bind socket (Address already in use) [127.0.0.1:6060]\n";
        forward_output(after, Stream::Stderr, 64 * 1024, &tx, &alerts);
        let since = alerts.lock().unwrap().since(mark);
        assert_eq!(since.len(), 1, "{since:?}");
        assert!(since[0].contains("cannot bind socket"));
        // Only the last few are kept.
        let mut many = Alerts::default();
        for i in 0..KEPT_ALERTS + 10 {
            many.push(format!("[ALERT] {i}"));
        }
        assert_eq!(many.since(0).len(), KEPT_ALERTS);
        assert_eq!(many.since(0)[0], "[ALERT] 10");
    }

    #[test]
    fn parses_show_proc_of_2_6() {
        let text = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
            513             master          2 [failed: 1]   0d00h10m25s     2.6.12-1+deb12u4\n\
            # workers\n\
            2927            worker          1               0d00h00m02s     2.6.12-1+deb12u4\n\
            # programs\n";
        assert_eq!(
            parse_show_proc(text).unwrap(),
            ProcStatus {
                master_pid: 513,
                reloads: 2,
                failed: Some(1),
                workers: vec![2927]
            }
        );
        assert!(parse_show_proc("Unknown command").is_err());
    }
}
