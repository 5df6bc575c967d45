//! Basic authentication: the `userlist` sections routes authenticate against, read from Secrets.
//!
//! A script only names the Secret (`auth-secret`); its content is read here. Each data key is a
//! user name and its value that user's crypt(3) hash, the incumbent controller's format. A bad
//! entry is reported against the Secret (without its value: hashes are secrets too) and
//! skipped; the other users still log in. A route whose Secret is missing, or whose
//! authentication is misconfigured, checks an empty userlist: nobody logs in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{BasicAuth, Model, UserEntry, Userlist};
use crate::objects::{Key, Kind, ObjectRef};
use crate::store::Store;
use crate::values;

/// The userlists of one translation, by name.
#[derive(Debug, Clone, Default)]
pub struct Userlists {
    lists: BTreeMap<String, Userlist>,
}

impl Userlists {
    /// Takes the userlists of `other` that this one does not hold yet: what requiring them
    /// here would have done (a userlist is read from its Secret the first time only).
    pub fn absorb(&mut self, other: &Userlists) {
        for (name, list) in &other.lists {
            self.lists
                .entry(name.clone())
                .or_insert_with(|| list.clone());
        }
    }

    /// Makes sure the userlist `auth` checks exists, reading its Secret the first time. A
    /// missing Secret is reported against `ingress`, whose routes then let nobody in.
    pub fn require(
        &mut self,
        auth: &BasicAuth,
        store: &Store,
        ingress: &ObjectRef,
        diags: &mut Diagnostics,
    ) {
        let secret = auth.secret.as_deref().and_then(|reference| {
            let key = match values::parse_secret_ref(reference) {
                Ok((Some(ns), name)) => Key::new(ns, name),
                _ => return None,
            };
            let found = store.secret(&key).map(|s| (key, s.clone()));
            if found.is_none() {
                diags.object(
                    Severity::Error,
                    ingress,
                    "auth-secret",
                    format!(
                        "Secret {reference} does not exist; nobody can log in on these routes until it does"
                    ),
                );
            }
            found
        });
        if self.lists.contains_key(&auth.userlist) {
            return;
        }
        let users = match secret {
            Some((key, secret)) => users(&secret, &key, diags),
            None => Vec::new(),
        };
        self.lists.insert(
            auth.userlist.clone(),
            Userlist {
                name: auth.userlist.clone(),
                users,
            },
        );
    }

    /// The userlists, sorted by name.
    pub fn into_vec(self) -> Vec<Userlist> {
        self.lists.into_values().collect()
    }
}

/// The users of a Secret: each data key is a user name, its value a crypt(3) hash (one final
/// line feed is dropped, as the incumbent does). `stringData` entries win over `data`, as the
/// API server merges them. Bad entries are reported and skipped.
pub fn users(secret: &Secret, key: &Key, diags: &mut Diagnostics) -> Vec<UserEntry> {
    let object = ObjectRef::new(Kind::Secret, key);
    let mut entries: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for (name, value) in secret.data.iter().flatten() {
        entries.insert(name, &value.0);
    }
    for (name, value) in secret.string_data.iter().flatten() {
        entries.insert(name, value.as_bytes());
    }
    let mut users = Vec::new();
    for (name, bytes) in entries {
        let field = format!("data.{name}");
        let entry = values::parse_user_name(name).and_then(|user| {
            let text =
                std::str::from_utf8(bytes).map_err(|_| "the value is not text".to_string())?;
            let text = text.strip_suffix('\n').unwrap_or(text);
            let text = text.strip_suffix('\r').unwrap_or(text);
            Ok(UserEntry {
                password: values::parse_password_hash(text)?,
                name: user,
            })
        });
        match entry {
            Ok(entry) => {
                if !entry.password.starts_with('$') {
                    diags.object(
                        Severity::Warning,
                        &object,
                        &field,
                        "a DES crypt hash: only the first 8 characters of the password count; prefer $6$ or bcrypt",
                    );
                }
                users.push(entry);
            }
            Err(e) => diags.object(
                Severity::Error,
                &object,
                &field,
                format!("{e}; this user is skipped"),
            ),
        }
    }
    if users.is_empty() {
        diags.object(
            Severity::Warning,
            &object,
            "data",
            "no usable user (basic-auth); nobody can log in on the routes using this Secret",
        );
    }
    users
}

/// The model with every password hash replaced, for display (`/debug/model`).
pub fn redacted(model: &Model) -> Model {
    let mut m = model.clone();
    for list in &mut m.userlists {
        for user in &mut list.users {
            user.password = REDACTED.to_string();
        }
    }
    m
}

/// haproxy.cfg with the hash of every `user ... password <hash>` line replaced, for display
/// (`/debug/config`).
pub fn redact_config(cfg: &str) -> String {
    let mut out = String::with_capacity(cfg.len());
    for line in cfg.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let words: Vec<&str> = trimmed.split_whitespace().collect();
        match words.as_slice() {
            ["user", name, "password", _] => {
                out.push_str(&line[..line.len() - trimmed.len()]);
                out.push_str(&format!("user {name} password {REDACTED}"));
                if line.ends_with('\n') {
                    out.push('\n');
                }
            }
            _ => out.push_str(line),
        }
    }
    out
}

const REDACTED: &str = "'(redacted)'";

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(entries: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn bad_entries_are_reported_without_their_value_and_skipped() {
        let key = Key::new("shop", "creds");
        let mut diags = Diagnostics::new();
        let users = users(
            &secret(&[
                (
                    "alice",
                    "$6$saltsalt$6Ln9l6BtDgyKwSHwdUE47gnhcuIsgmQhFvEwo9YcWYBgzykQj0GKDn5SZB7NxuK0rgczjYbaFhtalyn4hhc8k1\n",
                ),
                ("bob", "$apr1$abcdefgh$0123456789012345678901"),
                ("carol", "hunter2"),
                ("bad name", "$1$PvFUlKnf$xCdm0Nn5zrcGsN2/WdkUZ."),
            ]),
            &key,
            &mut diags,
        );
        let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["alice"]);
        assert!(!users[0].password.ends_with('\n'));
        let msgs: Vec<String> = diags.iter().map(ToString::to_string).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(
            msgs.iter().all(|m| m.contains("Secret shop/creds")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m.contains("data.bob") && m.contains("$apr1$"))
        );
        assert!(msgs.iter().all(|m| !m.contains("hunter2")), "{msgs:?}");
    }

    #[test]
    fn redaction_hides_every_hash() {
        let cfg = "userlist auth_shop_creds\n  user alice password '$6$x$y'\n  user bob password '$1$a$b'\nbackend b\n";
        let out = redact_config(cfg);
        assert!(!out.contains("$6$") && !out.contains("$1$"), "{out}");
        assert!(
            out.contains("  user alice password '(redacted)'\n"),
            "{out}"
        );
        assert!(out.ends_with("backend b\n"));
    }
}
