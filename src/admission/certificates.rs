//! The webhook's own CA and serving certificate, for clusters without cert-manager: kept in
//! one Secret that every replica shares, with the CA bundle written into the
//! ValidatingWebhookConfiguration, and renewed before they expire.
//!
//! A renewal makes a new CA and a new serving certificate together, and the bundle keeps the
//! previous CA beside the new one. The bundle is written into the webhook configuration before
//! any replica serves the new certificate, so the API server trusts old and new alike while
//! replicas catch up. The serving files are written where `server` reads them, and it picks
//! them up within seconds.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

use crate::objects::Key;

/// The Secret annotation that records the names a serving certificate was made for.
const DNS_NAMES_ANNOTATION: &str = "portcullis.io/dns-names";

/// What is managed, and where the serving pair is written for the server.
#[derive(Debug, Clone)]
pub struct ManagedConfig {
    /// The Secret holding `tls.crt`, `tls.key` and `ca.crt` (the bundle).
    pub secret: Key,
    /// The ValidatingWebhookConfiguration whose webhooks get the bundle as `caBundle`.
    pub webhook_configuration: String,
    /// The names the serving certificate is for (`portcullis-webhook.portcullis.svc`).
    pub dns_names: Vec<String>,
    /// How long a serving certificate is valid; it is renewed with a third of that left.
    pub validity: Duration,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// A CA and the serving certificate it signed, as PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// A new CA and a serving certificate for `dns_names`, valid from now for `validity` (the CA
/// a day longer, so that it never expires before what it signed).
pub fn issue(dns_names: &[String], validity: Duration) -> Result<Issued, String> {
    let now = time::OffsetDateTime::now_utc();
    let err = |e: rcgen::Error| format!("making the webhook certificate: {e}");
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "portcullis-webhook-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = now - time::Duration::minutes(5);
    ca.not_after = now + validity + time::Duration::days(1);
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let key = KeyPair::generate().map_err(err)?;
    let mut serving = CertificateParams::new(dns_names.to_vec()).map_err(err)?;
    serving.distinguished_name.push(
        DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    serving.not_before = now - time::Duration::minutes(5);
    serving.not_after = now + validity;
    let cert = serving.signed_by(&key, &ca_cert, &ca_key).map_err(err)?;
    Ok(Issued {
        ca: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Whether the Secret's serving certificate must be renewed: missing or unreadable, made for
/// other names, or with less than a third of `validity` left.
pub fn needs_renewal(secret: Option<&Secret>, config: &ManagedConfig, now: SystemTime) -> bool {
    let Some(secret) = secret else {
        return true;
    };
    let names = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DNS_NAMES_ANNOTATION));
    if names != Some(&config.dns_names.join(",")) {
        return true;
    }
    let Some(cert) = field(secret, "tls.crt") else {
        return true;
    };
    if field(secret, "tls.key").is_none() || field(secret, "ca.crt").is_none() {
        return true;
    }
    let Some(not_after) = crate::translate::tls::not_after(&cert) else {
        return true;
    };
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let left = not_after.saturating_sub(i64::try_from(now).unwrap_or(i64::MAX));
    left < i64::try_from(config.validity.as_secs() / 3).unwrap_or(i64::MAX)
}

fn field(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone())
        .ok()
        .filter(|s| !s.is_empty())
}

/// The first certificate of a PEM bundle.
fn first_certificate(bundle: &str) -> Option<String> {
    let end = "-----END CERTIFICATE-----";
    let stop = bundle.find(end)? + end.len();
    let start = bundle[..stop].find("-----BEGIN CERTIFICATE-----")?;
    Some(format!("{}\n", &bundle[start..stop]))
}

/// One pass: renew the Secret when it needs it (another replica may win the write: its pair is
/// used), write the bundle into the webhook configuration, then the serving pair to the files.
pub async fn ensure(client: &kube::Client, config: &ManagedConfig) -> Result<(), String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.secret.namespace);
    let name = &config.secret.name;
    let what = format!("Secret {}", config.secret);
    let mut current = secrets
        .get_opt(name)
        .await
        .map_err(|e| format!("reading {what}: {e}"))?;
    if needs_renewal(current.as_ref(), config, SystemTime::now()) {
        let issued = issue(&config.dns_names, config.validity)?;
        // The previous CA stays trusted beside the new one until the next renewal.
        let previous = current
            .as_ref()
            .and_then(|s| field(s, "ca.crt"))
            .and_then(|b| first_certificate(&b));
        let bundle = format!("{}{}", issued.ca, previous.unwrap_or_default());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(config.secret.namespace.clone()),
                annotations: Some(
                    [(DNS_NAMES_ANNOTATION.to_string(), config.dns_names.join(","))].into(),
                ),
                resource_version: current
                    .as_ref()
                    .and_then(|s| s.metadata.resource_version.clone()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(
                [
                    ("tls.crt", issued.cert),
                    ("tls.key", issued.key),
                    ("ca.crt", bundle),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
            ),
            ..Secret::default()
        };
        let written = if current.is_some() {
            secrets.replace(name, &PostParams::default(), &secret).await
        } else {
            secrets.create(&PostParams::default(), &secret).await
        };
        current = Some(match written {
            Ok(s) => {
                tracing::info!(secret = %config.secret, "webhook certificate issued");
                s
            }
            // Another replica renewed it first: take its pair.
            Err(kube::Error::Api(s)) if s.code == 409 => secrets
                .get(name)
                .await
                .map_err(|e| format!("reading {what}: {e}"))?,
            Err(e) => return Err(format!("writing {what}: {e}")),
        });
    }
    let secret = current.ok_or_else(|| format!("{what} is missing"))?;
    let bundle = field(&secret, "ca.crt").ok_or_else(|| format!("{what} has no ca.crt"))?;
    set_ca_bundle(client, &config.webhook_configuration, bundle.as_bytes()).await?;
    for (file, key) in [
        (&config.key_file, "tls.key"),
        (&config.cert_file, "tls.crt"),
    ] {
        let content = field(&secret, key).ok_or_else(|| format!("{what} has no {key}"))?;
        write_if_changed(file, &content)?;
    }
    Ok(())
}

/// Sets `caBundle` of every webhook of the configuration, when it differs.
async fn set_ca_bundle(client: &kube::Client, name: &str, bundle: &[u8]) -> Result<(), String> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let what = format!("ValidatingWebhookConfiguration {name}");
    for _ in 0..3 {
        let mut configuration = api
            .get(name)
            .await
            .map_err(|e| format!("reading {what}: {e}"))?;
        let mut changed = false;
        for webhook in configuration.webhooks.iter_mut().flatten() {
            if webhook.client_config.ca_bundle.as_ref().map(|b| &b.0[..]) != Some(bundle) {
                webhook.client_config.ca_bundle = Some(ByteString(bundle.to_vec()));
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        match api
            .replace(name, &PostParams::default(), &configuration)
            .await
        {
            Ok(_) => {
                tracing::info!(configuration = name, "webhook CA bundle written");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("writing {what}: {e}")),
        }
    }
    Err(format!("writing {what}: it kept changing"))
}

/// Writes `content` to `file` (atomically) unless it holds it already.
fn write_if_changed(file: &std::path::Path, content: &str) -> Result<(), String> {
    if std::fs::read_to_string(file).is_ok_and(|c| c == content) {
        return Ok(());
    }
    let dir = file.parent().unwrap_or(std::path::Path::new("."));
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, content.as_bytes())
        .map_err(|e| format!("{}: {e}", file.display()))?;
    tmp.persist(file)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(())
}

/// Connects, makes sure a certificate is in place (retrying for up to a minute: the API server
/// may not answer at once), then keeps it renewed in the background.
pub async fn start(
    kubeconfig: Option<PathBuf>,
    config: ManagedConfig,
    every: Duration,
) -> Result<(), String> {
    let connect = crate::cluster::connect::ConnectConfig {
        kubeconfig,
        external: false,
        startup_timeout: None,
        tcp_crd: crate::cluster::connect::TcpCrd::Off,
    };
    let client_config = crate::cluster::connect::client_config(&connect)
        .await
        .map_err(|e| e.to_string())?;
    let client = kube::Client::try_from(client_config).map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    loop {
        match ensure(&client, &config).await {
            Ok(()) => break,
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                tracing::warn!("webhook certificate (retried): {e}");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e),
        }
    }
    tokio::spawn(run(client, config, every));
    Ok(())
}

