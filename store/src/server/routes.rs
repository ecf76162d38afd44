//! The main port's route table: every path it serves, what serves it and
//! who may call it. The router ([`super::router`]) is built from
//! [`ROUTES`] and the auth layer ([`super::auth`]) decides from it, so a
//! route cannot be added without saying who may call it, and a path that no
//! route serves is refused before auth or any handler sees it.

use axum::http::Method;
use kiln_api::{OTLP_PROFILES_EXPORT_PATH, PUSH_PATH, WRITE_RAW_PATH};
use kiln_contract::endpoints::{HEALTHZ_PATH, METRICS_PATH, READYZ_PATH};

/// Who may call a route. Tokens are optional: with no token configured
/// for a side, that side is open too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: health, readiness, metrics and the web UI's files.
    Open,
    /// Holders of a read token: the query APIs.
    Read,
    /// Holders of a write token: ingest.
    Write,
}

/// What serves a route (the router maps each to its handler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /healthz`: liveness.
    Healthz,
    /// `GET /readyz`: readiness, with the store's problems.
    Readyz,
    /// `GET /metrics`: Prometheus text.
    Metrics,
    /// Pyroscope's `POST /ingest` (also under `/pyroscope`).
    PyroscopeIngest,
    /// Pyroscope's Push, over Connect or gRPC.
    Push,
    /// Parca's `WriteRaw` over gRPC.
    WriteRaw,
    /// OTLP profiles `Export` over gRPC.
    OtlpGrpc,
    /// OTLP profiles over HTTP.
    OtlpHttp,
    /// `kiln.query.v1.QueryService` over gRPC.
    QueryGrpc,
    /// Pyroscope's `querier.v1.QuerierService` over Connect.
    Querier,
    /// Pyroscope's `GET /pyroscope/render`.
    PyroscopeRender,
    /// Pyroscope's `GET /pyroscope/label-values`.
    PyroscopeLabelValues,
    /// `GET /api/v1/profile-types`.
    ProfileTypes,
    /// `GET /api/v1/labels`.
    LabelNames,
    /// `GET /api/v1/labels/{name}/values`.
    LabelValues,
    /// `GET /api/v1/series`.
    Series,
    /// `GET /api/v1/flamegraph`.
    Flamegraph,
    /// `GET /api/v1/pprof`.
    Pprof,
    /// `GET /api/v1/folded`.
    Folded,
    /// `GET /api/v1/top`.
    Top,
    /// `GET /api/v1/timeline`.
    Timeline,
    /// `GET /api/v1/diff`.
    Diff,
    /// `GET /metrics/recorded`: recording rules' series, Prometheus text.
    RecordedMetrics,
    /// `/prometheus/api/v1/query` over recorded series.
    RecordedQuery,
    /// `/prometheus/api/v1/query_range` over recorded series.
    RecordedQueryRange,
    /// `/prometheus/api/v1/series`.
    RecordedSeries,
    /// `/prometheus/api/v1/labels`.
    RecordedLabels,
    /// `/prometheus/api/v1/label/{name}/values`.
    RecordedLabelValues,
    /// `/prometheus/api/v1/status/buildinfo`.
    RecordedBuildInfo,
    /// `POST /internal/v1/peer-head`: this replica's unflushed data, for a
    /// peer's query.
    PeerHead,
    /// `POST /internal/v1/peer-keys`: which idempotency keys this replica
    /// stored, for a peer's resent request or replay.
    PeerKeys,
    /// `POST /api/v1/debuginfo`: a debug file for the symbolizer.
    DebugInfoUpload,
}

/// One route: an axum path pattern, who may call it and what serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The path as axum matches it (`{name}` one segment, `{*rest}` the rest).
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
    /// What serves it.
    pub endpoint: Endpoint,
}

const fn route(path: &'static str, access: Access, endpoint: Endpoint) -> Route {
    Route {
        path,
        access,
        endpoint,
    }
}

