//! TLS Secrets become PEM files: certificate chain then private key.
//!
//! Only the PEM blocks are kept (re-wrapped from their decoded base64), so nothing else a
//! Secret carries reaches disk. File names come from the Secret's namespace and name, which
//! are validated DNS names, and a hash of the content, never from other user strings.
//!
//! A new content is a new file: the files a running or on-disk configuration names are never
//! rewritten, so a reload of that configuration always finds what it was checked with.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use k8s_openapi::api::core::v1::Secret;
use pkcs1::{RsaPrivateKeyRef, RsaPublicKeyRef};
use pkcs8::PrivateKeyInfoRef;
use sec1::EcPrivateKey;
use sha2::{Digest, Sha256};
use x509_cert::certificate::{CertificateInner, Raw};
use x509_cert::der::Decode;
use x509_cert::spki::SubjectPublicKeyInfoOwned;

use crate::model::{CertPath, PemFile};
use crate::objects::Key;

/// Why a TLS Secret's certificate is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unserved {
    /// The Secret is missing or holds no usable certificate: why.
    Unusable(String),
    /// HAProxy refused its file (an input of the run, reported on the Secret).
    Refused,
}

impl std::fmt::Display for Unserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unserved::Unusable(why) => f.write_str(why),
            Unserved::Refused => f.write_str("HAProxy refused its certificate"),
        }
    }
}

/// `<dir>/<namespace>_<name>_<hash>.pem`: the hash is the first 16 hex digits of the
/// content's SHA-256 (neither the namespace nor the name can hold `_`), so two Secrets never
/// share a name.
pub fn file_path(dir: &str, key: &Key, content: &str) -> CertPath {
    let digest = Sha256::digest(content.as_bytes());
    let mut path = format!("{dir}/{}_{}_", key.namespace, key.name);
    for b in &digest[..8] {
        path.push(char::from(HEX[usize::from(b >> 4)]));
        path.push(char::from(HEX[usize::from(b & 15)]));
    }
    path.push_str(".pem");
    CertPath::new(path, key.clone())
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// An X.509 certificate in strict DER, read as OpenSSL (and so HAProxy) reads it: without
/// RFC 5280's profile checks, which would refuse, say, a serial number longer than 20 bytes
/// that HAProxy serves.
type Certificate = CertificateInner<Raw>;

/// When the (first) certificate of a PEM file stops being valid, in Unix seconds.
pub fn not_after(pem: &str) -> Option<i64> {
    let blocks = pem_blocks(pem, "certificate").ok()?;
    let der = &blocks.iter().find(|(l, _)| l == "CERTIFICATE")?.1;
    Some(certificate_not_after(&Certificate::from_der(der).ok()?))
}

/// The `notAfter` of an X.509 certificate, in Unix seconds.
fn certificate_not_after(certificate: &Certificate) -> i64 {
    let end = certificate.tbs_certificate().validity().not_after;
    i64::try_from(end.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
}

/// Builds the PEM file for a `kubernetes.io/tls`-shaped Secret (`tls.crt` + `tls.key`).
pub fn pem_file(key: &Key, secret: &Secret) -> Result<PemFile, String> {
    certificate_file(key, secret).map(|(pem, _)| pem)
}

/// [`pem_file`] and the leaf certificate's `notAfter` (see [`not_after`]), read from the
/// certificate already decoded for the file.
pub fn certificate_file(key: &Key, secret: &Secret) -> Result<(PemFile, Option<i64>), String> {
    let crt = secret_field(secret, "tls.crt")?;
    let tls_key = secret_field(secret, "tls.key")?;
    let certs = pem_blocks(&crt, "tls.crt")?;
    if !certs.iter().any(|(label, _)| label == "CERTIFICATE") {
        return Err("tls.crt holds no CERTIFICATE block".to_string());
    }
    let keys = pem_blocks(&tls_key, "tls.key")?;
    let key_block = match keys.as_slice() {
        [(label, _)] if label.ends_with("PRIVATE KEY") => &keys[0],
        _ => return Err("tls.key must hold exactly one PRIVATE KEY block".to_string()),
    };
    let leaf = certs
        .iter()
        .find(|(label, _)| label == "CERTIFICATE")
        .and_then(|(_, der)| Certificate::from_der(der).ok())
        .ok_or_else(|| NOT_X509.to_string())?;
    key_matches_certificate(&leaf, &key_block.0, &key_block.1)?;
    let mut content = String::new();
    for (label, body) in certs.iter().filter(|(l, _)| l == "CERTIFICATE") {
        encode_block(&mut content, label, body);
    }
    encode_block(&mut content, &key_block.0, &key_block.1);
    let pem = PemFile {
        path: file_path("certs", key, &content),
        content: content.into(),
    };
    Ok((pem, Some(certificate_not_after(&leaf))))
}

/// Builds a CA bundle from a Secret's `ca.crt` (else `tls.crt`, the incumbent's key): every
/// CERTIFICATE block, each a readable X.509 certificate, re-encoded; nothing else is kept.
/// Written as `certs/ca/<namespace>_<name>_<hash>.pem` and named by `ca-file`.
pub fn ca_file(key: &Key, secret: &Secret) -> Result<PemFile, String> {
    let (field, text) = match secret_field(secret, "ca.crt") {
        Ok(text) => ("ca.crt", text),
        Err(_) => (
            "tls.crt",
            secret_field(secret, "tls.crt")
                .map_err(|_| "neither ca.crt nor tls.crt is present".to_string())?,
        ),
    };
    let blocks = pem_blocks(&text, field)?;
    let mut content = String::new();
    for (label, der) in blocks.iter().filter(|(l, _)| l == "CERTIFICATE") {
        if Certificate::from_der(der).is_err() {
            return Err(format!("{field}: a certificate is not valid DER X.509"));
        }
        encode_block(&mut content, label, der);
    }
    if content.is_empty() {
        return Err(format!("{field} holds no CERTIFICATE block"));
    }
    Ok(PemFile {
        path: file_path("certs/ca", key, &content),
        content: content.into(),
    })
}

fn secret_field(secret: &Secret, name: &str) -> Result<String, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(name))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(name))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| format!("{name} is missing"))?;
    String::from_utf8(bytes).map_err(|_| format!("{name} is not PEM text"))
}

