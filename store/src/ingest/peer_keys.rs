//! Replicas asking each other whether they stored an idempotency key (see
//! [`kiln_storage::peer_keys`] for when and why): the route that answers a
//! peer, the transport over which this replica asks, and reading a
//! request's retry marker.
//!
//! The lookup travels like a query's fan-out ([`crate::query::peers`]): a
//! read route, the replica's first read token, a fresh connection per peer
//! within `--peer-connect-timeout`, and a deadline for the whole. It
//! tells a peer nothing a reader could not query, so it takes the same
//! token.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kiln_storage::peer_keys::{
    KeyAnswer, KeyAnswers, KeyQuery, MAX_KEY_ANSWER_BYTES, MAX_KEY_QUERY_BYTES, PeerKeySource,
    RETRY_ATTEMPT_METADATA,
};

use crate::error::ApiError;
use crate::query::peers::PeerClient;
use crate::state::AppState;
use crate::wire::body::read_body;

/// Where a replica answers its peers' key lookups.
pub const PEER_KEYS_PATH: &str = "/internal/v1/peer-keys";

/// The attempt number a request carries in [`RETRY_ATTEMPT_METADATA`], if
/// it is marked as a resend: a positive decimal number. A value that is
/// not one reads as a first send (the worst it costs is a duplicate that
/// the mark would have caught, never a refusal).
pub fn retry_attempt(metadata: &tonic::metadata::MetadataMap) -> Option<u32> {
    metadata
        .get(RETRY_ATTEMPT_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u32>().ok())
        .filter(|&attempt| attempt > 0)
}

/// `POST /internal/v1/peer-keys`: which of a peer's keys this replica
/// stored. A replica still recovering answers 503 (not ready): it has not
/// yet dropped the replayed records a peer stored, so it cannot vouch for
/// any key, and the asker treats it as silent.
pub async fn peer_keys(State(state): State<AppState>, request: Request) -> Response {
    let answer = async {
        let store = state.store()?;
        let body = read_body(
            request.into_body(),
            MAX_KEY_QUERY_BYTES,
            state.body_read_timeout(),
        )
        .await?;
        let query = KeyQuery::decode(&body).map_err(|error| ApiError::BadMessage {
            message_type: "peer key query (JSON)",
            message: error.to_string(),
        })?;
        let answer = store.answer_key_query(&query);
        Ok::<_, ApiError>(
            (
                [(header::CONTENT_TYPE, "application/json")],
                answer.encode(),
            )
                .into_response(),
        )
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

impl PeerKeySource for PeerClient {
    fn ask_keys(
        &self,
        query: KeyQuery,
        deadline: Instant,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = KeyAnswers> + Send + '_>> {
        Box::pin(async move {
            let asked = query.keys.len();
            let (answers, unanswered) = self
                .ask_every_peer(
                    PEER_KEYS_PATH,
                    Bytes::from(query.encode()),
                    MAX_KEY_ANSWER_BYTES,
                    deadline,
                    "lookup",
                    move |bytes| KeyAnswer::decode(&bytes, asked).map_err(|e| e.to_string()),
                )
                .await;
            KeyAnswers {
                answers,
                unanswered,
            }
        })
    }
}

/// The key transport of `client`, the one the queries use.
pub fn key_source(client: &Arc<PeerClient>) -> Arc<dyn PeerKeySource> {
    Arc::clone(client) as Arc<dyn PeerKeySource>
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &'static str) -> tonic::metadata::MetadataMap {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(
            RETRY_ATTEMPT_METADATA,
            tonic::metadata::MetadataValue::from_static(value),
        );
        metadata
    }

    #[test]
    fn only_a_positive_attempt_number_marks_a_resend() {
        assert_eq!(retry_attempt(&tonic::metadata::MetadataMap::new()), None);
        assert_eq!(retry_attempt(&with("1")), Some(1));
        assert_eq!(retry_attempt(&with("17")), Some(17));
        for first in ["0", "", "yes", "-1", "1.5", "99999999999"] {
            assert_eq!(retry_attempt(&with(first)), None, "{first:?}");
        }
    }
}
