//! Building a bucket from configuration: a local directory or a cloud
//! object store.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;

use super::Bucket;
use super::local_files::LocalFiles;
use crate::error::StorageError;

/// Where a bucket lives, for building an [`ObjectStore`] from configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketConfig {
    /// A directory on local disk.
    Local {
        /// The directory (created if missing).
        dir: std::path::PathBuf,
    },
    /// An S3 (or S3-compatible) bucket. Credentials not given here come from
    /// the usual `AWS_*` environment variables.
    #[cfg(feature = "aws")]
    S3 {
        /// Bucket name.
        bucket: String,
        /// Region, e.g. `us-east-1`.
        region: Option<String>,
        /// Custom endpoint for S3-compatible services, e.g. `http://127.0.0.1:9000`.
        endpoint: Option<String>,
        /// Access key id.
        access_key_id: Option<String>,
        /// Secret access key.
        secret_access_key: Option<String>,
        /// Allow plain-HTTP endpoints.
        allow_http: bool,
    },
    /// A Google Cloud Storage bucket; credentials from `GOOGLE_*` variables.
    #[cfg(feature = "gcp")]
    Gcs {
        /// Bucket name.
        bucket: String,
    },
    /// An Azure Blob Storage container; credentials from `AZURE_*` variables.
    #[cfg(feature = "azure")]
    Azure {
        /// Storage account.
        account: String,
        /// Container name.
        container: String,
    },
}

impl BucketConfig {
    /// Builds the object store this configuration names.
    pub fn build(&self) -> Result<Arc<dyn ObjectStore>, StorageError> {
        #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
        let config_err = |source: object_store::Error| StorageError::Config {
            message: source.to_string(),
        };
        match self {
            Self::Local { dir } => Ok(Arc::new(local_file_system(dir)?)),
            #[cfg(feature = "aws")]
            Self::S3 {
                bucket,
                region,
                endpoint,
                access_key_id,
                secret_access_key,
                allow_http,
            } => {
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_allow_http(*allow_http)
                    .with_retry(client_retries());
                if let Some(region) = region {
                    builder = builder.with_region(region);
                }
                if let Some(endpoint) = endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                if let Some(key) = access_key_id {
                    builder = builder.with_access_key_id(key);
                }
                if let Some(secret) = secret_access_key {
                    builder = builder.with_secret_access_key(secret);
                }
                Ok(Arc::new(builder.build().map_err(config_err)?))
            }
            #[cfg(feature = "gcp")]
            Self::Gcs { bucket } => Ok(Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .map_err(config_err)?,
            )),
            #[cfg(feature = "azure")]
            Self::Azure { account, container } => Ok(Arc::new(
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_account(account)
                    .with_container_name(container)
                    .build()
                    .map_err(config_err)?,
            )),
        }
    }

    /// The bucket this configuration names, its objects under `prefix`
    /// when one is given. A local directory's block files are read by
    /// range from disk directly (see `local_files`); every other
    /// operation goes through the object store.
    pub fn open(&self, prefix: Option<&str>) -> Result<Bucket, StorageError> {
        let prefix = prefix
            .map(|p| p.trim_matches('/'))
            .filter(|p| !p.is_empty());
        let store = self.build()?;
        let store: Arc<dyn ObjectStore> = match prefix {
            Some(prefix) => Arc::new(object_store::prefix::PrefixStore::new(store, prefix)),
            None => store,
        };
        let mut bucket = Bucket::new(store);
        // Irrefutable in a build without a cloud backend.
        #[allow(irrefutable_let_patterns)]
        if let Self::Local { dir } = self {
            let files = LocalFiles::new(local_file_system(dir)?, prefix.map(Path::from));
            bucket.files = Some(Arc::new(files));
        }
        Ok(bucket)
    }
}

/// The object store over local directory `dir`, created if missing.
fn local_file_system(
    dir: &std::path::Path,
) -> Result<object_store::local::LocalFileSystem, StorageError> {
    std::fs::create_dir_all(dir).map_err(|e| StorageError::Config {
        message: format!("cannot create bucket directory {}: {e}", dir.display()),
    })?;
    // NB: without fsync a block's files and directory entries may still be
    // only in the page cache when the flush that uploaded it deletes the
    // WAL segments it replaces, and a power cut then loses acknowledged
    // writes. With it, every put syncs the file, and the directories it
    // creates or renames into, before it returns.
    let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
        .map_err(|source| StorageError::Config {
            message: source.to_string(),
        })?
        .with_automatic_cleanup(true)
        .with_fsync(true);
    Ok(store)
}

/// Retries inside one bucket request. The store retries every failed
/// upload and listing itself (each flush and re-list interval), so the
/// client's own retries are kept short: object_store's default (10 retries
/// within 3 minutes) hid an unreachable bucket from `/readyz` for minutes.
#[cfg(feature = "aws")]
fn client_retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig::default(),
        max_retries: 3,
        retry_timeout: std::time::Duration::from_secs(30),
    }
}
