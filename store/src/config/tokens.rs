//! Bearer tokens, without which any pod in the cluster could read every
//! namespace's profiles and write spoofed ones. Never flags, which any
//! local user can read in the process list. The lists come from
//! `KILN_WRITE_TOKENS` / `KILN_READ_TOKENS` or the config file, or from the
//! files `--write-tokens-file` / `--read-tokens-file` name, read once at
//! start-up.

use std::path::Path;

use kiln_store_settings::{AuthOptions, split_tokens};

use super::ConfigError;

/// Reads the token files `auth` names into its lists, through `read` (the
/// file system, or a table in tests). A list and a file for the same
/// access are refused as ambiguous, and so is a file that holds no token:
/// an empty Secret must not start a store without auth.
pub fn read_token_files(
    auth: &mut AuthOptions,
    read: impl Fn(&Path) -> std::io::Result<String>,
) -> Result<(), ConfigError> {
    for (setting, list, file) in [
        (
            "auth.write_tokens_file",
            &mut auth.write_tokens,
            &auth.write_tokens_file,
        ),
        (
            "auth.read_tokens_file",
            &mut auth.read_tokens,
            &auth.read_tokens_file,
        ),
        (
            "auth.namespace_write_tokens_file",
            &mut auth.namespace_write_tokens,
            &auth.namespace_write_tokens_file,
        ),
    ] {
        let Some(path) = file else { continue };
        if list.is_some() {
            return Err(ConfigError::Invalid {
                setting,
                message: "give the tokens either in a file or as a list (environment or \
                          config file), not both"
                    .to_owned(),
            });
        }
        let text = read(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let tokens = split_tokens(&text);
        if tokens.is_empty() {
            return Err(ConfigError::Invalid {
                setting,
                message: format!("{} holds no token", path.display()),
            });
        }
        *list = Some(tokens);
    }
    Ok(())
}

/// The tokens of a list, trimmed, empty ones dropped (no list: auth off).
pub(super) fn trimmed(list: Option<&[String]>) -> Vec<String> {
    list.unwrap_or_default()
        .iter()
        .map(|token| token.trim().to_owned())
        .filter(|token| !token.is_empty())
        .collect()
}

/// A write token bound to namespaces: a series written with it must carry
/// one of them in its `namespace` label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceToken {
    /// The token.
    pub token: String,
    /// The namespaces it may write, sorted, at least one.
    pub namespaces: Vec<String>,
}

/// The namespace-bound write tokens from `namespace:token` entries, one per
/// token with all its namespaces. The namespace must be a Kubernetes
/// namespace name (a DNS label), so neither a typo nor a pasted token
/// passes for one; a token that is also an unbound write token is refused,
/// as the two lists would disagree about what it may write.
pub(super) fn namespace_tokens(
    entries: Option<&[String]>,
    unbound: &[String],
) -> Result<Vec<NamespaceToken>, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        setting: "auth.namespace_write_tokens",
        message,
    };
    let mut tokens: Vec<NamespaceToken> = Vec::new();
    for (index, entry) in entries.unwrap_or_default().iter().enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        // Never echo an entry: it holds a token.
        let Some((namespace, token)) = entry.split_once(':') else {
            return Err(invalid(format!("entry {index} is not `namespace:token`")));
        };
        let (namespace, token) = (namespace.trim(), token.trim());
        if !is_namespace_name(namespace) {
            return Err(invalid(format!(
                "entry {index}: the namespace is not a Kubernetes namespace name \
                 (lower-case letters, digits and '-', at most 63)"
            )));
        }
        if token.is_empty() {
            return Err(invalid(format!("entry {index} holds no token")));
        }
        if unbound.iter().any(|t| t == token) {
            return Err(invalid(format!(
                "entry {index}: its token is also in the write tokens, which may write \
                 every namespace; list it in one place"
            )));
        }
        match tokens.iter_mut().find(|t| t.token == token) {
            Some(known) => known.namespaces.push(namespace.to_owned()),
            None => tokens.push(NamespaceToken {
                token: token.to_owned(),
                namespaces: vec![namespace.to_owned()],
            }),
        }
    }
    for token in &mut tokens {
        token.namespaces.sort();
        token.namespaces.dedup();
    }
    Ok(tokens)
}

/// A DNS label, as Kubernetes names namespaces.
fn is_namespace_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}
