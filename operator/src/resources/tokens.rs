//! The store's bearer tokens: the `<store>-tokens` Secret, the store's environment that reads
//! it, and the agents' read-only mount of the write token.
//!
//! Tokens reach the processes through `secretKeyRef` environment variables and files, never
//! through flags, because arguments show in every node user's `/proc/*/cmdline`, where any
//! local user could read a token and write or read profiles with it.
//! The random bytes come from the caller (the controller reads the OS RNG), so these builders
//! stay pure and testable.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, KeyToPath, Secret, SecretKeySelector, SecretVolumeSource, Volume,
    VolumeMount,
};

use super::{StoreNames, owned_meta};
use crate::api::ProfileStore;

/// Secret key of the token that writes need; the only key the agents see.
pub const WRITE_TOKEN_KEY: &str = "write-token";
/// Secret key of the token that queries need when `auth.requireReadToken` is set.
pub const READ_TOKEN_KEY: &str = "read-token";
/// Random bytes per token: 256 bits, far beyond guessing.
pub const TOKEN_BYTES: usize = 32;
/// Where agents find the write token: a directory, so kubelet can swap the file atomically.
pub const AGENT_TOKEN_DIR: &str = "/etc/kiln/store-token";
/// Name of the agents' token volume.
pub const AGENT_TOKEN_VOLUME: &str = "store-token";
/// Owner read-only: the agent runs as root and nothing else in the pod needs the token.
const TOKEN_FILE_MODE: i32 = 0o400;

/// A freshly generated pair of tokens, hex encoded. `Debug` never prints them.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreTokens {
    /// Token for writes.
    pub write: String,
    /// Token for queries.
    pub read: String,
}

impl StoreTokens {
    /// Tokens from two buffers of random bytes.
    pub fn from_random(write: &[u8; TOKEN_BYTES], read: &[u8; TOKEN_BYTES]) -> Self {
        Self {
            write: hex(write),
            read: hex(read),
        }
    }
}

impl std::fmt::Debug for StoreTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreTokens { <redacted> }")
    }
}

/// Lower-case hex: no character that the store's comma-separated token list or an HTTP
/// header would treat specially.
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
            // Writing to a String cannot fail.
            let _ = write!(text, "{byte:02x}");
            text
        })
}

/// The tokens Secret, owned by the store so it is deleted with it. It carries no applied-hash:
/// the operator creates it once and never applies it again, so users may rotate the tokens.
pub fn secret(store: &ProfileStore, names: &StoreNames, tokens: &StoreTokens) -> Secret {
    Secret {
        metadata: owned_meta(store, names, &names.tokens, "store"),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([
            (
                WRITE_TOKEN_KEY.to_owned(),
                ByteString(tokens.write.clone().into_bytes()),
            ),
            (
                READ_TOKEN_KEY.to_owned(),
                ByteString(tokens.read.clone().into_bytes()),
            ),
        ])),
        ..Secret::default()
    }
}

/// The store's `KILN_WRITE_TOKENS` and `KILN_READ_TOKENS`, as the spec's `auth` asks for.
pub fn store_env(store: &ProfileStore, names: &StoreNames) -> Vec<EnvVar> {
    let auth = &store.spec.auth;
    [
        (
            "KILN_WRITE_TOKENS",
            WRITE_TOKEN_KEY,
            auth.require_write_token,
        ),
        ("KILN_READ_TOKENS", READ_TOKEN_KEY, auth.require_read_token),
    ]
    .into_iter()
    .filter(|(_, _, required)| *required)
    .map(|(variable, key, _)| EnvVar {
        name: variable.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: names.tokens.clone(),
                key: key.to_owned(),
                // A missing token must stop the pod, not start a store without auth.
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    })
    .collect()
}

/// The agents' volume, mount and `KILN_STORE_TOKEN_FILE`, when the store requires a write
/// token. Only the write token is projected: an agent on a compromised node must not be able
/// to read every namespace's profiles.
pub fn agent_token(
    store: &ProfileStore,
    names: &StoreNames,
) -> Option<(Volume, VolumeMount, EnvVar)> {
    if !store.spec.auth.require_write_token {
        return None;
    }
    let volume = Volume {
        name: AGENT_TOKEN_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(names.tokens.clone()),
            items: Some(vec![KeyToPath {
                key: WRITE_TOKEN_KEY.to_owned(),
                path: WRITE_TOKEN_KEY.to_owned(),
                ..KeyToPath::default()
            }]),
            default_mode: Some(TOKEN_FILE_MODE),
            optional: Some(false),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mount = VolumeMount {
        name: AGENT_TOKEN_VOLUME.to_owned(),
        mount_path: AGENT_TOKEN_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    let env = EnvVar {
        name: "KILN_STORE_TOKEN_FILE".to_owned(),
        value: Some(format!("{AGENT_TOKEN_DIR}/{WRITE_TOKEN_KEY}")),
        ..EnvVar::default()
    };
    Some((volume, mount, env))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_lower_case_digits_per_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        let tokens = StoreTokens::from_random(&[7; TOKEN_BYTES], &[8; TOKEN_BYTES]);
        assert_eq!(tokens.write.len(), 2 * TOKEN_BYTES);
        assert!(!format!("{tokens:?}").contains("0707"));
    }
}
