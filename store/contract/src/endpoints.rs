//! Kiln's well-known HTTP paths, served by the store and (health and metrics) the agent, which
//! the operator's probes point at; and the store's local address, where the CLI reaches it by
//! default.

/// Liveness: answers while the process serves HTTP.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness: answers 200 once the store has recovered and can serve.
pub const READYZ_PATH: &str = "/readyz";
/// Prometheus metrics.
pub const METRICS_PATH: &str = "/metrics";
/// Where a store on this machine listens by default (`kiln up`, `kiln-store`).
pub const LOCAL_STORE_ADDR: &str = "127.0.0.1:7470";
/// [`LOCAL_STORE_ADDR`] as the URL clients use by default.
pub const LOCAL_STORE_URL: &str = "http://127.0.0.1:7470";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_url_is_the_local_address() {
        assert_eq!(
            LOCAL_STORE_URL.strip_prefix("http://"),
            Some(LOCAL_STORE_ADDR)
        );
        for path in [HEALTHZ_PATH, READYZ_PATH, METRICS_PATH] {
            assert!(path.starts_with('/') && !path[1..].contains('/'), "{path}");
        }
    }
}
