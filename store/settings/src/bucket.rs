//! `[bucket]`: the object store blocks are written to. The flags keep their
//! historical names (`--object-store`, `--bucket`, `--bucket-*`); the file's
//! keys are the field names.

use serde::{Deserialize, Serialize};

/// `[bucket]` in the file; flags and variables named on each field.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BucketOptions {
    /// Object storage: `local`, `s3`, `gcs` or `azure` [default: local].
    #[arg(long = "object-store", env = "KILN_OBJECT_STORE")]
    pub kind: Option<String>,
    /// Bucket (s3, gcs), container (azure) or directory (local) [default: <data-dir>/bucket].
    #[arg(long = "bucket", env = "KILN_BUCKET")]
    pub name: Option<String>,
    /// Custom S3 endpoint, e.g. `http://127.0.0.1:9000`.
    #[arg(long = "bucket-endpoint", env = "KILN_BUCKET_ENDPOINT")]
    pub endpoint: Option<String>,
    /// S3 region.
    #[arg(long = "bucket-region", env = "KILN_BUCKET_REGION")]
    pub region: Option<String>,
    /// Path prefix inside the bucket, so several stores can share one bucket.
    #[arg(long = "bucket-prefix", env = "KILN_BUCKET_PREFIX")]
    pub prefix: Option<String>,
    /// Allow a plain-HTTP bucket endpoint (S3-compatible test servers).
    #[arg(long = "bucket-allow-http", env = "KILN_BUCKET_ALLOW_HTTP")]
    pub allow_http: Option<bool>,
    /// Azure storage account.
    #[arg(long, env = "KILN_AZURE_ACCOUNT")]
    pub azure_account: Option<String>,
}
