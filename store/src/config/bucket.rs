//! The object store blocks live in: `[bucket]` resolved.

use std::path::Path;

use kiln_store_settings::BucketOptions;

use super::ConfigError;

/// Where blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectStoreKind {
    /// A local directory.
    Local,
    /// Amazon S3 or an S3-compatible service.
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage.
    Azure,
}

/// Bucket settings after layering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSettings {
    /// The backend.
    pub kind: ObjectStoreKind,
    /// Bucket, container or directory.
    pub name: String,
    /// Custom endpoint.
    pub endpoint: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Prefix inside the bucket.
    pub prefix: Option<String>,
    /// Allow plain HTTP.
    pub allow_http: bool,
    /// Azure account.
    pub azure_account: Option<String>,
}

impl BucketSettings {
    /// Defaults applied and checked; a local bucket defaults to
    /// `<data_dir>/bucket`, the others need a name.
    pub fn resolve(options: &BucketOptions, data_dir: &Path) -> Result<Self, ConfigError> {
        let kind_text = options.kind.as_deref().unwrap_or("local");
        let kind = match kind_text {
            "local" | "file" | "filesystem" => ObjectStoreKind::Local,
            "s3" => ObjectStoreKind::S3,
            "gcs" => ObjectStoreKind::Gcs,
            "azure" => ObjectStoreKind::Azure,
            other => {
                return Err(ConfigError::Invalid {
                    setting: "bucket.kind",
                    message: format!("{other:?} is not one of local, s3, gcs, azure"),
                });
            }
        };
        let name = match (&kind, options.name.clone()) {
            (_, Some(name)) if !name.is_empty() => name,
            (ObjectStoreKind::Local, _) => data_dir.join("bucket").display().to_string(),
            _ => {
                return Err(ConfigError::Invalid {
                    setting: "bucket.name",
                    message: format!("object store {kind_text} needs a bucket name (--bucket)"),
                });
            }
        };
        if kind == ObjectStoreKind::Azure && options.azure_account.is_none() {
            return Err(ConfigError::Invalid {
                setting: "bucket.azure_account",
                message: "azure needs an account (--azure-account)".to_owned(),
            });
        }
        Ok(Self {
            kind,
            name,
            endpoint: options.endpoint.clone(),
            region: options.region.clone(),
            prefix: options
                .prefix
                .clone()
                .filter(|p| !p.trim_matches('/').is_empty()),
            allow_http: options.allow_http.unwrap_or(false),
            azure_account: options.azure_account.clone(),
        })
    }
}
