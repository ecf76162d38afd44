//! `kiln-operator`: reconciles ProfileStores and ProfilingTargets until SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use kiln_operator::api::{ProfileStore, ProfilingTarget};
use kiln_operator::controller::{self, Context};
use kiln_operator::metrics::Metrics;
use kiln_operator::resources::{BuildDefaults, ImagePullPolicy};
use kube::api::ListParams;
use kube::{Api, Client};
use tracing_subscriber::EnvFilter;

/// Kubernetes operator for Kiln continuous profiling.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address of the /metrics, /healthz and /readyz endpoint.
    #[arg(long, env = "KILN_METRICS_LISTEN", default_value = "0.0.0.0:8080")]
    metrics_listen: SocketAddr,
    /// Store image used when a ProfileStore sets none.
    #[arg(
        long,
        env = "KILN_STORE_IMAGE",
        default_value = "ghcr.io/kiln-dev/kiln-store:0.1.0"
    )]
    store_image: String,
    /// Agent image used when a ProfileStore sets none.
    #[arg(
        long,
        env = "KILN_AGENT_IMAGE",
        default_value = "ghcr.io/kiln-dev/kiln-agent:0.1.0"
    )]
    agent_image: String,
    /// Other agent images a ProfileStore's `spec.agent.image` may name
    /// (comma-separated; exact references, or prefixes ending in `*`).
    /// Anything else is refused: agents run privileged on every node.
    #[arg(long, env = "KILN_ALLOWED_AGENT_IMAGES", value_delimiter = ',')]
    allowed_agent_images: Vec<String>,
    /// Taint keys agent pods may tolerate (comma-separated), or `*` for any
    /// taint. A ProfileStore's `spec.agent.tolerations` may name only these
    /// keys; a store that sets none tolerates all of them. Empty: none.
    #[arg(
        long,
        env = "KILN_ALLOWED_AGENT_TOLERATIONS",
        value_delimiter = ',',
        default_value = "*",
        value_parser = taint_key
    )]
    allowed_agent_tolerations: Vec<String>,
    /// `imagePullPolicy` of the store and agent pods (`Always`,
    /// `IfNotPresent`, `Never`); unset: Kubernetes' default, `IfNotPresent`
    /// for a tagged image. `Never` runs images loaded into the nodes.
    #[arg(long, env = "KILN_IMAGE_PULL_POLICY", value_parser = pull_policy)]
    image_pull_policy: Option<ImagePullPolicy>,
    /// Log filter, e.g. `info` or `kiln_operator=debug,kube=info`.
    #[arg(long, env = "KILN_LOG", default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&args.log).context("invalid --log filter")?)
        .init();

    install_crypto_provider();
    let client = Client::try_default()
        .await
        .context("no Kubernetes configuration found (in-cluster or KUBECONFIG)")?;
    // Fail fast with a clear message when the CRDs are missing or from another version.
    Api::<ProfileStore>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .context("cannot list ProfileStores: are the kiln.dev CRDs installed? (kubectl apply --server-side -f crds/)")?;
    Api::<ProfilingTarget>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .context("cannot list ProfilingTargets: are the kiln.dev CRDs installed?")?;

    let metrics = Arc::new(Metrics::default());
    let defaults = BuildDefaults {
        store_image: args.store_image,
        agent_image: args.agent_image,
        // `--flag=` (as the chart renders an empty list) gives one empty entry: it means none.
        allowed_agent_images: without_empty(args.allowed_agent_images),
        allowed_agent_tolerations: without_empty(args.allowed_agent_tolerations),
        image_pull_policy: args.image_pull_policy,
    };
    let ctx = Arc::new(Context::new(client, defaults, metrics.clone()));

    let listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
    let (stop_http, http_stopped) = tokio::sync::watch::channel(false);
    let http = tokio::spawn(kiln_operator::http::serve(listener, metrics, http_stopped));
    tracing::info!(metrics = %args.metrics_listen, "kiln-operator started");

    // Returns once SIGTERM/SIGINT arrived and in-flight reconciles finished.
    controller::run(ctx).await;
    tracing::info!("shutting down");
    // The receiver may already be gone if the server failed; nothing left to stop then.
    let _ = stop_http.send(true);
    http.await.context("metrics server task panicked")??;
    Ok(())
}