/// Keeps the certificate renewed: a pass every `every`, failures logged and retried.
pub async fn run(client: kube::Client, config: ManagedConfig, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = ensure(&client, &config).await {
            tracing::warn!("webhook certificate: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ManagedConfig {
        ManagedConfig {
            secret: Key::new("portcullis", "portcullis-webhook-tls"),
            webhook_configuration: "portcullis-webhook".to_string(),
            dns_names: vec!["portcullis-webhook.portcullis.svc".to_string()],
            validity: Duration::from_secs(90 * 86_400),
            cert_file: PathBuf::from("tls.crt"),
            key_file: PathBuf::from("tls.key"),
        }
    }

    fn secret(issued: &Issued, names: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                annotations: Some([(DNS_NAMES_ANNOTATION.to_string(), names.to_string())].into()),
                ..ObjectMeta::default()
            },
            data: Some(
                [
                    ("tls.crt", issued.cert.clone()),
                    ("tls.key", issued.key.clone()),
                    ("ca.crt", issued.ca.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn a_fresh_certificate_holds_until_a_third_of_its_life_is_left() {
        let config = config();
        let issued = issue(&config.dns_names, config.validity).unwrap();
        let s = secret(&issued, "portcullis-webhook.portcullis.svc");
        let now = SystemTime::now();
        assert!(!needs_renewal(Some(&s), &config, now));
        assert!(!needs_renewal(
            Some(&s),
            &config,
            now + Duration::from_secs(59 * 86_400)
        ));
        assert!(needs_renewal(
            Some(&s),
            &config,
            now + Duration::from_secs(61 * 86_400)
        ));
        assert!(needs_renewal(None, &config, now));
        let other = secret(&issued, "old.portcullis.svc");
        assert!(needs_renewal(Some(&other), &config, now));
    }

    #[test]
    fn the_serving_certificate_is_for_the_names_and_signed_by_the_ca() {
        let names = vec!["a.example".to_string()];
        let issued = issue(&names, Duration::from_secs(3600)).unwrap();
        assert!(issued.ca.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.key.contains("PRIVATE KEY"));
        assert_eq!(
            first_certificate(&format!("{}{}", issued.ca, issued.cert)),
            Some(issued.ca)
        );
    }
}
