//! Creating a store's `<store>-tokens` Secret once. Create-if-absent rather than server-side
//! apply: applying random content would rewrite the tokens on every pass, and users must be
//! free to rotate them, so an existing Secret is never written to.

use std::io::Read;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

use super::{Context, ReconcileError};
use crate::api::ProfileStore;
use crate::resources::tokens::{self, StoreTokens, TOKEN_BYTES};
use crate::resources::{FIELD_MANAGER, StoreNames};

/// The kernel's CSPRNG; present in every container (the runtime provides `/dev`).
const RANDOM_DEVICE: &str = "/dev/urandom";

/// What [`ensure_secret`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokensSecret {
    /// The store requires no token, so no Secret is needed.
    NotNeeded,
    /// The Secret was there already (or another writer won a race to create it).
    Present,
    /// The Secret was created with new tokens.
    Created,
}

/// Creates the tokens Secret when the store requires a token and the Secret does not exist.
/// The existence check reads metadata only, so the operator never holds live tokens.
pub async fn ensure_secret(
    store: &ProfileStore,
    names: &StoreNames,
    ctx: &Context,
) -> Result<TokensSecret, ReconcileError> {
    if !store.spec.auth.needs_tokens() {
        return Ok(TokensSecret::NotNeeded);
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let name = &names.tokens;
    let existing = secrets
        .get_metadata_opt(name)
        .await
        .map_err(|source| ReconcileError::kube(format!("get Secret {name}"), source))?;
    if existing.is_some() {
        return Ok(TokensSecret::Present);
    }
    let generated = StoreTokens::from_random(&random_bytes()?, &random_bytes()?);
    let secret = tokens::secret(store, names, &generated);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match secrets.create(&params, &secret).await {
        Ok(_) => {
            ctx.metrics.wrote("Secret", "create");
            Ok(TokensSecret::Created)
        }
        // Someone created it between the read and the create: theirs stays.
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(TokensSecret::Present),
        Err(source) => Err(ReconcileError::kube(
            format!("create Secret {name}"),
            source,
        )),
    }
}

fn random_bytes() -> Result<[u8; TOKEN_BYTES], ReconcileError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open(RANDOM_DEVICE)
        .and_then(|mut device| device.read_exact(&mut bytes))
        .map_err(|source| ReconcileError::Random {
            device: RANDOM_DEVICE,
            source,
        })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_differ_between_calls() {
        let (Ok(first), Ok(second)) = (random_bytes(), random_bytes()) else {
            panic!("{RANDOM_DEVICE} is readable");
        };
        assert_ne!(first, second);
    }
}
