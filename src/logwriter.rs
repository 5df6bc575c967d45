//! Where Portcullis' log lines go: stderr, one write per line, except on a thread inside
//! [`batch`], whose lines are gathered and written together when the batch ends.
//!
//! HAProxy's request log reaches the log through the threads that read its output, one line
//! per request. Written one by one, each line costs a system call, about as much CPU as
//! formatting it, taken from the data plane on a small machine. The readers therefore emit a
//! batch of lines (one read of the pipe) inside [`batch`], with one write.
//!
//! Formatting a line through the subscriber costs 2–3 µs, most of it the text format's
//! escaping, a character at a time; at tens of thousands of requests a second that is a
//! tenth of a core. [`haproxy_lines`] therefore has the subscriber format one line per batch,
//! a probe, and frames every line of the batch as the probe was framed (timestamp, level,
//! target), escaping the line as the subscriber's format does. The subscriber's filter
//! decides for the batch, by target and level.

use std::cell::RefCell;
use std::io::{self, Write};
use std::sync::OnceLock;

/// How the log subscriber formats a line, when [`init_line_format`] said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// tracing-subscriber's full text format without colours: the message escaped against
    /// terminal control sequences.
    Text,
    /// tracing-subscriber's JSON format: the message as a JSON string.
    Json,
}

static LINE_FORMAT: OnceLock<LineFormat> = OnceLock::new();

/// Tells [`haproxy_lines`] how the subscriber just installed formats lines. Without it (a
/// subscriber with colours, or another program's), every line goes through the subscriber.
pub fn init_line_format(format: LineFormat) {
    let _ = LINE_FORMAT.set(format);
}

/// The message of the probe line whose frame [`haproxy_lines`] puts around each line.
macro_rules! probe {
    () => {
        "portcullis-probe-5f0d1c2e"
    };
}
const PROBE: &str = probe!();
/// The probe's message as the JSON format writes it.
const PROBE_JSON: &str = concat!("\"", probe!(), "\"");

/// Logs each of `lines` as `tracing::info!(target: "haproxy", "{line}")` would (bytes that
/// are not UTF-8 replaced), inside a [`batch`] and with the format [`init_line_format`] gave;
/// otherwise one event per line.
pub fn haproxy_lines<'a>(lines: impl Iterator<Item = &'a [u8]>) {
    framed_lines(LINE_FORMAT.get().copied(), lines);
}

fn framed_lines<'a>(format: Option<LineFormat>, lines: impl Iterator<Item = &'a [u8]>) {
    let Some(format) = format else {
        return each_line(lines);
    };
    if !tracing::enabled!(target: "haproxy", tracing::Level::INFO) {
        return;
    }
    // The probe goes through the subscriber into this thread's batch; its text is taken out.
    let Some(start) = BATCH.with(|b| b.borrow().as_ref().map(Vec::len)) else {
        return each_line(lines);
    };
    tracing::info!(target: "haproxy", "{PROBE}");
    let probe = BATCH.with(|b| {
        b.borrow_mut()
            .as_mut()
            .map(|bytes| bytes.split_off(start.min(bytes.len())))
    });
    let Some(probe) = probe else {
        return each_line(lines);
    };
    let marker: &[u8] = match format {
        LineFormat::Text => PROBE.as_bytes(),
        LineFormat::Json => PROBE_JSON.as_bytes(),
    };
    let mut at = probe
        .windows(marker.len())
        .enumerate()
        .filter(|(_, w)| *w == marker);
    let (Some((i, _)), None) = (at.next(), at.next()) else {
        // Filtered by something other than target and level, or framed in a way this does
        // not know: the subscriber formats every line.
        return each_line(lines);
    };
    let (before, after) = (&probe[..i], &probe[i + marker.len()..]);
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        let Some(bytes) = b.as_mut() else { return };
        for line in lines {
            bytes.extend_from_slice(before);
            match format {
                // HAProxy's lines are printable ASCII but for what a request carried.
                LineFormat::Text if printable_ascii(line) => bytes.extend_from_slice(line),
                LineFormat::Text => escape_text(&String::from_utf8_lossy(line), bytes),
                // A string serializes; a failure would be the writer's, and a Vec has none.
                LineFormat::Json => {
                    let text = match std::str::from_utf8(line) {
                        Ok(text) => std::borrow::Cow::Borrowed(text),
                        Err(_) => String::from_utf8_lossy(line),
                    };
                    let _ = serde_json::to_writer(&mut *bytes, &text);
                }
            }
            bytes.extend_from_slice(after);
        }
    });
}

fn each_line<'a>(lines: impl Iterator<Item = &'a [u8]>) {
    for line in lines {
        let text = String::from_utf8_lossy(line);
        tracing::info!(target: "haproxy", "{text}");
    }
}

/// Whether `line` is printable ASCII (space to `~`): UTF-8, and nothing in it for the text
/// format to escape. Every byte is read (no early exit), which compiles to a vector loop.
fn printable_ascii(line: &[u8]) -> bool {
    !line.iter().fold(false, |outside, &b| {
        outside | (b.wrapping_sub(b' ') > b'~' - b' ')
    })
}

