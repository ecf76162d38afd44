//! `POST /api/v1/debuginfo`: a debug file (or a binary with its symbols)
//! for the symbolizer, keyed by the build id its own note records. Write
//! access for any namespace (it names frames of every namespace), one
//! upload at a time, capped at `--debuginfo-max-bytes` (none at all with
//! `--debuginfo-uploads=false`: 403), and read whole within
//! kiln-debuginfo's limits before it is kept: a file the symbolizer could
//! not use is refused with 422.

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use kiln_contract::query_json::DebugInfoUploaded;
use kiln_debuginfo::{DebugFile, FileKind};
use kiln_storage::WriterScope;

use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::body::read_body;

/// The handler; see the module docs.
pub async fn upload(State(state): State<AppState>, request: Request) -> Response {
    let started = std::time::Instant::now();
    let result = upload_file(&state, request).await;
    state
        .metrics()
        .record_query("debuginfo_upload", started.elapsed());
    match result {
        Ok(uploaded) => axum::Json(uploaded).into_response(),
        Err(err) => {
            state
                .metrics()
                .record_rejection("debuginfo_upload", err.reason());
            err.into_response()
        }
    }
}

async fn upload_file(state: &AppState, request: Request) -> Result<DebugInfoUploaded, ApiError> {
    if !state.symbolizer().settings().accept_uploads {
        return Err(ApiError::DebugInfoUploadsOff);
    }
    if matches!(
        request.extensions().get::<WriterScope>(),
        Some(WriterScope::Namespaces(_))
    ) {
        return Err(ApiError::DebugInfoForbidden);
    }
    let store = state.store()?.clone();
    let symbolizer = state.symbolizer().clone();
    let Ok(_turn) = symbolizer.upload_turn() else {
        return Err(ApiError::Overloaded {
            limit: 1,
            kind: "debug info upload",
        });
    };
    let limit = usize::try_from(symbolizer.settings().max_file_bytes).unwrap_or(usize::MAX);
    let body = read_body(request.into_body(), limit, state.body_read_timeout()).await?;
    let limits = symbolizer.limits();
    let (body, uploaded) = tokio::task::spawn_blocking(move || {
        let file =
            DebugFile::parse(&body, limits).map_err(|source| ApiError::DebugInfo { source })?;
        let build_id = file
            .build_id()
            .cloned()
            .ok_or(ApiError::DebugInfoWithoutBuildId)?;
        let uploaded = DebugInfoUploaded {
            build_id: build_id.to_string(),
            kind: match file.kind() {
                FileKind::Binary => "binary",
                FileKind::DebugOnly => "debug",
            }
            .to_owned(),
            dwarf: file.has_dwarf(),
            symbols: file.symbol_count(),
            bytes: body.len(),
        };
        Ok::<_, ApiError>((body, (build_id, uploaded)))
    })
    .await
    .map_err(|e| ApiError::Worker {
        work: "reading a debug file",
        message: e.to_string(),
    })??;
    let (build_id, uploaded) = uploaded;
    store
        .put_debuginfo(build_id.as_str(), bytes::Bytes::from(body))
        .await?;
    symbolizer.forget(&build_id);
    tracing::info!(%build_id, kind = %uploaded.kind, bytes = uploaded.bytes, "debug info uploaded");
    Ok(uploaded)
}