/// Parses PEM blocks: `(label, decoded bytes)`. Text between blocks is ignored.
fn pem_blocks(text: &str, field: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        if !label.bytes().all(|b| b.is_ascii_uppercase() || b == b' ') {
            return Err(format!("{field}: bad PEM label {label:?}"));
        }
        let end = format!("-----END {label}-----");
        let mut b64 = String::new();
        let mut closed = false;
        for body in lines.by_ref() {
            if body == end {
                closed = true;
                break;
            }
            b64.push_str(body);
        }
        if !closed {
            return Err(format!("{field}: {label} block is not closed"));
        }
        let bytes = PEM_BASE64
            .decode(&b64)
            .map_err(|_| format!("{field}: {label} block is not valid base64"))?;
        if bytes.is_empty() {
            return Err(format!("{field}: {label} block is empty"));
        }
        blocks.push((label.to_string(), bytes));
    }
    if blocks.is_empty() {
        return Err(format!("{field} holds no PEM block"));
    }
    Ok(blocks)
}

/// PEM bodies as OpenSSL reads them: the standard alphabet (RFC 4648), padding optional, and
/// unused bits of the last character ignored. Whitespace is never part of a body: its lines
/// are trimmed and joined first.
const PEM_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// What a leaf certificate that does not parse is reported as.
const NOT_X509: &str = "tls.crt: the certificate is not valid DER X.509";

/// Checks that the private key belongs to the (first) certificate, by comparing public keys:
/// the RSA modulus and exponent, or the EC public point. HAProxy refuses a mismatched pair
/// and would reject the whole configuration; refusing it here drops only this Secret. Keys
/// whose public half cannot be read without cryptography (EC keys without their public
/// point, Ed25519) are accepted and left to HAProxy.
fn key_matches_certificate(cert: &Certificate, label: &str, key: &[u8]) -> Result<(), String> {
    let certified = certified_public(cert.tbs_certificate().subject_public_key_info())
        .ok_or_else(|| NOT_X509.to_string())?;
    let key_public = match label {
        "RSA PRIVATE KEY" => rsa_private_public(key),
        "EC PRIVATE KEY" => ec_private_public(key),
        "PRIVATE KEY" => pkcs8_public(key),
        _ => return Err(format!("tls.key: unsupported key type {label:?}")),
    };
    match key_public {
        Some(KeyPublic::Unknown) => Ok(()),
        Some(public) if public == certified => Ok(()),
        Some(_) => Err("tls.key does not belong to the certificate in tls.crt".to_string()),
        None => Err("tls.key: the private key is not valid DER".to_string()),
    }
}

