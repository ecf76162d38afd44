//! The TOML config file: the same [`StoreSettings`] the flags fill, read
//! from `[server]`, `[storage]`, `[bucket]`, `[limits]` and `[auth]`, with
//! `version = 1` required and unknown keys refused.

use std::path::Path;

use kiln_store_settings::{FILE_VERSION, StoreSettings};

use super::ConfigError;

/// Reads and checks a TOML config file.
pub fn read_file_settings(path: &Path) -> Result<StoreSettings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file_settings(&text, path)
}

/// Parses config file text; `path` is only used in errors.
pub fn parse_file_settings(text: &str, path: &Path) -> Result<StoreSettings, ConfigError> {
    let settings: StoreSettings = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim().to_owned(),
    })?;
    if settings.version != Some(FILE_VERSION) {
        return Err(ConfigError::Version {
            path: path.to_owned(),
            version: settings.version,
        });
    }
    Ok(settings)
}
