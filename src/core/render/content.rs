//! A rendered file's bytes, held as shared pieces.
//!
//! haproxy.cfg is some 16 MB at 10 000 Ingresses, nearly all of it backend sections that the
//! renderer also remembers (to print them again without rendering them). A rendered
//! [`Content`] holds those sections as pieces shared with the renderer's memory, not copies,
//! and the template's own text between them. A run after an endpoint or Ingress change
//! replaces one or two sections: the [`Content`] it makes refers to the unchanged pieces of
//! the last one and holds only the new sections. Equal contents compare equal however they
//! are cut into pieces.

use std::borrow::Cow;
use std::fmt;
use std::io::{Read, Write};
use std::ops::Range;
use std::sync::Arc;

/// Bytes a piece refers to.
#[derive(Clone)]
pub(crate) enum Shared {
    Bytes(Arc<Vec<u8>>),
    /// A text shared with whoever made it (a remembered backend section).
    Text(Arc<str>),
}

impl Shared {
    fn as_bytes(&self) -> &[u8] {
        match self {
            Shared::Bytes(b) => b,
            Shared::Text(t) => t.as_bytes(),
        }
    }

    fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether both are the same buffer.
    fn same(&self, other: &Shared) -> bool {
        std::ptr::eq(self.as_bytes().as_ptr(), other.as_bytes().as_ptr())
            && self.len() == other.len()
    }
}

impl From<Vec<u8>> for Shared {
    fn from(bytes: Vec<u8>) -> Self {
        Shared::Bytes(Arc::new(bytes))
    }
}

impl From<Arc<str>> for Shared {
    fn from(text: Arc<str>) -> Self {
        Shared::Text(text)
    }
}

/// A byte range of a shared buffer.
#[derive(Clone)]
struct Piece {
    buffer: Shared,
    range: Range<usize>,
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        &self.buffer.as_bytes()[self.range.clone()]
    }

    fn whole(buffer: Shared) -> Self {
        let range = 0..buffer.len();
        Piece { buffer, range }
    }
}

/// A file's bytes: the concatenation of its pieces. Cheap to clone.
#[derive(Clone, Default)]
pub struct Content {
    pieces: Arc<Vec<Piece>>,
    len: usize,
    /// How many pieces it was made of (see [`MAX_PIECES`]).
    made_of: usize,
}

/// More pieces than this beyond those a content was made of, and a patch makes the content
/// one buffer again: a patch that replaces whole pieces (sections) keeps their number, but
/// one cutting into a piece adds up to two, and a long series of them would make writing and
/// comparing walk ever more pieces.
const MAX_PIECES: usize = 1024;

impl Content {
    /// The content of `bytes`, in one piece.
    pub fn whole(bytes: Vec<u8>) -> Self {
        Self::shared(bytes.into())
    }

    /// The content of a shared buffer, in one piece (not copied).
    pub(crate) fn shared(buffer: Shared) -> Self {
        Self::of_pieces(vec![Piece::whole(buffer)])
    }

    /// The concatenation of `parts`: byte ranges of `own` and whole shared buffers. Nothing
    /// is copied.
    pub(crate) fn assemble(own: Vec<u8>, parts: impl IntoIterator<Item = Part>) -> Self {
        let own = Shared::from(own);
        let mut out = Builder::default();
        for part in parts {
            out.push(match part {
                Part::Own(range) => Piece {
                    buffer: own.clone(),
                    range,
                },
                Part::Shared(buffer) => Piece::whole(buffer),
            });
        }
        Self::of_pieces(out.pieces)
    }

