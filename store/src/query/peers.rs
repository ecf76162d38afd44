//! Replicas asking each other for unflushed data (see
//! [`kiln_storage::peers`] for what is asked and why): the route that
//! answers a peer, and [`PeerClient`], the transport every query here uses
//! to ask the others.
//!
//! The route is a read route like any query: it gives a peer nothing a
//! read token could not already query, so it takes the same token, and a
//! replica sends its own first read token.

mod connect;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use kiln_storage::peers::{PeerAnswers, PeerHead, PeerScope, PeerSource, UnansweredPeer};

use crate::config::PeerAddress;
use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::body::read_body;

/// Where a replica answers its peers.
pub const PEER_HEAD_PATH: &str = "/internal/v1/peer-head";

/// The answer's content type.
const PEER_HEAD_CONTENT_TYPE: &str = "application/vnd.kiln.peer-head";

/// Largest request body: a scope is a few matchers.
const MAX_SCOPE_BYTES: usize = 1 << 20;

/// Largest answer a replica gives or takes: far more than one flush
/// interval of a store's selected data, encoded, and small enough that a
/// few queries' answers fit in a store's memory.
pub const MAX_PEER_ANSWER_BYTES: usize = 256 << 20;

/// Most of an error answer kept for the message.
const MAX_ERROR_BYTES: usize = 4 << 10;

