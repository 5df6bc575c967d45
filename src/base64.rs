//! Standard base64 (RFC 4648, with padding): decoding PEM bodies, encoding them in lines of
//! 64, and encoding the synthetic clusters' Secret data on one line. Small enough not to
//! need a crate.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Each byte's base64 value, or 255 for a byte outside the alphabet: one lookup per byte
/// where a search of the alphabet took 32 comparisons on average.
const VALUES: [u8; 256] = {
    let mut table = [255u8; 256];
    let mut i = 0;
    while i < 64 {
        table[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// The bytes `s` encodes (padding optional), or `None` for a character outside the
/// alphabet, whitespace included.
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = VALUES[usize::from(c)];
        if v == 255 {
            return None;
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// `bytes` in base64 on one line, as a Secret's `data` holds it.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    encode_into(&mut out, bytes, usize::MAX);
    out
}

/// Appends `bytes` in base64 to `out`, a newline after every 64 characters and at the end,
/// as a PEM body.
pub fn encode_lines(out: &mut String, bytes: &[u8]) {
    if encode_into(out, bytes, 64) != 0 {
        out.push('\n');
    }
}

/// Appends `bytes` in base64 to `out` with a newline after every `width` characters (a
/// multiple of 4; `usize::MAX` for one line); returns the length of the last, unfinished
/// line.
fn encode_into(out: &mut String, bytes: &[u8], width: usize) -> usize {
    let mut column = 0;
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
        column += 4;
        if column == width {
            out.push('\n');
            column = 0;
        }
    }
    column
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known values (RFC 4648), on one line and in lines of 64 characters, and every length
    /// decoded back; a byte outside the alphabet is refused.
    #[test]
    fn round_trips_on_one_line_and_in_lines_of_64() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(encode(plain.as_bytes()), encoded);
            let mut lines = String::new();
            encode_lines(&mut lines, plain.as_bytes());
            let line = if encoded.is_empty() { "" } else { "\n" };
            assert_eq!(lines, format!("{encoded}{line}"));
            assert_eq!(decode(encoded).unwrap(), plain.as_bytes());
        }
        for len in 1..200 {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let mut out = String::new();
            encode_lines(&mut out, &data);
            let lines: Vec<&str> = out.strip_suffix('\n').unwrap().split('\n').collect();
            let (last, full) = lines.split_last().unwrap();
            assert!(full.iter().all(|l| l.len() == 64), "{len}: {out:?}");
            assert!(!last.is_empty() && last.len() <= 64, "{len}: {out:?}");
            assert_eq!(decode(&lines.concat()), Some(data.clone()));
            assert_eq!(encode(&data), lines.concat());
        }
        assert_eq!(decode("Zm9v!"), None);
        assert_eq!(decode("Zm 9v"), None);
    }
}