/// `text` as tracing-subscriber's text format writes a message: the C0 controls of terminal
/// escape sequences (ESC, BEL, BS, FF), DEL and the C1 controls escaped, the rest as it is.
fn escape_text(text: &str, out: &mut Vec<u8>) {
    for ch in text.chars() {
        match ch {
            '\x1b' => out.extend_from_slice(b"\\x1b"),
            '\x07' => out.extend_from_slice(b"\\x07"),
            '\x08' => out.extend_from_slice(b"\\x08"),
            '\x0c' => out.extend_from_slice(b"\\x0c"),
            '\x7f' => out.extend_from_slice(b"\\x7f"),
            '\u{80}'..='\u{9f}' => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(ch));
            }
            _ => {
                let mut utf8 = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
            }
        }
    }
}

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

    /// Lines as HAProxy's output may hold them: quotes, backslashes, tabs, terminal controls,
    /// C1 controls, bytes that are not UTF-8, the probe's own text.
    const HARD_LINES: &[&[u8]] = &[
        b"127.0.0.1:5432 [02/Dec/2026:05:22:12.345] http b/SRV_1 0/0/0/1/1 200 12 - - ---- 1/1/0/0/0 0/0 \"GET /a HTTP/1.1\"",
        b"quotes \" and \\ backslashes \\\" and {braces} %s",
        b"tab\there, bell \x07, backspace \x08, form feed \x0c, escape \x1b[31mred\x1b[0m, del \x7f",
        "C1 \u{85} and \u{9f}, not C1 \u{a0} \u{e9} \u{1f600}".as_bytes(),
        b"not UTF-8: \xff \xc2 \xe2\x82 end",
        b"nul \x00 and other controls \x01 \x1f",
        b"the probe: portcullis-probe-5f0d1c2e",
    ];

    /// The timestamp taken out (`"timestamp":"..."` in JSON, the first word in text).
    fn without_timestamps(text: &str) -> Vec<String> {
        text.lines()
            .map(|line| match line.find("\"timestamp\":\"") {
                Some(at) => {
                    let value = at + "\"timestamp\":\"".len();
                    let end = value + line[value..].find('"').unwrap();
                    format!("{}{}", &line[..value], &line[end..])
                }
                None => line.split_once(' ').unwrap().1.to_string(),
            })
            .collect()
    }

    /// The lines as the subscriber formats them one by one, and as `framed_lines` does.
    fn both_ways(
        subscriber: impl tracing::Subscriber + Send + Sync + 'static,
        format: LineFormat,
    ) -> (Vec<String>, Vec<String>, usize) {
        let (mut each, mut framed) = (CountingSink::default(), CountingSink::default());
        tracing::subscriber::with_default(subscriber, || {
            // Tests on other threads may have registered these callsites while no subscriber
            // was interested, and the interest is cached process-wide: compute it again.
            tracing::callsite::rebuild_interest_cache();
            batch(&mut each, || each_line(HARD_LINES.iter().copied()));
            batch(&mut framed, || {
                framed_lines(Some(format), HARD_LINES.iter().copied());
            });
        });
        let text = |sink: CountingSink| String::from_utf8(sink.bytes).unwrap();
        let writes = framed.writes;
        (
            without_timestamps(&text(each)),
            without_timestamps(&text(framed)),
            writes,
        )
    }

    #[test]
    fn framed_lines_are_the_subscribers_lines() {
        let text = tracing_subscriber::registry().with(text_layer(false));
        let (each, framed, writes) = both_ways(text, LineFormat::Text);
        assert_eq!(each.len(), HARD_LINES.len());
        assert_eq!(framed, each);
        assert_eq!(writes, 1);
        assert!(each[2].contains("\\x1b[31m"), "escaped: {}", each[2]);

        let json = tracing_subscriber::registry().with(json_layer());
        let (each, framed, _) = both_ways(json, LineFormat::Json);
        assert_eq!(each.len(), HARD_LINES.len());
        assert_eq!(framed, each);
        for line in &framed {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(value["target"], "haproxy");
        }
    }

    #[test]
    fn framed_lines_keep_the_filter_and_need_a_batch_and_a_format() {
        // Filtered out by level: nothing either way.
        let quiet = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("info,haproxy=warn"))
            .with(text_layer(false));
        let (each, framed, writes) = both_ways(quiet, LineFormat::Text);
        assert!(each.is_empty() && framed.is_empty() && writes == 0);
        // Outside a batch, and without a format, each line goes through the subscriber.
        let mut sink = CountingSink::default();
        let subscriber = tracing_subscriber::registry().with(json_layer());
        tracing::subscriber::with_default(subscriber, || {
            batch(&mut sink, || framed_lines(None, HARD_LINES.iter().copied()));
        });
        assert_eq!(
            String::from_utf8(sink.bytes).unwrap().lines().count(),
            HARD_LINES.len()
        );
    }

    #[test]
    fn an_empty_batch_writes_nothing_and_batches_nest() {
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(Stderr));
        let mut outer = CountingSink::default();
        let mut inner = CountingSink::default();
        tracing::subscriber::with_default(subscriber, || {
            batch(&mut outer, || {
                tracing::info!("outer one");
                batch(&mut inner, || tracing::info!("inner"));
                tracing::info!("outer two");
            });
            batch(&mut inner, || {});
        });
        assert_eq!(inner.writes, 1);
        assert!(String::from_utf8(inner.bytes).unwrap().contains("inner"));
        let outer = String::from_utf8(outer.bytes).unwrap();
        assert!(outer.contains("outer one") && outer.contains("outer two"));
        assert!(!outer.contains("inner"));
    }
}
