//! Tenant namespaces, in one place: how a tenant's model or function name becomes the key the
//! server keeps it under, and how a key is shown again.
//!
//! A name that a user gives is letters, digits, `_`, `-` and `.` (the store checks it), so it
//! never contains `/`. The operator's models (`--model-repository`, the operator's deployments)
//! keep their plain names as keys; a tenant's model `m` is kept as `tenant/m`. Everything below
//! the server (the table, the queues, the store, the call chain) works on keys and knows nothing
//! of tenants; the server resolves names to keys on the way in.
//!
//! Messages never carry keys: whatever names a model in a message names it through
//! [`ModelKey`]'s `Display`, which is the name its owner gave it. A tenant therefore reads its
//! own names, and nothing rewrites a message's text afterwards (a guest's message is passed on
//! exactly as it was written). Logs carry the key itself, as a field.

use std::fmt;

/// Separates a tenant's name from a model's or function's name in a key.
const SEPARATOR: char = '/';

/// How a function appears in a call chain: `function:<key>`. The `:` is in no name, so no
/// model's key starts so (with `function/` a tenant named `function` could pass its models'
/// calls off as a function's, and reach the operator's namespace).
const FUNCTION_CALLER: &str = "function:";

/// A model's or function's key, read: whose it is and the name its owner gave it.
///
/// `Display` shows the name (what messages say); [`ModelKey::key`] is what tables hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelKey<'a> {
    /// The tenant that owns it (None: the operator).
    pub tenant: Option<&'a str>,
    /// The name its owner gave it.
    pub name: &'a str,
}

impl<'a> ModelKey<'a> {
    /// `name` in `tenant`'s namespace (None: the operator's).
    pub fn new(tenant: Option<&'a str>, name: &'a str) -> Self {
        ModelKey { tenant, name }
    }

    /// Reads a key the server keeps.
    pub fn parse(key: &'a str) -> Self {
        match key.split_once(SEPARATOR) {
            Some((tenant, name)) => ModelKey {
                tenant: Some(tenant),
                name,
            },
            None => ModelKey {
                tenant: None,
                name: key,
            },
        }
    }

    /// The key the server keeps it under.
    pub fn key(&self) -> String {
        match self.tenant {
            Some(tenant) => format!("{tenant}{SEPARATOR}{}", self.name),
            None => self.name.to_owned(),
        }
    }

    /// The start every key of `tenant` has (for listing or removing a tenant's keys).
    pub fn tenant_prefix(tenant: &str) -> String {
        format!("{tenant}{SEPARATOR}")
    }

    /// Whether a name as a client gave it is a key (names never hold the separator): such a
    /// name reaches no model by the client's own namespace.
    pub fn is_key(name: &str) -> bool {
        name.contains(SEPARATOR)
    }
}

impl fmt::Display for ModelKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The name in messages of the model or function kept under `key`.
pub fn shown(key: &str) -> &str {
    ModelKey::parse(key).name
}

/// An entry of a call chain: the model or the function that made a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller<'a> {
    Model(ModelKey<'a>),
    Function(ModelKey<'a>),
}

impl<'a> Caller<'a> {
    /// The call-chain entry of the function kept under `key`.
    pub fn function_entry(key: &str) -> String {
        format!("{FUNCTION_CALLER}{key}")
    }

    /// Reads a call-chain entry.
    pub fn parse(entry: &'a str) -> Self {
        match entry.strip_prefix(FUNCTION_CALLER) {
            Some(key) => Caller::Function(ModelKey::parse(key)),
            None => Caller::Model(ModelKey::parse(entry)),
        }
    }

    /// The namespace the caller's names resolve in: its owner's.
    pub fn namespace(&self) -> Option<&'a str> {
        match self {
            Caller::Model(key) | Caller::Function(key) => key.tenant,
        }
    }
}

impl fmt::Display for Caller<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Model(key) => write!(f, "{key}"),
            Caller::Function(key) => write!(f, "function '{key}'"),
        }
    }
}

/// A call chain as messages show it: `a -> b -> function 'f'`.
pub fn shown_chain<'a>(entries: impl IntoIterator<Item = &'a str>) -> String {
    entries
        .into_iter()
        .map(|entry| Caller::parse(entry).to_string())
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_show_their_names() {
        let tenants = ModelKey::new(Some("acme"), "m");
        assert_eq!(tenants.key(), "acme/m");
        assert_eq!(ModelKey::parse("acme/m"), tenants);
        assert_eq!(ModelKey::new(None, "m").key(), "m");
        assert_eq!(ModelKey::parse("m"), ModelKey::new(None, "m"));
        assert_eq!(tenants.to_string(), "m");
        assert_eq!(shown("acme/m"), "m");
        assert!(ModelKey::tenant_prefix("acme").starts_with("acme") && ModelKey::is_key("a/b"));
    }

    #[test]
    fn callers_resolve_in_their_owner_and_show_their_names() {
        let f = Caller::function_entry("acme/f");
        assert_eq!(Caller::parse(&f).namespace(), Some("acme"));
        assert_eq!(Caller::parse("acme/ens").namespace(), Some("acme"));
        assert_eq!(
            Caller::parse(&Caller::function_entry("f")).namespace(),
            None
        );
        assert_eq!(Caller::parse("shared").namespace(), None);
        // A tenant named `function`: its models are models, in its namespace.
        assert_eq!(
            Caller::parse("function/m"),
            Caller::Model(ModelKey::new(Some("function"), "m"))
        );
        assert_eq!(Caller::parse("function/m").namespace(), Some("function"));
        assert_eq!(
            shown_chain(["acme/ens", &Caller::function_entry("acme/f"), "acme/h"]),
            "ens -> function 'f' -> h"
        );
    }
}