/// Makes ring rustls' process-wide provider, which kube's TLS client uses. rustls
/// chooses one by itself only when exactly one is compiled in; a build of the
/// operator together with the store (whose S3 client brings aws-lc-rs), as one
/// `cargo build` of the workspace's binaries does, has two, and the first API
/// call panicked. Installing fails only when a provider is already set, which
/// is as good.
fn install_crypto_provider() {
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a rustls crypto provider was already installed");
    }
}

/// One entry of `--allowed-agent-tolerations`: a taint key, `*`, or empty (ignored).
fn taint_key(entry: &str) -> Result<String, String> {
    let entry = entry.trim();
    if entry != "*" && entry.contains('*') {
        return Err(format!(
            "{entry:?}: taint keys are matched exactly; only `*` alone allows every taint"
        ));
    }
    if entry.contains(char::is_whitespace) {
        return Err(format!("{entry:?} is not a taint key"));
    }
    Ok(entry.to_owned())
}

/// `--image-pull-policy`: one of Kubernetes' three values, spelled as it spells them.
fn pull_policy(text: &str) -> Result<ImagePullPolicy, String> {
    [
        ImagePullPolicy::Always,
        ImagePullPolicy::IfNotPresent,
        ImagePullPolicy::Never,
    ]
    .into_iter()
    .find(|policy| policy.as_str() == text)
    .ok_or_else(|| format!("{text:?} is not Always, IfNotPresent or Never"))
}

fn without_empty(entries: Vec<String>) -> Vec<String> {
    entries
        .into_iter()
        .filter(|entry| !entry.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Args, ImagePullPolicy, install_crypto_provider, without_empty};

    #[test]
    fn clap_definition_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn agents_tolerate_any_taint_unless_the_operator_narrows_it() {
        let parse = |extra: &[&str]| {
            let argv = ["kiln-operator"].iter().chain(extra).copied();
            Args::try_parse_from(argv).map(|args| without_empty(args.allowed_agent_tolerations))
        };
        assert_eq!(parse(&[]).ok(), Some(vec!["*".to_owned()]));
        assert_eq!(
            parse(&["--allowed-agent-tolerations=gpu,node-role.kubernetes.io/control-plane"]).ok(),
            Some(vec![
                "gpu".to_owned(),
                "node-role.kubernetes.io/control-plane".to_owned()
            ])
        );
        assert_eq!(
            parse(&["--allowed-agent-tolerations="]).ok(),
            Some(Vec::new())
        );
        assert!(parse(&["--allowed-agent-tolerations=gpu*"]).is_err());
        // config/manager passes an empty list of extra images.
        let args = Args::try_parse_from(["kiln-operator", "--allowed-agent-images="])
            .map(|args| without_empty(args.allowed_agent_images));
        assert_eq!(args.ok(), Some(Vec::new()));
    }

    #[test]
    fn a_tls_provider_is_installed_whichever_features_the_build_unified() {
        install_crypto_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        // A second call (a provider already there) is not an error.
        install_crypto_provider();
    }

    #[test]
    fn the_pull_policy_is_one_kubernetes_takes() {
        let parse = |extra: &[&str]| {
            let argv = ["kiln-operator"].iter().chain(extra).copied();
            Args::try_parse_from(argv).map(|args| args.image_pull_policy)
        };
        assert_eq!(parse(&[]).ok(), Some(None));
        assert_eq!(
            parse(&["--image-pull-policy=Never"]).ok(),
            Some(Some(ImagePullPolicy::Never))
        );
        assert_eq!(
            parse(&["--image-pull-policy", "IfNotPresent"]).ok(),
            Some(Some(ImagePullPolicy::IfNotPresent))
        );
        assert!(parse(&["--image-pull-policy=never"]).is_err());
    }

    #[test]
    fn every_flag_reads_a_kiln_environment_variable() {
        for arg in Args::command().get_arguments() {
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
}
