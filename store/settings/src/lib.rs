//! The settings `kiln-store` reads, declared once.
//!
//! [`StoreSettings`] derives both clap and serde: each field is at the same
//! time a flag, the `KILN_*` environment variable named next to it, and a key
//! of the TOML config file (its table is the section the field sits in). Every
//! value is optional here; the store layers them (defaults < file <
//! environment < flags) and checks them into its resolved `Config`.
//!
//! The operator depends on this crate to render the store's command line from
//! the same type, so a flag it renders that the store does not know fails the
//! operator's tests instead of a pod. Only clap and serde: no server.

use std::path::PathBuf;

use clap::Parser;
use serde::{Deserialize, Serialize};

mod auth;
mod bucket;
mod limits;
mod recording;
mod server;
mod storage;
mod symbolization;

pub use auth::{
    AuthOptions, NAMESPACE_WRITE_TOKENS_ENV, READ_TOKENS_ENV, TOKEN_ENVIRONMENT, WRITE_TOKENS_ENV,
    split_tokens,
};
pub use bucket::BucketOptions;
pub use limits::LimitOptions;
pub use recording::{RecordingOptions, RecordingRuleList, RecordingRuleOptions};
pub use server::ServerOptions;
pub use storage::StorageOptions;
pub use symbolization::SymbolizationOptions;

/// The schema version of the config file this build reads.
pub const FILE_VERSION: u32 = 1;

/// `kiln-store`: Kiln's profile store. Every flag can also be set through the
/// environment variable named in its help, or in the `--config` file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Parser, Deserialize, Serialize)]
#[command(
    name = "kiln-store",
    version,
    about,
    after_help = "Tokens are never flags (a command line shows in /proc/*/cmdline): set \
                  KILN_WRITE_TOKENS / KILN_READ_TOKENS (comma separated) and \
                  KILN_NAMESPACE_WRITE_TOKENS (namespace:token, comma separated), [auth] in \
                  the config file, or --write-tokens-file / --read-tokens-file / \
                  --namespace-write-tokens-file."
)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// TOML config file (lowest precedence after the built-in defaults).
    #[arg(long, env = "KILN_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The file's schema version; must be [`FILE_VERSION`]. Not a flag.
    #[arg(skip)]
    #[serde(default, skip_serializing)]
    pub version: Option<u32>,
    /// `[server]`: listeners, connections and logging.
    #[command(flatten)]
    #[serde(default)]
    pub server: ServerOptions,
    /// `[storage]`: local data, the head, retention and memory.
    #[command(flatten)]
    #[serde(default)]
    pub storage: StorageOptions,
    /// `[bucket]`: where blocks live.
    #[command(flatten)]
    #[serde(default)]
    pub bucket: BucketOptions,
    /// `[limits]`: what one request, profile or tenant may use.
    #[command(flatten)]
    #[serde(default)]
    pub limits: LimitOptions,
    /// `[recording]`: recording rules and their series' retention.
    #[command(flatten)]
    #[serde(default)]
    pub recording: RecordingOptions,
    /// `[symbolization]`: naming frames sent without function names.
    #[command(flatten)]
    #[serde(default)]
    pub symbolization: SymbolizationOptions,
    /// `[auth]`: bearer tokens, from the environment or files only.
    #[command(flatten)]
    #[serde(default)]
    pub auth: AuthOptions,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[test]
    fn clap_definition_is_consistent() {
        StoreSettings::command().debug_assert();
    }

    #[test]
    fn every_flag_reads_a_kiln_environment_variable() {
        for arg in StoreSettings::command().get_arguments() {
            if matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert!(
                env.as_deref().is_some_and(|e| e.starts_with("KILN_")),
                "--{} has no KILN_ environment variable",
                arg.get_id()
            );
        }
    }

    #[test]
    fn flags_keep_their_names_and_file_keys_their_tables() {
        let settings = StoreSettings::try_parse_from([
            "kiln-store",
            "--object-store=s3",
            "--bucket=profiles",
            "--bucket-allow-http=true",
            "--max-connections=9",
            "--retention=7d",
            "--max-inflight=3",
            "--write-tokens-file=/run/w",
        ])
        .unwrap();
        assert_eq!(settings.bucket.kind.as_deref(), Some("s3"));
        assert_eq!(settings.bucket.name.as_deref(), Some("profiles"));
        assert_eq!(settings.bucket.allow_http, Some(true));
        assert_eq!(settings.server.max_connections, Some(9));
        assert_eq!(settings.storage.retention.as_deref(), Some("7d"));
        assert_eq!(settings.limits.max_inflight, Some(3));
        assert_eq!(
            settings.auth.write_tokens_file,
            Some(PathBuf::from("/run/w"))
        );
        let file: StoreSettings = toml::from_str(
            "version = 1\n[bucket]\nkind = \"s3\"\n[server]\nmax_connections = 9\n\
             [auth]\nwrite_tokens = [\"w\"]\n",
        )
        .unwrap();
        assert_eq!(file.version, Some(1));
        assert_eq!(file.bucket.kind.as_deref(), Some("s3"));
        assert_eq!(file.server.max_connections, Some(9));
        assert_eq!(file.auth.write_tokens, Some(vec!["w".to_owned()]));
    }

    #[test]
    fn tokens_are_not_flags() {
        for refused in [
            "--write-tokens=w",
            "--read-tokens=r",
            "--namespace-write-tokens=shop:w",
        ] {
            let err = StoreSettings::try_parse_from(["kiln-store", refused]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
        }
        let names: Vec<String> = StoreSettings::command()
            .get_arguments()
            .filter_map(|arg| arg.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        for variable in TOKEN_ENVIRONMENT {
            assert!(!names.iter().any(|name| name == variable), "{variable}");
        }
    }

    #[test]
    fn flags_and_environment_overlay_only_what_they_set() {
        let mut settings: StoreSettings = toml::from_str(
            "version = 1\n[server]\nlisten = \"0.0.0.0:9000\"\n[storage]\nreplica = \"file\"\n",
        )
        .unwrap();
        let matches = StoreSettings::command()
            .try_get_matches_from(["kiln-store", "--replica", "flag"])
            .unwrap();
        settings.update_from_arg_matches(&matches).unwrap();
        assert_eq!(
            settings.server.listen,
            Some("0.0.0.0:9000".parse().unwrap()),
            "kept from the file"
        );
        assert_eq!(settings.storage.replica.as_deref(), Some("flag"));
    }
}