    fn of_pieces(pieces: Vec<Piece>) -> Self {
        let pieces: Vec<Piece> = pieces.into_iter().filter(|p| !p.range.is_empty()).collect();
        Content {
            len: pieces.iter().map(|p| p.range.len()).sum(),
            made_of: pieces.len(),
            pieces: Arc::new(pieces),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces' bytes, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.pieces.iter().map(Piece::bytes)
    }

    /// How many pieces it is held in.
    pub fn piece_count(&self) -> usize {
        self.pieces.len()
    }

    /// The bytes in one slice: borrowed when the content is one piece, else copied.
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match self.pieces.as_slice() {
            [] => Cow::Borrowed(&[]),
            [only] => Cow::Borrowed(only.bytes()),
            _ => {
                let mut all = Vec::with_capacity(self.len);
                for piece in self.pieces() {
                    all.extend_from_slice(piece);
                }
                Cow::Owned(all)
            }
        }
    }

    /// The content as text, or `None` when it is not UTF-8.
    pub fn text(&self) -> Option<Cow<'_, str>> {
        match self.bytes() {
            Cow::Borrowed(b) => std::str::from_utf8(b).ok().map(Cow::Borrowed),
            Cow::Owned(b) => String::from_utf8(b).ok().map(Cow::Owned),
        }
    }

    /// Writes every piece to `out`, through a buffer (a rendered haproxy.cfg is tens of
    /// thousands of pieces).
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, out);
        self.pieces().try_for_each(|piece| out.write_all(piece))?;
        out.flush()
    }

    /// Whether `reader` yields exactly these bytes, read a block at a time: a file on disk
    /// is compared without holding a copy of it (haproxy.cfg is megabytes).
    pub fn same_as_read(&self, mut reader: impl Read) -> std::io::Result<bool> {
        let mut block = vec![0u8; 64 * 1024];
        let mut pieces = self.pieces();
        let mut rest: &[u8] = &[];
        loop {
            let n = match reader.read(&mut block) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(rest.is_empty() && pieces.all(<[u8]>::is_empty));
            }
            let mut got = &block[..n];
            while !got.is_empty() {
                if rest.is_empty() {
                    match pieces.next() {
                        Some(piece) => rest = piece,
                        None => return Ok(false),
                    }
                    continue;
                }
                let k = rest.len().min(got.len());
                if rest[..k] != got[..k] {
                    return Ok(false);
                }
                rest = &rest[k..];
                got = &got[k..];
            }
        }
    }

    /// Whether both are the same pieces (and so equal without a look at the bytes).
    pub fn ptr_eq(&self, other: &Content) -> bool {
        Arc::ptr_eq(&self.pieces, &other.pieces)
    }

    /// Bytes `range` of this content, as pieces of the same buffers (no bytes copied).
    /// `at` is where the last call stopped (piece index, its offset): calls with ascending
    /// ranges walk the pieces once between them, not from the start each time.
    fn slice_into(&self, range: Range<usize>, out: &mut Builder, at: &mut (usize, usize)) {
        let (mut index, mut offset) = *at;
        while let Some(piece) = self.pieces.get(index) {
            let (start, end) = (offset, offset + piece.range.len());
            if start >= range.end {
                break;
            }
            if end > range.start {
                let from = range.start.max(start) - start;
                let to = range.end.min(end) - start;
                out.push(Piece {
                    buffer: piece.buffer.clone(),
                    range: piece.range.start + from..piece.range.start + to,
                });
            }
            if end > range.end {
                // The rest of this piece may follow a replacement.
                break;
            }
            index += 1;
            offset = end;
        }
        *at = (index, offset);
    }

    /// This content with the byte ranges of `replacements` (ascending, not overlapping)
    /// replaced by their texts. Nothing is copied: the rest is shared with this content, the
    /// texts are shared with the caller.
    pub(crate) fn splice(
        &self,
        replacements: impl IntoIterator<Item = (Range<usize>, Shared)>,
    ) -> Content {
        let mut out = Builder {
            pieces: Vec::with_capacity(self.pieces.len() + 8),
        };
        let (mut copied, mut at) = (0, (0, 0));
        for (range, text) in replacements {
            debug_assert!(copied <= range.start && range.end <= self.len);
            self.slice_into(copied..range.start, &mut out, &mut at);
            out.push(Piece::whole(text));
            copied = range.end;
        }
        self.slice_into(copied..self.len, &mut out, &mut at);
        if out.pieces.len() > self.made_of.max(1) + MAX_PIECES {
            let mut all = Vec::with_capacity(self.len);
            for piece in &out.pieces {
                all.extend_from_slice(piece.bytes());
            }
            return Content::whole(all);
        }
        Content {
            len: out.pieces.iter().map(|p| p.range.len()).sum(),
            pieces: Arc::new(out.pieces),
            made_of: self.made_of,
        }
    }
}

