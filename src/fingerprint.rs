//! 128-bit content fingerprints for the caches that skip unchanged work (manifest files,
//! renderings, backend sections): two 64-bit SipHash runs told apart by a prefix, so two
//! different inputs among millions practically never share one. Stable within a process only.

use std::hash::{DefaultHasher, Hash, Hasher};

/// Feeds values, bytes or serialized forms; [`Fingerprint::finish`] gives the 128 bits.
#[derive(Debug)]
pub struct Fingerprint(DefaultHasher, DefaultHasher);

impl Default for Fingerprint {
    fn default() -> Self {
        Self::new()
    }
}

impl Fingerprint {
    pub fn new() -> Self {
        let mut second = DefaultHasher::new();
        second.write_u64(0x9e37_79b9_7f4a_7c15);
        Self(DefaultHasher::new(), second)
    }

    pub fn add(&mut self, value: &impl Hash) {
        value.hash(&mut self.0);
        value.hash(&mut self.1);
    }

    /// Adds `value`'s serialized (JSON) form: what templates see of it. Through a buffer:
    /// the serializer writes a byte or a few at a time, and SipHash's cost is per write.
    pub fn add_serialized(&mut self, value: &impl serde::Serialize) {
        let mut buffered = std::io::BufWriter::with_capacity(8 * 1024, &mut *self);
        let _ = serde_json::to_writer(&mut buffered, value);
        let _ = std::io::Write::flush(&mut buffered);
    }

    pub fn finish(&self) -> u128 {
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }
}

impl std::io::Write for Fingerprint {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        self.1.write(bytes);
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

/// The fingerprint of `value`'s serialized form.
pub fn of_serialized(value: &impl serde::Serialize) -> u128 {
    let mut f = Fingerprint::new();
    f.add_serialized(value);
    f.finish()
}
