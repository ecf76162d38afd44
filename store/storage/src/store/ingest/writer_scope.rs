//! Which namespaces a write may add to. A writer whose token is bound to
//! namespaces must name one of them in every series it writes: the
//! `namespace` label is the client's own text, and without the binding a
//! tenant could write series into another tenant's namespace, and use up
//! the series that namespace may hold in the store.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::error::StorageError;

/// The namespaces a write may add to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WriterScope {
    /// Any namespace: writes are open, or the writer's token is not bound
    /// to namespaces (the node agents, which label each profile with the
    /// namespace its pod runs in).
    #[default]
    AnyNamespace,
    /// Only these namespaces (at least one).
    Namespaces(Arc<BTreeSet<String>>),
}

impl WriterScope {
    /// The one namespace the writer may write, when it may write only one:
    /// a series that names none is taken to be in it.
    pub fn sole_namespace(&self) -> Option<&str> {
        match self {
            Self::Namespaces(set) if set.len() == 1 => set.first().map(String::as_str),
            _ => None,
        }
    }

    /// Refuses the write when any of its series' namespaces (`""`: the
    /// series has no `namespace` label) is outside the scope.
    pub fn check<'a>(
        &self,
        mut namespaces: impl Iterator<Item = &'a str>,
    ) -> Result<(), StorageError> {
        let Self::Namespaces(allowed) = self else {
            return Ok(());
        };
        match namespaces.find(|namespace| !allowed.contains(*namespace)) {
            None => Ok(()),
            Some(namespace) => Err(StorageError::NamespaceNotAllowed {
                namespace: namespace.chars().take(256).collect(),
                allowed: allowed.iter().take(16).cloned().collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(namespaces: &[&str]) -> WriterScope {
        WriterScope::Namespaces(Arc::new(
            namespaces.iter().map(|n| (*n).to_owned()).collect(),
        ))
    }

    #[test]
    fn a_bound_writer_writes_only_its_namespaces() {
        let shop = scope(&["shop", "checkout"]);
        assert!(shop.check(["shop", "checkout"].into_iter()).is_ok());
        let err = shop.check(["shop", "payments"].into_iter()).unwrap_err();
        assert!(
            matches!(&err, StorageError::NamespaceNotAllowed { namespace, allowed }
                if namespace == "payments" && allowed == &["checkout", "shop"]),
            "{err:?}"
        );
        assert!(err.is_client_error());
        // A series without the label is in no namespace the writer holds.
        assert!(shop.check([""].into_iter()).is_err());
        assert_eq!(shop.sole_namespace(), None);
        assert_eq!(scope(&["shop"]).sole_namespace(), Some("shop"));
    }

    #[test]
    fn an_unbound_writer_writes_any_namespace() {
        let any = WriterScope::AnyNamespace;
        assert!(any.check(["payments", ""].into_iter()).is_ok());
        assert_eq!(any.sole_namespace(), None);
    }
}
