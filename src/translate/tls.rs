//! TLS Secrets become PEM files: certificate chain then private key.
//!
//! Only the PEM blocks are kept (re-wrapped from their decoded base64), so nothing else a
//! Secret carries reaches disk. File names come from the Secret's namespace and name, which
//! are validated DNS names, never from other user strings.

use k8s_openapi::api::core::v1::Secret;

use crate::model::PemFile;
use crate::objects::Key;

/// Builds the PEM file for a `kubernetes.io/tls`-shaped Secret (`tls.crt` + `tls.key`).
pub fn pem_file(key: &Key, secret: &Secret) -> Result<PemFile, String> {
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
    let mut content = String::new();
    for (label, body) in certs.iter().filter(|(l, _)| l == "CERTIFICATE") {
        content.push_str(&encode_block(label, body));
    }
    content.push_str(&encode_block(&key_block.0, &key_block.1));
    // One stable name per Secret: a rotated certificate replaces the content of the same
    // file, which HAProxy updates in place (`set ssl cert` + `commit ssl cert`), also for the
    // default certificate, which HAProxy will not remove from a crt-list at run time.
    Ok(PemFile {
        path: format!("certs/{}_{}.pem", key.namespace, key.name),
        content,
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
        let bytes = base64_decode(&b64)
            .ok_or_else(|| format!("{field}: {label} block is not valid base64"))?;
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

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn encode_block(label: &str, body: &[u8]) -> String {
    let b64 = base64_encode(body);
    let mut s = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        s.push_str(&String::from_utf8_lossy(line));
        s.push('\n');
    }
    s.push_str(&format!("-----END {label}-----\n"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for len in 0..70 {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            assert_eq!(base64_decode(&base64_encode(&data)), Some(data));
        }
    }

    #[test]
    fn rejects_secrets_without_a_key_or_with_junk() {
        let mut secret = Secret::default();
        let mut data = std::collections::BTreeMap::new();
        data.insert(
            "tls.crt".to_string(),
            "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n".to_string(),
        );
        secret.string_data = Some(data.clone());
        let key = Key::new("ns", "s");
        assert!(pem_file(&key, &secret).unwrap_err().contains("tls.key"));
        data.insert(
            "tls.key".to_string(),
            "-----BEGIN PRIVATE KEY-----\n%[env(X)]\n-----END PRIVATE KEY-----\n".to_string(),
        );
        secret.string_data = Some(data.clone());
        assert!(pem_file(&key, &secret).unwrap_err().contains("base64"));
        data.insert(
            "tls.key".to_string(),
            "-----BEGIN PRIVATE KEY-----\nREVG\n-----END PRIVATE KEY-----\n".to_string(),
        );
        secret.string_data = Some(data);
        let pem = pem_file(&key, &secret).unwrap();
        assert_eq!(pem.path, "certs/ns_s.pem");
        assert!(pem.content.contains("QUJD") && pem.content.contains("REVG"));
    }
}
