//! A small blocking client for the store's HTTP API.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use kiln_contract::query_json::PARTIAL_HEADER;
use serde::de::DeserializeOwned;

/// Largest answer the CLI reads (merged profiles of big selections).
const MAX_RESPONSE_BYTES: u64 = 1 << 30;

/// Why a request to the store failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The store URL is not an `http://` URL.
    #[error("store URL {url:?} must start with http:// (TLS is not built in; use a port-forward)")]
    BadUrl {
        /// The URL given.
        url: String,
    },
    /// Nothing answered at the store's address.
    #[error(
        "cannot reach the store at {url}: {message}\n  is kiln-store running there? Set --store or KILN_STORE"
    )]
    Unreachable {
        /// The store's base URL.
        url: String,
        /// What the network layer said.
        message: String,
    },
    /// The store answered with an error status; `message` is its explanation.
    #[error("the store rejected the request ({status}): {message}")]
    Rejected {
        /// HTTP status code.
        status: u16,
        /// The store's `error` field, or the body.
        message: String,
    },
    /// The answer could not be read or decoded.
    #[error("the store's answer to {path} could not be read: {message}")]
    BadResponse {
        /// The API path.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl ClientError {
    /// A short, fixed name for each variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadUrl { .. } => "bad_url",
            Self::Unreachable { .. } => "unreachable",
            Self::Rejected { .. } => "rejected",
            Self::BadResponse { .. } => "bad_response",
        }
    }
}

/// The store's base URL plus an HTTP agent.
#[derive(Debug)]
pub struct StoreClient {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
    /// Every `Kiln-Partial` value the store's answers carried, in order,
    /// each once: every command's answers pass through here, so none is
    /// shown as whole when the store said it is not.
    partial: Mutex<Vec<String>>,
}

