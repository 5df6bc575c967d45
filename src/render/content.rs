//! A rendered file's bytes, held as shared pieces.
//!
//! haproxy.cfg is some 16 MB at 10 000 Ingresses, and a run after an endpoint or Ingress
//! change replaces one or two backend sections of it. Copying the rest into a new buffer took
//! more than half of an endpoint run; a [`Content`] made by a patch instead refers to the
//! unchanged byte ranges of the buffers it came from and holds only the new sections' text.
//! Equal contents compare equal however they are cut into pieces.

use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

/// A byte range of a shared buffer.
#[derive(Clone)]
struct Piece {
    buffer: Arc<Vec<u8>>,
    range: Range<usize>,
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        &self.buffer[self.range.clone()]
    }
}

/// A file's bytes: the concatenation of its pieces. Cheap to clone.
#[derive(Clone, Default)]
pub struct Content {
    pieces: Arc<Vec<Piece>>,
    len: usize,
}

/// More pieces than this and a patch makes the content one buffer again: each patch adds
/// up to two pieces per replaced section, and a long series of them would make writing and
/// comparing walk ever more pieces.
const MAX_PIECES: usize = 1024;

impl Content {
    /// The content of `bytes`, in one piece.
    pub fn whole(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        let pieces = if len == 0 {
            Vec::new()
        } else {
            vec![Piece {
                buffer: Arc::new(bytes),
                range: 0..len,
            }]
        };
        Content {
            pieces: Arc::new(pieces),
            len,
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

    /// Writes every piece to `out`.
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        self.pieces().try_for_each(|piece| out.write_all(piece))
    }

    /// Whether these are the bytes `other`.
    pub fn is(&self, other: &[u8]) -> bool {
        let mut rest = other;
        self.len == other.len()
            && self.pieces().all(|piece| {
                let (head, tail) = rest.split_at(piece.len());
                rest = tail;
                head == piece
            })
    }

    /// Whether both are the same pieces (and so equal without a look at the bytes).
    pub fn ptr_eq(&self, other: &Content) -> bool {
        Arc::ptr_eq(&self.pieces, &other.pieces)
    }

    /// Bytes `range` of this content, as pieces of the same buffers (no bytes copied).
    fn slice_into(&self, range: Range<usize>, out: &mut Builder) {
        let mut offset = 0;
        for piece in self.pieces.iter() {
            let len = piece.range.len();
            let (start, end) = (offset, offset + len);
            offset = end;
            if end <= range.start {
                continue;
            }
            if start >= range.end {
                break;
            }
            let from = range.start.max(start) - start;
            let to = range.end.min(end) - start;
            out.push(Piece {
                buffer: piece.buffer.clone(),
                range: piece.range.start + from..piece.range.start + to,
            });
        }
    }

    /// This content with the byte ranges of `replacements` (ascending, not overlapping)
    /// replaced by their texts. The rest is shared, not copied.
    pub fn splice<'t>(
        &self,
        replacements: impl IntoIterator<Item = (Range<usize>, &'t [u8])>,
    ) -> Content {
        let mut out = Builder::default();
        let mut copied = 0;
        for (range, text) in replacements {
            debug_assert!(copied <= range.start && range.end <= self.len);
            self.slice_into(copied..range.start, &mut out);
            if !text.is_empty() {
                out.push(Piece {
                    buffer: Arc::new(text.to_vec()),
                    range: 0..text.len(),
                });
            }
            copied = range.end;
        }
        self.slice_into(copied..self.len, &mut out);
        let content = Content {
            len: out.pieces.iter().map(|p| p.range.len()).sum(),
            pieces: Arc::new(out.pieces),
        };
        if content.pieces.len() > MAX_PIECES {
            return Content::whole(content.bytes().into_owned());
        }
        content
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
            if Arc::ptr_eq(&last.buffer, &piece.buffer) && last.range.end == piece.range.start {
                last.range.end = piece.range.end;
                return;
            }
        }
        self.pieces.push(piece);
    }
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
        let patched = base.splice([(17..27, &b"backend B!\n"[..])]);
        assert_eq!(text(&patched), "global\nbackend a\nbackend B!\nbackend c\n");
        // Before, the new text, after: the kept bytes are the first buffer's.
        assert_eq!(patched.piece_count(), 3);
        let again = patched.splice([(17..28, &b"backend b\n"[..])]);
        assert_eq!(again, base);
        assert!(!again.ptr_eq(&base));
        assert_ne!(patched, base);
        let empty = base.splice([(0..base.len(), &b""[..])]);
        assert!(empty.is_empty());
        assert_eq!(empty, Content::default());
    }

    #[test]
    fn many_patches_end_in_one_buffer() {
        let mut content = Content::whole(vec![b'x'; 4 * MAX_PIECES]);
        for i in 0..MAX_PIECES {
            let at = 4 * i + 1;
            content = content.splice([(at..at + 1, &b"y"[..])]);
            assert!(content.piece_count() <= MAX_PIECES);
        }
        assert_eq!(content.len(), 4 * MAX_PIECES);
        assert_eq!(text(&content), "xyxx".repeat(MAX_PIECES));
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
                content = content.splice(ranges.iter().map(|(r, t)| (r.clone(), t.as_slice())));
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
                prop_assert!(content.is(&expected));
                prop_assert!(!content.is(&expected[..expected.len().saturating_sub(1)]) || expected.is_empty());
                let mut written = Vec::new();
                content.write_to(&mut written).unwrap();
                prop_assert_eq!(&written, &expected);
                flat = expected;
            }
        }
    }
}
