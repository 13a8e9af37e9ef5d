//! Tenant namespaces, in one place: how a tenant's model or function name becomes the key the
//! server keeps it under, and back.
//!
//! A name that a user gives is letters, digits, `_`, `-` and `.` (the store checks it), so it
//! never contains `/`. The operator's models (`--model-repository`, the operator's deployments)
//! keep their plain names as keys; a tenant's model `m` is kept as `tenant/m`. Everything below
//! the server (the table, the queues, the store, the call chain) works on keys and knows nothing
//! of tenants; the server resolves names to keys on the way in and strips the tenant's prefix on
//! the way out.

/// Separates a tenant's name from a model's or function's name in a key.
pub const SEPARATOR: char = '/';

/// The key of `name` in `namespace` (`None`: the operator's).
pub fn qualify(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(tenant) => format!("{tenant}{SEPARATOR}{name}"),
        None => name.to_owned(),
    }
}

/// The namespace and the name of a key.
pub fn split(key: &str) -> (Option<&str>, &str) {
    match key.split_once(SEPARATOR) {
        Some((tenant, name)) => (Some(tenant), name),
        None => (None, key),
    }
}

/// The namespace a caller's names resolve in, from its entry in a call chain: a model key, or
/// `function/<key>` for a function.
pub fn of_caller(caller: &str) -> Option<&str> {
    split(caller.strip_prefix(FUNCTION_CALLER).unwrap_or(caller)).0
}

/// How a function appears in a call chain: `function/<key>`.
pub const FUNCTION_CALLER: &str = "function/";

/// What `namespace` is shown of `text`: its own prefix removed wherever a key of it appears, so
/// a tenant reads its names as it gave them. A key starts where a name can start (the start of
/// the text, or after a character no name holds), so `tenant/` inside other text (a guest's
/// message "bad data/x" for tenant `a`) is left as it is.
pub fn present(namespace: Option<&str>, text: &str) -> String {
    let Some(tenant) = namespace else {
        return text.to_owned();
    };
    let prefix = format!("{tenant}{SEPARATOR}");
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&prefix) {
        let starts_a_key = !rest[..at].chars().next_back().is_some_and(name_char);
        out.push_str(&rest[..at]);
        if !starts_a_key {
            out.push_str(&prefix);
        }
        rest = &rest[at + prefix.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_callers_resolve_in_their_owner() {
        assert_eq!(qualify(Some("acme"), "m"), "acme/m");
        assert_eq!(qualify(None, "m"), "m");
        assert_eq!(split("acme/m"), (Some("acme"), "m"));
        assert_eq!(split("m"), (None, "m"));
        assert_eq!(of_caller("acme/ens"), Some("acme"));
        assert_eq!(of_caller("function/acme/f"), Some("acme"));
        assert_eq!(of_caller("function/f"), None);
        assert_eq!(of_caller("shared"), None);
        assert_eq!(
            present(
                Some("acme"),
                "Request for unknown model: 'acme/m' is not found"
            ),
            "Request for unknown model: 'm' is not found"
        );
        // Only keys lose the prefix: not the same letters inside other words.
        assert_eq!(
            present(Some("a"), "a/x failed: bad data/x"),
            "x failed: bad data/x"
        );
        assert_eq!(present(Some("a"), "(a/x) -> a/y"), "(x) -> y");
    }
}
