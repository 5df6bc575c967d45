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
use sha2::{Digest, Sha256};

use crate::model::PemFile;
use crate::objects::Key;

/// `<dir>/<namespace>_<name>_<hash>.pem`: the hash is the first 16 hex digits of the
/// content's SHA-256 (neither the namespace nor the name can hold `_`).
pub fn file_path(dir: &str, key: &Key, content: &str) -> String {
    let digest = Sha256::digest(content.as_bytes());
    let mut path = format!("{dir}/{}_{}_", key.namespace, key.name);
    for b in &digest[..8] {
        path.push(char::from(HEX[usize::from(b >> 4)]));
        path.push(char::from(HEX[usize::from(b & 15)]));
    }
    path.push_str(".pem");
    path
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The Secret a certificate file under `certs/` was made from (see [`file_path`]).
pub fn secret_of_path(path: &str) -> Option<Key> {
    let stem = path.strip_prefix("certs/")?.strip_suffix(".pem")?;
    let (secret, hash) = stem.rsplit_once('_')?;
    let (ns, name) = secret.split_once('_')?;
    let well_formed = !ns.contains('/')
        && !name.contains('_')
        && hash.len() == 16
        && hash.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then(|| Key::new(ns, name))
}

/// When the (first) certificate of a PEM file stops being valid, in Unix seconds.
pub fn not_after(pem: &str) -> Option<i64> {
    let blocks = pem_blocks(pem, "certificate").ok()?;
    certificate_not_after(&blocks.iter().find(|(l, _)| l == "CERTIFICATE")?.1)
}

/// The `notAfter` of a DER X.509 certificate, in Unix seconds.
fn certificate_not_after(der: &[u8]) -> Option<i64> {
    let certificate = sequence(der)?;
    let fields = elements(certificate.first()?.1)?;
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let (tag, validity) = *fields.get(skip + 3)?;
    if tag != 0x30 {
        return None;
    }
    let times = elements(validity)?;
    let (tag, text) = *times.get(1)?;
    parse_time(tag, std::str::from_utf8(text).ok()?)
}

/// UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) to Unix seconds.
fn parse_time(tag: u8, text: &str) -> Option<i64> {
    let digits = text.strip_suffix('Z')?;
    let (year, rest) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy: i64 = digits[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &digits[2..])
        }
        (0x18, 14) => (digits[..4].parse().ok()?, &digits[4..]),
        _ => return None,
    };
    let n = |i: usize| rest.get(i..i + 2)?.parse::<i64>().ok();
    let (month, day, hour, minute, second) = (n(0)?, n(2)?, n(4)?, n(6)?, n(8)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
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
    let leaf = &certs
        .iter()
        .find(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| der.as_slice())
        .unwrap_or_default();
    key_matches_certificate(leaf, &key_block.0, &key_block.1)?;
    let mut content = String::new();
    for (label, body) in certs.iter().filter(|(l, _)| l == "CERTIFICATE") {
        encode_block(&mut content, label, body);
    }
    encode_block(&mut content, &key_block.0, &key_block.1);
    let pem = PemFile {
        path: file_path("certs", key, &content),
        content: content.into(),
    };
    Ok((pem, certificate_not_after(leaf)))
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
        if certificate_public_key(der).is_none() {
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

/// Checks that the private key belongs to the (first) certificate, by comparing public keys:
/// the RSA modulus and exponent, or the EC public point. HAProxy refuses a mismatched pair
/// and would reject the whole configuration; refusing it here drops only this Secret. Keys
/// whose public half cannot be read without cryptography (EC keys without their public
/// point, Ed25519) are accepted and left to HAProxy.
fn key_matches_certificate(cert: &[u8], label: &str, key: &[u8]) -> Result<(), String> {
    let spki = certificate_public_key(cert)
        .ok_or_else(|| "tls.crt: the certificate is not valid DER X.509".to_string())?;
    let key_public = match label {
        "RSA PRIVATE KEY" => rsa_private_public(key),
        "EC PRIVATE KEY" => ec_private_public(key),
        "PRIVATE KEY" => pkcs8_public(key),
        _ => return Err(format!("tls.key: unsupported key type {label:?}")),
    };
    match key_public {
        Some(KeyPublic::Unknown) => Ok(()),
        Some(public) if public == spki => Ok(()),
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

/// A DER element: (tag, contents, rest).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The elements of a SEQUENCE: (tag, contents) each.
fn sequence(input: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    match der(input)? {
        (0x30, body, _) => elements(body),
        _ => None,
    }
}

/// The elements in a run of DER (a SEQUENCE's contents).
fn elements(mut body: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut items = Vec::new();
    while !body.is_empty() {
        let (t, c, rest) = der(body)?;
        items.push((t, c));
        body = rest;
    }
    Some(items)
}

/// INTEGER contents without leading zero bytes, so equal numbers compare equal.
fn unsigned(int: &[u8]) -> &[u8] {
    let zeros = int.iter().take_while(|b| **b == 0).count();
    &int[zeros.min(int.len().saturating_sub(1))..]
}

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// The SubjectPublicKeyInfo of an X.509 certificate.
fn certificate_public_key(cert: &[u8]) -> Option<KeyPublic<'_>> {
    let certificate = sequence(cert)?;
    let (tag, tbs) = *certificate.first()?;
    if tag != 0x30 {
        return None;
    }
    let fields = elements(tbs)?;
    // [0] version is optional; then serial, signature, issuer, validity, subject, SPKI.
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let (tag, spki) = *fields.get(skip + 5)?;
    if tag != 0x30 {
        return None;
    }
    let spki = elements(spki)?;
    let algorithm = elements(spki.first()?.1)?;
    let oid = algorithm.first()?.1;
    let (tag, bits) = *spki.get(1)?;
    if tag != 0x03 || bits.first() != Some(&0) {
        return None;
    }
    let key = &bits[1..];
    if oid == OID_RSA {
        let rsa = sequence(key)?;
        Some(KeyPublic::Rsa {
            modulus: unsigned(rsa.first()?.1),
            exponent: unsigned(rsa.get(1)?.1),
        })
    } else if oid == OID_EC {
        Some(KeyPublic::Ec { point: key })
    } else {
        Some(KeyPublic::Unknown)
    }
}

/// PKCS#1 RSAPrivateKey: version, modulus, publicExponent, ...
fn rsa_private_public(key: &[u8]) -> Option<KeyPublic<'_>> {
    let fields = sequence(key)?;
    Some(KeyPublic::Rsa {
        modulus: unsigned(fields.get(1)?.1),
        exponent: unsigned(fields.get(2)?.1),
    })
}

/// SEC1 ECPrivateKey: version, privateKey, [0] parameters, [1] publicKey.
fn ec_private_public(key: &[u8]) -> Option<KeyPublic<'_>> {
    let fields = sequence(key)?;
    match fields.iter().find(|(t, _)| *t == 0xa1) {
        Some((_, public)) => {
            let (tag, bits, _) = der(public)?;
            if tag != 0x03 || bits.first() != Some(&0) {
                return None;
            }
            Some(KeyPublic::Ec { point: &bits[1..] })
        }
        None => Some(KeyPublic::Unknown),
    }
}

/// PKCS#8 PrivateKeyInfo: version, algorithm, privateKey (OCTET STRING holding the inner key).
fn pkcs8_public(key: &[u8]) -> Option<KeyPublic<'_>> {
    let fields = sequence(key)?;
    let algorithm = elements(fields.get(1)?.1)?;
    let oid = algorithm.first()?.1;
    let (tag, inner) = *fields.get(2)?;
    if tag != 0x04 {
        return None;
    }
    if oid == OID_RSA {
        rsa_private_public(inner)
    } else if oid == OID_EC {
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
            include_str!(concat!("../../tests/fixtures/tls/", $name))
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
        ] {
            let pem = pem_file(&key, &secret(crt, k)).unwrap();
            assert_eq!(pem.path, file_path("certs", &key, &pem.content));
            assert!(pem.path.starts_with("certs/ns_s_"), "{}", pem.path);
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
        assert_eq!(parse_time(0x17, "700101000000Z"), Some(0));
        assert_eq!(parse_time(0x18, "20000301000000Z"), Some(951_868_800));
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
        assert_eq!(a.len(), "certs/ns_web-tls_.pem".len() + 16);
        assert_eq!(secret_of_path(&a), Some(key.clone()));
        // Only certs/ itself, and only names this module makes.
        assert_eq!(secret_of_path(&file_path("certs/ca", &key, "one")), None);
        assert_eq!(secret_of_path("certs/ns_web-tls.pem"), None);
        assert_eq!(secret_of_path("certs/crt-list.txt"), None);
    }
}
