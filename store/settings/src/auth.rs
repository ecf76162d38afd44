//! `[auth]`: bearer tokens. A token never travels on the command line, which
//! every user of the machine can read in `/proc/*/cmdline`, so any local user
//! could take a token from it: the
//! lists come from the `KILN_WRITE_TOKENS` / `KILN_READ_TOKENS` variables or
//! the config file, or from files named by `--write-tokens-file` /
//! `--read-tokens-file` (a path is no secret).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The variable holding the write tokens, comma separated.
pub const WRITE_TOKENS_ENV: &str = "KILN_WRITE_TOKENS";
/// The variable holding the read tokens, comma separated.
pub const READ_TOKENS_ENV: &str = "KILN_READ_TOKENS";
/// The variable holding the write tokens bound to namespaces, as
/// `namespace:token` entries, comma separated.
pub const NAMESPACE_WRITE_TOKENS_ENV: &str = "KILN_NAMESPACE_WRITE_TOKENS";
/// The variables the store reads that are no flag's: the token lists.
pub const TOKEN_ENVIRONMENT: [&str; 3] = [
    WRITE_TOKENS_ENV,
    READ_TOKENS_ENV,
    NAMESPACE_WRITE_TOKENS_ENV,
];

/// `[auth]` in the file. The token lists are no flags (`arg(skip)`); the
/// store fills them from the environment with
/// [`AuthOptions::overlay_environment`].
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthOptions {
    /// Bearer tokens accepted for writes (auth is off when none); from
    /// `KILN_WRITE_TOKENS`, comma separated, or the file.
    #[arg(skip)]
    pub write_tokens: Option<Vec<String>>,
    /// Bearer tokens accepted for queries (auth is off when none); from
    /// `KILN_READ_TOKENS`, comma separated, or the file.
    #[arg(skip)]
    pub read_tokens: Option<Vec<String>>,
    /// Write tokens that may write only some namespaces, as
    /// `namespace:token` entries (a token in several entries may write
    /// each of their namespaces); from `KILN_NAMESPACE_WRITE_TOKENS`,
    /// comma separated, or the file. A series written with one of them
    /// must carry one of its namespaces in its `namespace` label, so a
    /// tenant cannot write, or use up the series of, another's namespace.
    #[arg(skip)]
    pub namespace_write_tokens: Option<Vec<String>>,
    /// A file holding the write tokens, one per line or comma separated
    /// (e.g. a mounted Secret); instead of `KILN_WRITE_TOKENS`.
    #[arg(long, env = "KILN_WRITE_TOKENS_FILE")]
    pub write_tokens_file: Option<PathBuf>,
    /// A file holding the read tokens, one per line or comma separated;
    /// instead of `KILN_READ_TOKENS`.
    #[arg(long, env = "KILN_READ_TOKENS_FILE")]
    pub read_tokens_file: Option<PathBuf>,
    /// A file holding the namespace-bound write tokens, `namespace:token`,
    /// one per line or comma separated; instead of
    /// `KILN_NAMESPACE_WRITE_TOKENS`.
    #[arg(long, env = "KILN_NAMESPACE_WRITE_TOKENS_FILE")]
    pub namespace_write_tokens_file: Option<PathBuf>,
}

impl AuthOptions {
    /// Lays the token variables, as `variable` reads them, over the lists
    /// from the file: the environment ranks above the file.
    pub fn overlay_environment(&mut self, variable: impl Fn(&str) -> Option<String>) {
        if let Some(text) = variable(WRITE_TOKENS_ENV) {
            self.write_tokens = Some(split_tokens(&text));
        }
        if let Some(text) = variable(READ_TOKENS_ENV) {
            self.read_tokens = Some(split_tokens(&text));
        }
        if let Some(text) = variable(NAMESPACE_WRITE_TOKENS_ENV) {
            self.namespace_write_tokens = Some(split_tokens(&text));
        }
    }
}

/// Tokens in a variable or a token file: separated by commas or line
/// breaks, trimmed, empty ones dropped.
pub fn split_tokens(text: &str) -> Vec<String> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_overrides_the_file_lists() {
        let mut auth = AuthOptions {
            write_tokens: Some(vec!["from-file".into()]),
            read_tokens: Some(vec!["kept".into()]),
            ..AuthOptions::default()
        };
        auth.overlay_environment(|name| (name == WRITE_TOKENS_ENV).then(|| " a, b,,".into()));
        assert_eq!(auth.write_tokens, Some(vec!["a".into(), "b".into()]));
        assert_eq!(auth.read_tokens, Some(vec!["kept".into()]));
        assert_eq!(split_tokens("x\r\ny\n\n"), ["x", "y"]);
    }
}