/// Pieces being put together; a piece that continues the last one in the same buffer
/// extends it.
#[derive(Default)]
struct Builder {
    pieces: Vec<Piece>,
}

impl Builder {
    fn push(&mut self, piece: Piece) {
        if piece.range.is_empty() {
            return;
        }
        if let Some(last) = self.pieces.last_mut() {
            if last.buffer.same(&piece.buffer) && last.range.end == piece.range.start {
                last.range.end = piece.range.end;
                return;
            }
        }
        self.pieces.push(piece);
    }
}

/// A part of an [`Content::assemble`]d content.
pub(crate) enum Part {
    /// A byte range of the owned buffer.
    Own(Range<usize>),
    /// A whole shared buffer.
    Shared(Shared),
}

impl From<Vec<u8>> for Content {
    fn from(bytes: Vec<u8>) -> Self {
        Content::whole(bytes)
    }
}

impl PartialEq for Content {
    /// By bytes, however the two are cut. Pieces that are the same bytes of the same buffer
    /// (what a patch kept) are not read.
    fn eq(&self, other: &Content) -> bool {
        if self.len != other.len {
            return false;
        }
        if self.ptr_eq(other) {
            return true;
        }
        let mut a = self.pieces();
        let mut b = other.pieces();
        let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
        loop {
            if x.is_empty() {
                match a.next() {
                    Some(next) => x = next,
                    None => return y.is_empty() && b.all(<[u8]>::is_empty),
                }
                continue;
            }
            if y.is_empty() {
                match b.next() {
                    Some(next) => y = next,
                    None => return false,
                }
                continue;
            }
            let n = x.len().min(y.len());
            let same_place = std::ptr::eq(x.as_ptr(), y.as_ptr());
            if !same_place && x[..n] != y[..n] {
                return false;
            }
            x = &x[n..];
            y = &y[n..];
        }
    }
}

impl Eq for Content {}