/// Every route of the main port. The web UI's files are the one thing
/// served off the table, by the router's fallback ([`fallback_access`]).
pub const ROUTES: &[Route] = &[
    route(HEALTHZ_PATH, Access::Open, Endpoint::Healthz),
    route(READYZ_PATH, Access::Open, Endpoint::Readyz),
    route(METRICS_PATH, Access::Open, Endpoint::Metrics),
    route("/ingest", Access::Write, Endpoint::PyroscopeIngest),
    route(
        "/pyroscope/ingest",
        Access::Write,
        Endpoint::PyroscopeIngest,
    ),
    route(PUSH_PATH, Access::Write, Endpoint::Push),
    route(WRITE_RAW_PATH, Access::Write, Endpoint::WriteRaw),
    route(OTLP_PROFILES_EXPORT_PATH, Access::Write, Endpoint::OtlpGrpc),
    route("/v1development/profiles", Access::Write, Endpoint::OtlpHttp),
    route(
        "/kiln.query.v1.QueryService/{*method}",
        Access::Read,
        Endpoint::QueryGrpc,
    ),
    route(
        "/querier.v1.QuerierService/{method}",
        Access::Read,
        Endpoint::Querier,
    ),
    route("/pyroscope/render", Access::Read, Endpoint::PyroscopeRender),
    route(
        "/pyroscope/label-values",
        Access::Read,
        Endpoint::PyroscopeLabelValues,
    ),
    route(
        "/api/v1/profile-types",
        Access::Read,
        Endpoint::ProfileTypes,
    ),
    route("/api/v1/labels", Access::Read, Endpoint::LabelNames),
    route(
        "/api/v1/labels/{name}/values",
        Access::Read,
        Endpoint::LabelValues,
    ),
    route("/api/v1/series", Access::Read, Endpoint::Series),
    route("/api/v1/flamegraph", Access::Read, Endpoint::Flamegraph),
    route("/api/v1/pprof", Access::Read, Endpoint::Pprof),
    route("/api/v1/folded", Access::Read, Endpoint::Folded),
    route("/api/v1/top", Access::Read, Endpoint::Top),
    route("/api/v1/timeline", Access::Read, Endpoint::Timeline),
    route("/api/v1/diff", Access::Read, Endpoint::Diff),
    route("/metrics/recorded", Access::Read, Endpoint::RecordedMetrics),
    route(
        "/prometheus/api/v1/query",
        Access::Read,
        Endpoint::RecordedQuery,
    ),
    route(
        "/prometheus/api/v1/query_range",
        Access::Read,
        Endpoint::RecordedQueryRange,
    ),
    route(
        "/prometheus/api/v1/series",
        Access::Read,
        Endpoint::RecordedSeries,
    ),
    route(
        "/prometheus/api/v1/labels",
        Access::Read,
        Endpoint::RecordedLabels,
    ),
    route(
        "/prometheus/api/v1/label/{name}/values",
        Access::Read,
        Endpoint::RecordedLabelValues,
    ),
    route(
        "/prometheus/api/v1/status/buildinfo",
        Access::Read,
        Endpoint::RecordedBuildInfo,
    ),
    route(
        crate::query::peers::PEER_HEAD_PATH,
        Access::Read,
        Endpoint::PeerHead,
    ),
    route(
        crate::ingest::peer_keys::PEER_KEYS_PATH,
        Access::Read,
        Endpoint::PeerKeys,
    ),
    route(
        "/api/v1/debuginfo",
        Access::Write,
        Endpoint::DebugInfoUpload,
    ),
];

/// The access of the route whose pattern the router matched (axum's
/// `MatchedPath`); `None` for a pattern not in the table.
pub fn access_of(pattern: &str) -> Option<Access> {
    ROUTES
        .iter()
        .find(|route| route.path == pattern)
        .map(|route| route.access)
}

/// The access of a request that matched no route: a GET of one of the web
/// UI's files is open; anything else is served by nothing, so `None`.
pub fn fallback_access(method: &Method, path: &str) -> Option<Access> {
    (method == Method::GET && kiln_ui::asset(path).is_some()).then_some(Access::Open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingest_needs_write_and_queries_need_read() {
        for route in ROUTES {
            let expected = match route.endpoint {
                Endpoint::Healthz | Endpoint::Readyz | Endpoint::Metrics => Access::Open,
                Endpoint::PyroscopeIngest
                | Endpoint::Push
                | Endpoint::WriteRaw
                | Endpoint::OtlpGrpc
                | Endpoint::OtlpHttp
                | Endpoint::DebugInfoUpload => Access::Write,
                _ => Access::Read,
            };
            assert_eq!(route.access, expected, "{}", route.path);
        }
        assert_eq!(access_of("/api/v1/flamegraph"), Some(Access::Read));
        assert_eq!(access_of(PUSH_PATH), Some(Access::Write));
        assert_eq!(access_of(METRICS_PATH), Some(Access::Open));
    }

    #[test]
    fn every_path_is_routed_once() {
        for (i, route) in ROUTES.iter().enumerate() {
            assert!(
                ROUTES[i + 1..].iter().all(|r| r.path != route.path),
                "{} is listed twice",
                route.path
            );
        }
    }

    #[test]
    fn only_the_web_ui_is_served_off_the_table() {
        assert_eq!(fallback_access(&Method::GET, "/"), Some(Access::Open));
        assert_eq!(fallback_access(&Method::POST, "/"), None);
        assert_eq!(fallback_access(&Method::GET, "/api/v1/nothing"), None);
        assert_eq!(access_of("/api/v1/nothing"), None);
    }
}
