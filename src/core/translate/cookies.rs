//! The secret key of dynamic persistence cookies (`cookie-persistence`).
//!
//! Scripts say which backends want a dynamic cookie; the key itself never passes through a
//! script. It comes from the Secret named by `--dynamic-cookie-key-secret` (data key
//! `dynamic-cookie-key`), so that every replica, reading the same Secret, computes the same
//! cookie for the same pod. Without a usable key a dynamic cookie falls back to the server
//! slot's name (as `cookie-persistence-no-dynamic` does), which is also the same on every
//! replica; a hard-coded key, as the incumbent controller has, would let anyone who reads its
//! source map cookies back to pod addresses.

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::BackendSettings;
use crate::objects::{Key, Kind, ObjectRef};
use crate::store::Store;
use crate::values;

/// The Secret's data key holding the dynamic cookie key.
pub const SECRET_DATA_KEY: &str = "dynamic-cookie-key";

/// Gives a backend that wants a dynamic cookie the key from `secret`, or, without a usable
/// one, turns its cookie into a static one with a warning on `subject` (the backend's
/// Service). A problem with the Secret itself is an error on the Secret.
pub fn resolve(
    settings: &mut std::sync::Arc<BackendSettings>,
    store: &Store,
    secret: Option<&Key>,
    subject: &ObjectRef,
    diags: &mut Diagnostics,
) {
    // Settings without a cookie stay shared.
    if settings.cookie_persistence.is_none() {
        return;
    }
    let Some(cookie) = std::sync::Arc::make_mut(settings)
        .cookie_persistence
        .as_mut()
    else {
        return;
    };
    cookie.key = None;
    if !cookie.dynamic {
        return;
    }
    let reason = match secret {
        None => "no dynamic cookie key is configured (--dynamic-cookie-key-secret)".to_string(),
        Some(key) => match read_key(store, key) {
            Ok(k) => {
                cookie.key = Some(k);
                return;
            }
            Err(e) => {
                diags.object(
                    Severity::Error,
                    &ObjectRef::new(Kind::Secret, key),
                    format!("data.{SECRET_DATA_KEY}"),
                    format!("{e}; dynamic cookies fall back to server slot names"),
                );
                format!("the dynamic cookie key Secret {key} is unusable")
            }
        },
    };
    cookie.dynamic = false;
    diags.object(
        Severity::Warning,
        subject,
        "cookie-persistence",
        format!(
            "{reason}; the cookie {} holds the server slot's name instead, as with cookie-persistence-no-dynamic",
            cookie.name
        ),
    );
}

/// The key in the Secret, from `data` or `stringData`.
fn read_key(store: &Store, key: &Key) -> Result<String, String> {
    let secret = store
        .secret(key)
        .ok_or_else(|| "the Secret does not exist".to_string())?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_DATA_KEY))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(SECRET_DATA_KEY))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| format!("the Secret has no {SECRET_DATA_KEY}"))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{SECRET_DATA_KEY} is not text (the value is not shown)"))?;
    values::parse_cookie_key(&text).map_err(|e| format!("{SECRET_DATA_KEY} {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::model::CookiePersistence;
    use crate::objects::Object;

    fn wanting(dynamic: bool) -> BackendSettings {
        BackendSettings {
            cookie_persistence: Some(CookiePersistence {
                name: "SRV".into(),
                dynamic,
                key: Some("injected-by-a-script".into()),
            }),
            ..BackendSettings::default()
        }
    }

    fn store_with(value: &str) -> Store {
        let mut store = Store::default();
        store.upsert(Object::Secret(std::sync::Arc::new(Secret {
            metadata: ObjectMeta {
                name: Some("cookie".into()),
                namespace: Some("ingress".into()),
                ..ObjectMeta::default()
            },
            string_data: Some(BTreeMap::from([(
                SECRET_DATA_KEY.to_string(),
                value.to_string(),
            )])),
            ..Secret::default()
        })));
        store
    }

    fn run(settings: &mut BackendSettings, store: &Store, secret: Option<&Key>) -> Vec<String> {
        let mut diags = Diagnostics::new();
        let subject = ObjectRef::new(Kind::Service, &Key::new("shop", "web"));
        let mut shared = std::sync::Arc::new(settings.clone());
        resolve(&mut shared, store, secret, &subject, &mut diags);
        *settings = BackendSettings::clone(&shared);
        diags
            .into_sorted()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_dynamic_cookie_gets_the_key_from_the_secret() {
        let secret = Key::new("ingress", "cookie");
        let mut s = wanting(true);
        assert!(run(&mut s, &store_with("0123456789abcdef\n"), Some(&secret)).is_empty());
        let c = s.cookie_persistence.unwrap();
        assert!(c.dynamic);
        assert_eq!(c.key.as_deref(), Some("0123456789abcdef"));
    }

    #[test]
    fn without_a_usable_key_the_cookie_holds_slot_names() {
        let secret = Key::new("ingress", "cookie");
        for (store, flag) in [
            (Store::default(), None),
            (Store::default(), Some(&secret)),
            (store_with("bad key with spaces"), Some(&secret)),
        ] {
            let mut s = wanting(true);
            let msgs = run(&mut s, &store, flag);
            let c = s.cookie_persistence.unwrap();
            assert!(!c.dynamic && c.key.is_none(), "{msgs:?}");
            assert!(
                msgs.iter()
                    .any(|m| m.starts_with("warning: Service shop/web")),
                "{msgs:?}"
            );
            assert!(msgs.iter().all(|m| !m.contains("bad key")), "{msgs:?}");
        }
    }

    #[test]
    fn a_static_cookie_never_carries_a_key() {
        let secret = Key::new("ingress", "cookie");
        let mut s = wanting(false);
        assert!(run(&mut s, &store_with("0123456789abcdef"), Some(&secret)).is_empty());
        assert_eq!(s.cookie_persistence.unwrap().key, None);
    }
}