impl StoreClient {
    /// A client for the store at `base` (e.g. `http://127.0.0.1:7470`).
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, ClientError> {
        let base = base.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            return Err(ClientError::BadUrl { url: base });
        }
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .new_agent();
        Ok(Self {
            base,
            token,
            agent,
            partial: Mutex::default(),
        })
    }

    /// What the store said its answers lacked (`Kiln-Partial`), each
    /// value once; empty when every answer was complete.
    pub fn partial_answers(&self) -> Vec<String> {
        self.partial
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn note_partial(&self, headers: &ureq::http::HeaderMap) {
        let Some(value) = headers.get(PARTIAL_HEADER) else {
            return;
        };
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        let mut partial = self.partial.lock().unwrap_or_else(PoisonError::into_inner);
        if !partial.contains(&value) {
            partial.push(value);
        }
    }

    /// GETs `path` with `params` and returns the body bytes.
    pub fn get_bytes(&self, path: &str, params: &[(&str, &str)]) -> Result<Vec<u8>, ClientError> {
        self.get_with_header(path, params, None)
            .map(|(body, _)| body)
    }

    /// GETs `path` with `params` and returns the body bytes and the value of
    /// response header `header`, if asked for and present.
    pub fn get_with_header(
        &self,
        path: &str,
        params: &[(&str, &str)],
        header: Option<&str>,
    ) -> Result<(Vec<u8>, Option<String>), ClientError> {
        let url = format!("{}/{}", self.base, path.trim_start_matches('/'));
        let mut request = self.agent.get(&url);
        for (key, value) in params {
            request = request.query(*key, *value);
        }
        if let Some(token) = &self.token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        let mut response = request.call().map_err(|e| match e {
            ureq::Error::Io(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Timeout(_) => ClientError::Unreachable {
                url: self.base.clone(),
                message: e.to_string(),
            },
            other => ClientError::BadResponse {
                path: path.to_owned(),
                message: other.to_string(),
            },
        })?;
        let status = response.status().as_u16();
        self.note_partial(response.headers());
        let header_value = header.and_then(|name| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_vec()
            .map_err(|e| ClientError::BadResponse {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        if !(200..300).contains(&status) {
            return Err(ClientError::Rejected {
                status,
                message: error_message(&body),
            });
        }
        Ok((body, header_value))
    }

    /// POSTs `body` to `path` and returns the answer's body.
    pub fn post_bytes(&self, path: &str, body: &[u8]) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}/{}", self.base, path.trim_start_matches('/'));
        let mut request = self
            .agent
            .post(&url)
            .header("Content-Type", "application/octet-stream");
        if let Some(token) = &self.token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        let mut response = request.send(body).map_err(|e| match e {
            ureq::Error::Io(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Timeout(_) => ClientError::Unreachable {
                url: self.base.clone(),
                message: e.to_string(),
            },
            other => ClientError::BadResponse {
                path: path.to_owned(),
                message: other.to_string(),
            },
        })?;
        let status = response.status().as_u16();
        self.note_partial(response.headers());
        let answer = response
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_vec()
            .map_err(|e| ClientError::BadResponse {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        if !(200..300).contains(&status) {
            return Err(ClientError::Rejected {
                status,
                message: error_message(&answer),
            });
        }
        Ok(answer)
    }

    /// GETs `path` and decodes its JSON answer.
    pub fn get_json<T: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        params: &[(&str, &str)],
    ) -> Result<T, ClientError> {
        let body = self.get_bytes(path, params)?;
        decode_deep_json(body).map_err(|message| ClientError::BadResponse {
            path: path.to_owned(),
            message,
        })
    }
}

/// Stack for decoding: flame graph trees nest one JSON object per frame,
/// deeper than serde_json's default limit of 128, so the limit is lifted
/// and the recursion gets a stack sized for stacks thousands of frames deep.
const DECODE_STACK_BYTES: usize = 256 << 20;

fn decode_deep_json<T: DeserializeOwned + Send + 'static>(body: Vec<u8>) -> Result<T, String> {
    let decoder = std::thread::Builder::new()
        .name("json-decode".to_owned())
        .stack_size(DECODE_STACK_BYTES)
        .spawn(move || {
            let mut deserializer = serde_json::Deserializer::from_slice(&body);
            deserializer.disable_recursion_limit();
            let value =
                serde::Deserialize::deserialize(&mut deserializer).map_err(|e| e.to_string())?;
            deserializer.end().map_err(|e| e.to_string())?;
            Ok(value)
        })
        .map_err(|e| format!("cannot start the decoder thread: {e}"))?;
    decoder
        .join()
        .map_err(|_| "the JSON decoder failed".to_owned())?
}

/// The `error` field of a JSON error body, else the body as text.
fn error_message(body: &[u8]) -> String {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(message) = value.get("error").and_then(|m| m.as_str())
    {
        return message.to_owned();
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(no explanation in the answer)".to_owned()
    } else {
        text.chars().take(2000).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_show_the_stores_message() {
        let body = br#"{"error":"selector position 12: expected `=`, found `x`","reason":"selector_syntax"}"#;
        assert_eq!(
            error_message(body),
            "selector position 12: expected `=`, found `x`"
        );
        assert_eq!(error_message(b"plain failure\n"), "plain failure");
        assert_eq!(error_message(b""), "(no explanation in the answer)");
    }

    #[test]
    fn trees_nested_far_deeper_than_serde_jsons_default_limit_decode() {
        let depth = 5000;
        let mut text = String::new();
        for _ in 0..depth {
            text.push_str(r#"{"name":1,"total":1,"self":0,"children":["#);
        }
        text.push_str(r#"{"name":1,"total":1,"self":1,"children":[]}"#);
        for _ in 0..depth {
            text.push_str("]}");
        }
        let text = format!(
            r#"{{"names":["total","f"],"root":{text},"node_count":{}}}"#,
            depth + 1
        );
        let graph: kiln_contract::query_json::FlameGraph =
            decode_deep_json(text.into_bytes()).expect("decodes");
        let mut levels = 0;
        let mut current = graph.root();
        while let Some(child) = graph.children(current).first() {
            levels += 1;
            current = child;
        }
        assert_eq!(levels, depth);
        assert!(
            decode_deep_json::<kiln_contract::query_json::FlameGraph>(b"{\"name\":".to_vec())
                .is_err()
        );
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        let err = StoreClient::new("https://x", None, Duration::from_secs(1)).expect_err("https");
        assert_eq!(err.reason(), "bad_url");
        let ok =
            StoreClient::new("http://127.0.0.1:7470/", None, Duration::from_secs(1)).expect("http");
        assert_eq!(ok.base, "http://127.0.0.1:7470");
    }
}