/// The public half of a key pair, as far as it can be read without cryptography.
#[derive(Debug, PartialEq, Eq)]
enum KeyPublic<'a> {
    Rsa {
        modulus: &'a [u8],
        exponent: &'a [u8],
    },
    Ec {
        point: &'a [u8],
    },
    Unknown,
}

/// The public key a certificate certifies (its SubjectPublicKeyInfo).
fn certified_public(spki: &SubjectPublicKeyInfoOwned) -> Option<KeyPublic<'_>> {
    let key = spki.subject_public_key.as_bytes()?;
    if spki.algorithm.oid == pkcs1::ALGORITHM_OID {
        let rsa = RsaPublicKeyRef::from_der(key).ok()?;
        Some(KeyPublic::Rsa {
            modulus: rsa.modulus.as_bytes(),
            exponent: rsa.public_exponent.as_bytes(),
        })
    } else if spki.algorithm.oid == sec1::ALGORITHM_OID {
        Some(KeyPublic::Ec { point: key })
    } else {
        Some(KeyPublic::Unknown)
    }
}

/// A PKCS#1 RSAPrivateKey's modulus and public exponent.
fn rsa_private_public(key: &[u8]) -> Option<KeyPublic<'_>> {
    let rsa = RsaPrivateKeyRef::from_der(key).ok()?;
    Some(KeyPublic::Rsa {
        modulus: rsa.modulus.as_bytes(),
        exponent: rsa.public_exponent.as_bytes(),
    })
}

/// A SEC1 ECPrivateKey's public point, when it carries one.
fn ec_private_public(key: &[u8]) -> Option<KeyPublic<'_>> {
    let ec = EcPrivateKey::from_der(key).ok()?;
    Some(match ec.public_key {
        Some(point) => KeyPublic::Ec { point },
        None => KeyPublic::Unknown,
    })
}

/// A PKCS#8 PrivateKeyInfo: the public half of the RSA or EC key it wraps.
fn pkcs8_public(key: &[u8]) -> Option<KeyPublic<'_>> {
    let info = PrivateKeyInfoRef::from_der(key).ok()?;
    let inner = info.private_key.as_bytes();
    if info.algorithm.oid == pkcs1::ALGORITHM_OID {
        rsa_private_public(inner)
    } else if info.algorithm.oid == sec1::ALGORITHM_OID {
        ec_private_public(inner)
    } else {
        Some(KeyPublic::Unknown)
    }
}

