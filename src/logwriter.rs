//! Where Portcullis' log lines go: stderr, one write per line, except on a thread inside
//! [`batch`], whose lines are gathered and written together when the batch ends.
//!
//! HAProxy's request log reaches the log through the threads that read its output, one event
//! per line. Written one by one, each line would cost a system call, about as much CPU as
//! formatting it, taken from the data plane on a small machine. The readers therefore emit the
//! lines of one read of the pipe inside [`batch`], with one write. Formatting stays the
//! subscriber's: nothing here knows what a line looks like.

use std::cell::RefCell;
use std::io::{self, Write};

thread_local! {
    /// The lines of the batch this thread is in, if any.
    static BATCH: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Runs `emit` with this thread's log lines gathered, then writes them to `sink` with one
/// call. Lines logged outside a batch, or on other threads, are written at once as usual.
pub fn batch<R>(sink: &mut impl Write, emit: impl FnOnce() -> R) -> R {
    let outer = BATCH.with(|b| b.borrow_mut().replace(Vec::new()));
    let result = emit();
    let gathered = BATCH.with(|b| std::mem::replace(&mut *b.borrow_mut(), outer));
    if let Some(bytes) = gathered.filter(|bytes| !bytes.is_empty()) {
        // As for a line written at once, a log that cannot be written is not an error of
        // the program's: the lines are lost, nothing else.
        let _ = sink.write_all(&bytes).and_then(|()| sink.flush());
    }
    result
}

/// The text format's layer, as `portcullis` installs it (colours on a terminal only).
pub fn text_layer<S>(
    ansi: bool,
) -> tracing_subscriber::fmt::Layer<
    S,
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    Stderr,
>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(Stderr)
}

/// The JSON format's layer: one object per line, the event's fields (`message` among them)
/// at the top level.
pub fn json_layer<S>() -> tracing_subscriber::fmt::Layer<
    S,
    tracing_subscriber::fmt::format::JsonFields,
    tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Json>,
    Stderr,
>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_writer(Stderr)
}

/// The writer the log subscriber is given (`with_writer(logwriter::Stderr)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter
    }
}

/// Adds `buf` to this thread's batch, if it is in one.
fn gathered(buf: &[u8]) -> bool {
    BATCH.with(|b| match b.borrow_mut().as_mut() {
        Some(bytes) => {
            bytes.extend_from_slice(buf);
            true
        }
        None => false,
    })
}

/// One log line's writer: into the thread's batch, or straight to stderr.
#[derive(Debug)]
pub struct LineWriter;

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if gathered(buf) {
            Ok(buf.len())
        } else {
            io::stderr().write(buf)
        }
    }

    /// A line outside a batch is written under one lock of stderr, as `std::io::stderr`'s
    /// own writer does, so that another thread's line cannot come between its parts.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if gathered(buf) {
            Ok(())
        } else {
            io::stderr().write_all(buf)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// Counts the calls that reached it, as a pipe would count system calls.
    #[derive(Default)]
    struct CountingSink {
        bytes: Vec<u8>,
        writes: usize,
    }

    impl Write for CountingSink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.writes += 1;
            self.bytes.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_batch_writes_its_formatted_lines_with_one_call_and_keeps_the_filter() {
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("info,quiet=warn"))
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(Stderr),
            );
        let mut sink = CountingSink::default();
        tracing::subscriber::with_default(subscriber, || {
            // Tests on other threads may have registered these callsites while no subscriber
            // was interested, and the interest is cached process-wide: compute it again.
            tracing::callsite::rebuild_interest_cache();
            let answer = batch(&mut sink, || {
                tracing::info!(target: "haproxy", "first line");
                tracing::info!(target: "quiet", "filtered out");
                tracing::info!(target: "haproxy", "second line");
                42
            });
            assert_eq!(answer, 42);
            // Nothing is gathered after the batch: the sink sees no more.
            tracing::info!(target: "haproxy", "after the batch");
        });
        assert_eq!(sink.writes, 1, "one write for the whole batch");
        let text = String::from_utf8(sink.bytes).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let messages: Vec<&str> = lines
            .iter()
            .map(|l| l["message"].as_str().unwrap())
            .collect();
        assert_eq!(messages, ["first line", "second line"]);
        assert!(lines.iter().all(|l| l["target"] == "haproxy"));
    }
}
