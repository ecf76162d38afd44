#![doc = include_str!("../README.md")]

pub mod decision;
pub mod error;
pub mod file;
pub mod port;
pub mod scrape;
pub mod selector;

pub use decision::{Decision, PodView, ProfilingPlan, SkipReason};
pub use error::TargetsError;
pub use file::{Target, TargetsFile};
pub use port::{PprofPort, is_port_name};
pub use scrape::{PprofProfile, PprofScrape};
pub use selector::{LabelSelector, LabelSource, SelectorOperator, SelectorRequirement};

use kiln_contract::{labels, sample_labels};

/// The only targets-file format version this crate reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// The ConfigMap key (and file name inside the mounted volume) holding the targets file.
pub const CONFIGMAP_KEY: &str = "targets.json";

/// Prefix of every Kiln pod annotation; only these may be relayed in `podAnnotations`.
pub const ANNOTATION_PREFIX: &str = "profiles.kiln.dev/";

/// Pod annotation that opts a pod in (`"true"`) or out (`"false"`).
pub const ANNOTATION_ENABLED: &str = "profiles.kiln.dev/enabled";

/// Pod annotation that overrides the sampling frequency in Hz.
pub const ANNOTATION_SAMPLING_HZ: &str = "profiles.kiln.dev/sampling-hz";

/// Pod annotation that sets the `service_name` label of the pod's profiles.
pub const ANNOTATION_SERVICE_NAME: &str = "profiles.kiln.dev/service-name";

/// Lowest sampling frequency a target or annotation may ask for.
pub const MIN_SAMPLING_HZ: u32 = 1;

/// Highest sampling frequency a target or annotation may ask for.
pub const MAX_SAMPLING_HZ: u32 = 1000;

/// Largest targets file accepted: the size limit of a Kubernetes ConfigMap.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// Sandbox label kubelet sets to the pod's UID, which the agent sees through
/// CRI: a targets-file selector on it names one pod (how the operator relays
/// pods annotated after they started, see the README).
pub const CRI_POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// containerd's CRI socket: the agent's default runtime endpoint and the
/// operator's default `containerRuntimeSocket`.
pub const DEFAULT_CRI_SOCKET: &str = "/run/containerd/containerd.sock";

/// The CRI sockets of the container runtimes Kiln supports (containerd, k3s,
/// CRI-O, cri-dockerd): the only host paths the operator lets a store mount
/// into its agents.
pub const KNOWN_CRI_SOCKETS: [&str; 7] = [
    DEFAULT_CRI_SOCKET,
    "/var/run/containerd/containerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/run/crio/crio.sock",
    "/run/cri-dockerd.sock",
    "/var/run/cri-dockerd.sock",
];

/// Labels the agent sets itself on every profile; extra labels may not replace them.
pub const RESERVED_LABELS: [&str; 9] = [
    labels::NODE,
    labels::NAMESPACE,
    labels::POD,
    labels::POD_UID,
    labels::CONTAINER,
    labels::CONTAINER_ID,
    sample_labels::COMM,
    sample_labels::PID,
    labels::SERVICE_NAME,
];