/// Appends a PEM block of `label` holding `body` to `out`.
fn encode_block(out: &mut String, label: &str, body: &[u8]) {
    out.reserve(body.len().div_ceil(3) * 4 * 65 / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    let encoded = PEM_BASE64.encode(body);
    // Lines of 64 characters, as PEM writes them (RFC 7468); base64 is ASCII, so any
    // index is a character boundary.
    let mut rest = encoded.as_str();
    while !rest.is_empty() {
        let (line, tail) = rest.split_at(rest.len().min(64));
        out.push_str(line);
        out.push('\n');
        rest = tail;
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(crt: &str, key: &str) -> Secret {
        let mut data = std::collections::BTreeMap::new();
        data.insert("tls.crt".to_string(), crt.to_string());
        data.insert("tls.key".to_string(), key.to_string());
        Secret {
            string_data: Some(data),
            ..Secret::default()
        }
    }

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../../tests/fixtures/tls/", $name))
        };
    }

    #[test]
    fn matching_pairs_are_accepted_in_every_key_format() {
        let key = Key::new("ns", "s");
        for (crt, k) in [
            (fixture!("rsa.crt"), fixture!("rsa.key")),
            (fixture!("rsa.crt"), fixture!("rsa-pkcs1.key")),
            (fixture!("ec.crt"), fixture!("ec.key")),
            (fixture!("ec.crt"), fixture!("ec-pkcs8.key")),
            // Public halves that cannot be read without cryptography are left to HAProxy.
            (fixture!("ec.crt"), fixture!("ec-no-public.key")),
            (fixture!("ed25519.crt"), fixture!("ed25519.key")),
            // A multi-prime RSA key (PKCS#1 version 1, its otherPrimeInfos).
            (fixture!("rsa-3primes.crt"), fixture!("rsa-3primes.key")),
            // A 23-byte serial number, past RFC 5280's 20, as OpenSSL writes and reads it.
            (fixture!("ec-long-serial.crt"), fixture!("ec.key")),
        ] {
            let pem = pem_file(&key, &secret(crt, k)).unwrap();
            assert_eq!(pem.path, file_path("certs", &key, &pem.content));
            assert!(pem.path.as_str().starts_with("certs/ns_s_"), "{}", pem.path);
            assert_eq!(pem.path.secret(), &key);
            assert!(pem.content.contains("-----BEGIN CERTIFICATE-----"));
        }
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let key = Key::new("ns", "s");
        for (crt, k) in [
            (fixture!("rsa.crt"), fixture!("other-rsa.key")),
            (fixture!("ec.crt"), fixture!("other-ec.key")),
            (fixture!("rsa.crt"), fixture!("ec.key")),
            (fixture!("rsa-3primes.crt"), fixture!("rsa.key")),
            (fixture!("ec.crt"), fixture!("rsa-pkcs1.key")),
        ] {
            let err = pem_file(&key, &secret(crt, k)).unwrap_err();
            assert!(err.contains("does not belong"), "{err}");
        }
    }

    #[test]
    fn rejects_secrets_without_a_key_or_with_junk() {
        let key = Key::new("ns", "s");
        let mut s = secret(fixture!("rsa.crt"), "");
        s.string_data.as_mut().unwrap().remove("tls.key");
        assert!(pem_file(&key, &s).unwrap_err().contains("tls.key"));
        let junk = "-----BEGIN PRIVATE KEY-----\n%[env(X)]\n-----END PRIVATE KEY-----\n";
        assert!(
            pem_file(&key, &secret(fixture!("rsa.crt"), junk))
                .unwrap_err()
                .contains("base64")
        );
        let not_der = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";
        assert!(
            pem_file(&key, &secret(not_der, fixture!("rsa.key")))
                .unwrap_err()
                .contains("X.509")
        );
    }

    #[test]
    fn expiry_is_read_from_the_certificate() {
        // rsa.crt: notAfter=Nov  5 22:02:11 2126 GMT (`openssl x509 -noout -enddate`),
        // which `date -d ... +%s` gives as 4949589731.
        assert_eq!(not_after(fixture!("rsa.crt")), Some(4_949_589_731));
        // The file made from a Secret reports the same date, read from its decoded leaf.
        let key = Key::new("ns", "web-tls");
        let (pem, end) =
            certificate_file(&key, &secret(fixture!("rsa.crt"), fixture!("rsa.key"))).unwrap();
        assert_eq!(end, Some(4_949_589_731));
        assert_eq!(not_after(&pem.content), end);
    }

    /// Hostile DER is refused with the documented messages and never panics: every
    /// truncation of a real certificate and key, lengths past the end or too long to be
    /// real, BER's indefinite length, deep nesting, trailing bytes, and every byte flipped.
    #[test]
    fn malformed_der_is_refused_without_panicking() {
        let key = Key::new("ns", "s");
        let block = |label: &str, der: &[u8]| {
            let mut text = String::new();
            encode_block(&mut text, label, der);
            text
        };
        let der_of = |text: &str| pem_blocks(text, "f").unwrap().remove(0).1;
        let cert = der_of(fixture!("rsa.crt"));
        let rsa_key = der_of(fixture!("rsa.key"));
        let ec_key = der_of(fixture!("ec.key"));
        let with_cert = |der: &[u8]| {
            pem_file(
                &key,
                &secret(&block("CERTIFICATE", der), fixture!("rsa.key")),
            )
        };
        let mut hostile: Vec<Vec<u8>> = (1..cert.len()).map(|n| cert[..n].to_vec()).collect();
        hostile.extend([
            vec![0x30, 0x84, 0xff, 0xff, 0xff, 0xff, 0x30],
            vec![0x30, 0x89, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            vec![0x30, 0x80, 0x02, 0x01, 0x01, 0x00, 0x00],
            [0x30, 0x82].repeat(5_000),
            [cert.as_slice(), &[0x00]].concat(),
        ]);
        for der in &hostile {
            assert_eq!(with_cert(der).unwrap_err(), NOT_X509, "{der:x?}");
            let ca = ca_file(&key, &secret(&block("CERTIFICATE", der), "")).unwrap_err();
            assert_eq!(ca, "tls.crt: a certificate is not valid DER X.509");
            assert_eq!(not_after(&block("CERTIFICATE", der)), None);
        }
        for (label, der) in [("PRIVATE KEY", &rsa_key), ("EC PRIVATE KEY", &ec_key)] {
            for n in 1..der.len() {
                let err = pem_file(&key, &secret(fixture!("rsa.crt"), &block(label, &der[..n])))
                    .unwrap_err();
                assert_eq!(
                    err, "tls.key: the private key is not valid DER",
                    "{label} {n}"
                );
            }
        }
        // A byte flipped anywhere: refused or (in a signature, say) accepted, never a panic.
        for i in 0..cert.len() {
            let mut der = cert.clone();
            der[i] ^= 0xff;
            let _ = with_cert(&der);
        }
        for i in 0..rsa_key.len() {
            let mut der = rsa_key.clone();
            der[i] ^= 0xff;
            let _ = pem_file(
                &key,
                &secret(fixture!("rsa.crt"), &block("PRIVATE KEY", &der)),
            );
        }
    }

    /// PEM bodies are written back in lines of 64 characters and read with or without their
    /// padding; a character outside the alphabet, whitespace inside a line included, is not
    /// base64.
    #[test]
    fn pem_bodies_round_trip_in_lines_of_64() {
        for len in 1..200usize {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let mut pem = String::new();
            encode_block(&mut pem, "CERTIFICATE", &data);
            let body: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
            let (last, full) = body.split_last().unwrap();
            assert!(full.iter().all(|l| l.len() == 64), "{len}: {pem:?}");
            assert!(!last.is_empty() && last.len() <= 64, "{len}: {pem:?}");
            let blocks = pem_blocks(&pem, "tls.crt").unwrap();
            assert_eq!(blocks, [("CERTIFICATE".to_string(), data.clone())]);
            let unpadded = pem_blocks(&pem.replace('=', ""), "tls.crt").unwrap();
            assert_eq!(unpadded[0].1, data);
        }
        let mut known = String::new();
        encode_block(&mut known, "X", b"foobar");
        assert_eq!(known, "-----BEGIN X-----\nZm9vYmFy\n-----END X-----\n");
        for body in ["Zm9v!", "Zm 9v", "Zm9vY"] {
            let pem = format!("-----BEGIN X-----\n{body}\n-----END X-----\n");
            let err = pem_blocks(&pem, "tls.crt").unwrap_err();
            assert_eq!(err, "tls.crt: X block is not valid base64");
        }
    }

    #[test]
    fn file_names_follow_the_content_and_name_their_secret() {
        let key = Key::new("ns", "web-tls");
        let a = file_path("certs", &key, "one");
        let b = file_path("certs", &key, "two");
        assert_ne!(a, b);
        assert_eq!(a, file_path("certs", &key, "one"));
        assert_eq!(a.as_str().len(), "certs/ns_web-tls_.pem".len() + 16);
        assert!(a.as_str().starts_with("certs/ns_web-tls_"), "{a}");
        assert_eq!(a.secret(), &key);
        // Names of different Secrets differ, whatever the content.
        let other = Key::new("ns-web", "tls");
        assert_ne!(file_path("certs", &other, "one"), a);
        assert_eq!(file_path("certs/ca", &key, "one").secret(), &key);
    }
}
