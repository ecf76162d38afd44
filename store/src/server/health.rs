//! The probes: `/healthz` says whether restarting the store could help,
//! `/readyz` whether it should get traffic now. A store can be live and not
//! ready for a long time (a bucket outage: it keeps serving what it holds,
//! and a restart would not bring the bucket back), but it is not left alive
//! and useless: when its write-ahead log can take no writes and cannot
//! start a fresh segment either (a full disk, a volume gone), liveness
//! fails too, so the kubelet restarts it after its probe's failure
//! threshold, and the log says why.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_storage::store::StoreHealth;

use crate::state::AppState;

/// 200 `ok` while the process serves (recovering included), unless a
/// problem of the store calls for a restart: then 503 with one
/// `<reason>: <message>` line per such problem.
pub async fn healthz(State(state): State<AppState>) -> Response {
    let Ok(store) = state.store() else {
        // Replaying the WAL is progress, not a fault.
        return (StatusCode::OK, "ok\n").into_response();
    };
    liveness_answer(&store.health())
}

fn liveness_answer(health: &StoreHealth) -> Response {
    if health.is_live() {
        return (StatusCode::OK, "ok\n").into_response();
    }
    let mut text = String::from("unhealthy\n");
    for problem in health.problems.iter().filter(|p| p.fails_liveness) {
        text.push_str(&format!("{}: {}\n", problem.reason, problem.message));
    }
    (StatusCode::SERVICE_UNAVAILABLE, text).into_response()
}

/// 200 only when the store is open, its write-ahead log takes writes and
/// its bucket answers; else 503 with one `<reason>: <message>` line per
/// problem.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let Ok(store) = state.store() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "recovering\n").into_response();
    };
    readiness_answer(&store.health())
}

fn readiness_answer(health: &StoreHealth) -> Response {
    let mut text = String::from(if health.is_ready() {
        "ready\n"
    } else {
        "not ready\n"
    });
    // The records set aside do not block serving, but an operator probing
    // readiness should see that some exist.
    text.push_str(&format!(
        "wal_quarantined_records {}\nunuploaded_bytes {} of {}\n",
        health.wal_quarantined_records, health.unuploaded_bytes, health.unuploaded_budget_bytes
    ));
    for problem in &health.problems {
        text.push_str(&format!("{}: {}\n", problem.reason, problem.message));
    }
    let status = if health.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_storage::store::HealthProblem;

    fn health(problems: Vec<HealthProblem>) -> StoreHealth {
        StoreHealth {
            problems,
            wal_quarantined_records: 0,
            pending_uploads: 0,
            unuploaded_bytes: 0,
            unuploaded_budget_bytes: 1,
        }
    }

    fn problem(reason: &'static str, fails_liveness: bool) -> HealthProblem {
        HealthProblem {
            reason,
            message: format!("{reason} happened"),
            fails_liveness,
        }
    }

    #[test]
    fn only_a_problem_a_restart_may_fix_fails_liveness() {
        let waiting = health(vec![problem("bucket_unreachable", false)]);
        assert_eq!(liveness_answer(&waiting).status(), StatusCode::OK);
        assert_eq!(
            readiness_answer(&waiting).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let stuck = health(vec![
            problem("bucket_unreachable", false),
            problem("wal_failed", true),
        ]);
        assert_eq!(
            liveness_answer(&stuck).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let fine = health(Vec::new());
        assert_eq!(liveness_answer(&fine).status(), StatusCode::OK);
        assert_eq!(readiness_answer(&fine).status(), StatusCode::OK);
    }
}