impl fmt::Debug for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(c: &Content) -> String {
        String::from_utf8(c.bytes().into_owned()).unwrap()
    }

    #[test]
    fn splices_share_what_they_keep() {
        let base = Content::whole(b"global\nbackend a\nbackend b\nbackend c\n".to_vec());
        let patched = base.splice([(17..27, b"backend B!\n".to_vec().into())]);
        assert_eq!(text(&patched), "global\nbackend a\nbackend B!\nbackend c\n");
        // Before, the new text, after: the kept bytes are the first buffer's.
        assert_eq!(patched.piece_count(), 3);
        let again = patched.splice([(17..28, b"backend b\n".to_vec().into())]);
        assert_eq!(again, base);
        assert!(!again.ptr_eq(&base));
        assert_ne!(patched, base);
        let empty = base.splice([(0..base.len(), Vec::new().into())]);
        assert!(empty.is_empty());
        assert_eq!(empty, Content::default());
    }

    /// An assembled content holds the shared texts themselves; replacing one keeps the number
    /// of pieces, however many patches follow.
    #[test]
    fn assembled_sections_are_shared_not_copied() {
        let own = b"global\n\0\0defaults\n".to_vec();
        let a: Arc<str> = Arc::from("backend a\n");
        let b: Arc<str> = Arc::from("backend b\n");
        let content = Content::assemble(
            own,
            [
                Part::Own(0..7),
                Part::Shared(a.clone().into()),
                Part::Own(7..7),
                Part::Shared(b.clone().into()),
                Part::Own(9..18),
            ],
        );
        assert_eq!(text(&content), "global\nbackend a\nbackend b\ndefaults\n");
        assert_eq!(content.piece_count(), 4);
        let held: Vec<*const u8> = content.pieces().map(<[u8]>::as_ptr).collect();
        assert_eq!(held[1], a.as_ptr());
        assert_eq!(held[2], b.as_ptr());
        let mut patched = content;
        for i in 0..3 * MAX_PIECES {
            let text: Arc<str> = Arc::from(format!("backend {}\n", i % 10));
            patched = patched.splice([(17..27, text.clone().into())]);
            assert_eq!(
                patched.pieces().nth(2).map(<[u8]>::as_ptr),
                Some(text.as_ptr())
            );
        }
        assert_eq!(patched.piece_count(), 4);
        let last = (3 * MAX_PIECES - 1) % 10;
        assert_eq!(
            text(&patched),
            format!("global\nbackend a\nbackend {last}\ndefaults\n")
        );
    }

    #[test]
    fn many_patches_end_in_one_buffer() {
        let mut content = Content::whole(vec![b'x'; 4 * MAX_PIECES]);
        for i in 0..MAX_PIECES {
            let at = 4 * i + 1;
            content = content.splice([(at..at + 1, b"y".to_vec().into())]);
            assert!(content.piece_count() <= 1 + MAX_PIECES);
        }
        assert_eq!(content.len(), 4 * MAX_PIECES);
        assert_eq!(text(&content), "xyxx".repeat(MAX_PIECES));
    }

    /// A reader giving at most `.1` bytes a call.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.len().min(self.1).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    proptest! {
        /// Splicing is replacing the ranges in a flat copy; equality is the bytes'.
        #[test]
        fn a_splice_is_the_flat_replacement(
            base in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec((0usize..200, 0usize..8, proptest::collection::vec(any::<u8>(), 0..6)), 0..6),
            second in proptest::collection::vec((0usize..200, 0usize..8, proptest::collection::vec(any::<u8>(), 0..6)), 0..4),
        ) {
            let mut content = Content::whole(base.clone());
            let mut flat = base;
            for round in [cuts, second] {
                let mut ranges: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
                let mut at = 0;
                let mut sorted = round;
                sorted.sort();
                for (start, len, text) in sorted {
                    let start = start.max(at);
                    if start > flat.len() {
                        break;
                    }
                    let end = (start + len).min(flat.len());
                    ranges.push((start..end, text));
                    at = end;
                }
                let mut expected = Vec::new();
                let mut copied = 0;
                for (range, text) in &ranges {
                    expected.extend_from_slice(&flat[copied..range.start]);
                    expected.extend_from_slice(text);
                    copied = range.end;
                }
                expected.extend_from_slice(&flat[copied..]);
                content = content.splice(ranges.iter().map(|(r, t)| (r.clone(), t.clone().into())));
                prop_assert_eq!(content.bytes().into_owned(), expected.clone());
                prop_assert_eq!(content.len(), expected.len());
                prop_assert_eq!(&content, &Content::whole(expected.clone()));
                let mut longer = expected.clone();
                longer.push(b'!');
                prop_assert_ne!(&content, &Content::whole(longer));
                if !expected.is_empty() {
                    let mut flipped = expected.clone();
                    flipped[0] ^= 1;
                    prop_assert_ne!(&content, &Content::whole(flipped));
                }
                // Read back in blocks of any size, as from a file.
                for size in [1, 3, 64 * 1024] {
                    let same = |bytes: &[u8]| content.same_as_read(Trickle(bytes, size)).unwrap();
                    prop_assert!(same(&expected));
                    prop_assert!(!same(&[&expected[..], b"!"].concat()));
                    if let Some((_, shorter)) = expected.split_last() {
                        prop_assert!(!same(shorter));
                        let mut flipped = expected.clone();
                        flipped[shorter.len()] ^= 1;
                        prop_assert!(!same(&flipped));
                    }
                }
                let mut written = Vec::new();
                content.write_to(&mut written).unwrap();
                prop_assert_eq!(&written, &expected);
                flat = expected;
            }
        }
    }
}
