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
