//! Rendering the CRDs as YAML, for `crdgen` and the drift test.

use kube::CustomResourceExt;

use crate::api::{ProfileStore, ProfilingTarget};

/// Why the CRDs could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// serde_yaml refused the generated CRD (cannot happen for well-formed derive output).
    #[error("CRD {name} could not be rendered as YAML")]
    Render {
        /// The CRD's name.
        name: &'static str,
        /// The serializer's description.
        #[source]
        source: serde_yaml::Error,
    },
}

impl CrdError {
    /// A fixed name of the error kind, for metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Render { .. } => "render",
        }
    }
}

/// Every CRD as `(file name, YAML document)`, in a fixed order.
pub fn render_crds() -> Result<Vec<(&'static str, String)>, CrdError> {
    let crds = [
        ("profilestores.kiln.dev.yaml", ProfileStore::crd()),
        ("profilingtargets.kiln.dev.yaml", ProfilingTarget::crd()),
    ];
    crds.into_iter()
        .map(|(file, crd)| {
            let yaml = serde_yaml::to_string(&crd)
                .map_err(|source| CrdError::Render { name: file, source })?;
            Ok((file, format!("---\n{yaml}")))
        })
        .collect()
}