/// `POST /internal/v1/peer-head`: this replica's unflushed data for a
/// peer's query.
pub async fn peer_head(State(state): State<AppState>, request: Request) -> Response {
    let answer = async {
        let store = state.store()?;
        let body = read_body(
            request.into_body(),
            MAX_SCOPE_BYTES,
            state.body_read_timeout(),
        )
        .await?;
        let scope: PeerScope =
            serde_json::from_slice(&body).map_err(|error| ApiError::BadMessage {
                message_type: "peer scope (JSON)",
                message: error.to_string(),
            })?;
        if scope.start_ms >= scope.end_ms {
            return Err(ApiError::BadParameter {
                parameter: "end_ms",
                message: "must be after start_ms".into(),
            });
        }
        let head = store.peer_head(scope, MAX_PEER_ANSWER_BYTES).await?;
        Ok::<_, ApiError>(
            (
                [(header::CONTENT_TYPE, PEER_HEAD_CONTENT_TYPE)],
                head.encode(),
            )
                .into_response(),
        )
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// Asks every peer over plain HTTP/1.1, all at once, each on a fresh
/// connection (a query's peers are few, and a fresh connection never
/// inherits a stalled one), taken within the connect timeout (see
/// [`connect`]).
#[derive(Debug)]
pub struct PeerClient {
    peers: Vec<PeerAddress>,
    token: Option<String>,
    connect_timeout: Duration,
    unreachable: Arc<connect::Unreachable>,
}

impl PeerClient {
    pub fn new(peers: Vec<PeerAddress>, token: Option<String>, connect_timeout: Duration) -> Self {
        Self {
            peers,
            token,
            connect_timeout,
            unreachable: Arc::default(),
        }
    }

    /// How a request due by `deadline` connects to the peers (the
    /// addresses found unreachable are shared by every request).
    fn connecting(&self, deadline: Instant) -> Connecting {
        Connecting {
            timeout: self.connect_timeout,
            deadline,
            unreachable: Arc::clone(&self.unreachable),
        }
    }

    /// POSTs `body` to `path` at every peer at once, each on a fresh
    /// connection, and reads each answer of at most `limit` bytes with
    /// `decode`: the answers, and the peers that gave none by `deadline`
    /// or one `decode` refused, sorted by name. `asking` names the request
    /// in the deadline's message ("query", "lookup").
    pub(crate) async fn ask_every_peer<T, D>(
        &self,
        path: &'static str,
        body: Bytes,
        limit: usize,
        deadline: Instant,
        asking: &'static str,
        decode: D,
    ) -> (Vec<T>, Vec<UnansweredPeer>)
    where
        T: Send + 'static,
        D: Fn(Bytes) -> Result<T, String> + Clone + Send + Sync + 'static,
    {
        let mut asked = tokio::task::JoinSet::new();
        for peer in &self.peers {
            let peer = peer.clone();
            let token = self.token.clone();
            let body = body.clone();
            let connecting = self.connecting(deadline);
            let decode = decode.clone();
            asked.spawn(async move {
                let answer = tokio::time::timeout_at(deadline.into(), async {
                    let bytes =
                        post(&peer, token.as_deref(), path, body, limit, &connecting).await?;
                    decode(bytes)
                })
                .await
                .unwrap_or_else(|_elapsed| Err(format!("no answer by the {asking}'s deadline")));
                (peer.name, answer)
            });
        }
        let mut answers = Vec::with_capacity(self.peers.len());
        let mut unanswered = Vec::new();
        while let Some(joined) = asked.join_next().await {
            match joined {
                Ok((_, Ok(answer))) => answers.push(answer),
                Ok((peer, Err(error))) => unanswered.push(UnansweredPeer { peer, error }),
                Err(error) => unanswered.push(UnansweredPeer {
                    peer: "?".into(),
                    error: error.to_string(),
                }),
            }
        }
        unanswered.sort_by(|a, b| a.peer.cmp(&b.peer));
        (answers, unanswered)
    }
}

impl PeerSource for PeerClient {
    fn ask(
        &self,
        scope: PeerScope,
        deadline: Instant,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = PeerAnswers> + Send + '_>> {
        Box::pin(async move {
            // A scope is matchers and two numbers: it always serializes.
            let body = Bytes::from(serde_json::to_vec(&scope).unwrap_or_default());
            let (heads, unanswered) = self
                .ask_every_peer(
                    PEER_HEAD_PATH,
                    body,
                    MAX_PEER_ANSWER_BYTES,
                    deadline,
                    "query",
                    |bytes| PeerHead::decode(bytes).map_err(|e| e.to_string()),
                )
                .await;
            for UnansweredPeer { peer, error } in &unanswered {
                tracing::warn!(%peer, %error, "peer did not answer a query");
            }
            PeerAnswers { heads, unanswered }
        })
    }
}

/// Aborts the connection's task when the request is done or dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How one request to the peers (a query's, a key lookup's) connects.
struct Connecting {
    timeout: Duration,
    deadline: Instant,
    unreachable: Arc<connect::Unreachable>,
}

/// POSTs `body` (JSON) to `path` at `peer` on a fresh connection, with the
/// replica's read token; the answer's body of at most `limit` bytes, or
/// why there is none.
async fn post(
    peer: &PeerAddress,
    token: Option<&str>,
    path: &'static str,
    body: Bytes,
    limit: usize,
    connecting: &Connecting,
) -> Result<Bytes, String> {
    let stream = connect::connect(
        &peer.authority,
        connecting.timeout,
        connecting.deadline,
        &connecting.unreachable,
    )
    .await?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake with {}: {e}", peer.authority))?;
    let _connection = AbortOnDrop(tokio::spawn(connection).abort_handle());
    let mut request = axum::http::Request::post(path)
        .header(header::HOST, &peer.authority)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(body))
        .map_err(|e| format!("request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request to {}: {e}", peer.authority))?;
    let status = response.status();
    let limit = if status == StatusCode::OK {
        limit
    } else {
        MAX_ERROR_BYTES
    };
    let bytes = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map(|collected| collected.to_bytes());
    if status != StatusCode::OK {
        let text = bytes.map(|b| String::from_utf8_lossy(&b).into_owned());
        return Err(format!(
            "answered {status}: {}",
            text.unwrap_or_else(|e| e.to_string())
        ));
    }
    bytes.map_err(|e| format!("answer past {limit} bytes or cut short: {e}"))
}

/// The client for `peers`, or none for a store alone. It asks for their
/// unflushed data ([`PeerSource`]) and whether they stored idempotency
/// keys (`kiln_storage::peer_keys::PeerKeySource`, in
/// `crate::ingest::peer_keys`).
pub fn client(
    peers: &[PeerAddress],
    token: Option<String>,
    connect_timeout: Duration,
) -> Option<Arc<PeerClient>> {
    (!peers.is_empty()).then(|| Arc::new(PeerClient::new(peers.to_vec(), token, connect_timeout)))
}
