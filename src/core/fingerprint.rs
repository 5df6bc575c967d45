//! 128-bit content fingerprints for the caches that skip unchanged work (manifest files,
//! renderings, backend sections, the hook memo's keys): SipHash-1-3 with its 128-bit output,
//! so two different inputs among millions practically never share one. One pass over the
//! input (two 64-bit runs cost twice as much, and a cold run fingerprints every backend's
//! serialized form). Keyed at random for each process: the inputs hold what tenants wrote
//! (annotations, manifests), and with a known key they could look for two inputs that share a
//! fingerprint, so that one object's cached work stood in for another's. Stable within a
//! process only.

use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::{Hash, Hasher};

/// Feeds values, bytes or serialized forms; [`Fingerprint::finish`] gives the 128 bits.
#[derive(Debug)]
pub struct Fingerprint(SipHasher13);

impl Default for Fingerprint {
    fn default() -> Self {
        Self::new()
    }
}

/// Two random SipHash keys, from std's random hasher state (seeded from the OS).
pub fn random_keys() -> (u64, u64) {
    use std::hash::BuildHasher;
    let random = std::hash::RandomState::new();
    (random.hash_one(1u8), random.hash_one(2u8))
}

impl Fingerprint {
    /// Under this process's keys, drawn once.
    pub fn new() -> Self {
        static KEYS: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
        Self::with_keys(*KEYS.get_or_init(random_keys))
    }

    /// Under keys of the caller's own (see [`random_keys`]).
    pub fn with_keys((k0, k1): (u64, u64)) -> Self {
        Self(SipHasher13::new_with_keys(k0, k1))
    }

    pub fn add(&mut self, value: &impl Hash) {
        value.hash(&mut self.0);
    }

    /// Adds `value`'s serialized (JSON) form: what templates see of it. Through a buffer:
    /// the serializer writes a byte or a few at a time, and SipHash's cost is per write.
    pub fn add_serialized(&mut self, value: &impl serde::Serialize) {
        let mut buffered = std::io::BufWriter::with_capacity(8 * 1024, &mut *self);
        let _ = serde_json::to_writer(&mut buffered, value);
        let _ = std::io::Write::flush(&mut buffered);
    }

    pub fn finish(&self) -> u128 {
        self.0.finish128().as_u128()
    }
}

impl std::io::Write for Fingerprint {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The fingerprint of some bytes.
pub fn of_bytes(bytes: &[u8]) -> u128 {
    let mut f = Fingerprint::new();
    std::io::Write::write_all(&mut f, bytes).ok();
    f.finish()
}

/// The fingerprint of what `reader` gives, the same as [`of_bytes`] of all of it, read a
/// buffer at a time: a file's fingerprint without holding the file.
pub fn of_reader(mut reader: impl std::io::Read) -> std::io::Result<u128> {
    let mut f = Fingerprint::new();
    std::io::copy(&mut reader, &mut f)?;
    Ok(f.finish())
}

/// The fingerprint of `value`'s serialized form.
pub fn of_serialized(value: &impl serde::Serialize) -> u128 {
    let mut f = Fingerprint::new();
    f.add_serialized(value);
    f.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads at most `step` bytes a call, so the hashers see the bytes in uneven pieces.
    struct Trickle<'a> {
        bytes: &'a [u8],
        step: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_read_fingerprint_is_the_fingerprint_of_the_bytes_however_they_come() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for len in [0, 1, 7, 8, 9, 8191, 8192, 8193, bytes.len()] {
            let whole = of_bytes(&bytes[..len]);
            for step in [1, 3, 8, 13, 4096, 65536] {
                let read = of_reader(Trickle {
                    bytes: &bytes[..len],
                    step,
                })
                .unwrap();
                assert_eq!(read, whole, "len {len}, step {step}");
            }
        }
        assert_ne!(of_bytes(&bytes[..8]), of_bytes(&bytes[..9]));
    }

    #[test]
    fn fingerprints_are_keyed_for_this_process() {
        let under = |keys| {
            let mut f = Fingerprint::with_keys(keys);
            f.add(&"same input");
            f.finish()
        };
        let mut ours = Fingerprint::new();
        ours.add(&"same input");
        assert_eq!(ours.finish(), {
            let mut again = Fingerprint::new();
            again.add(&"same input");
            again.finish()
        });
        // Not the well-known all-zero key, nor any fixed one.
        assert_ne!(ours.finish(), under((0, 0)));
        assert_ne!(under((1, 2)), under((3, 4)));
    }
}
