//! Defences against web pages in a user's browser: a page of any site
//! can make the browser send requests to a store on the user's machine,
//! to write into it or, through DNS rebinding, to read its profiles.
//!
//! - **Cross-site writes (CSRF).** A page on another site can make the
//!   browser POST to the store (an `<form>` or `fetch` with `no-cors`). A
//!   browser names the page's origin in `Origin`; a request that changes
//!   state and comes from another origin than the one it is addressed to is
//!   refused. Clients that are not browsers send no `Origin` and pass.
//! - **DNS rebinding.** A page can point its own domain name at 127.0.0.1
//!   and then read the store as same-origin. When the store listens only on
//!   loopback (`kiln up`), a request must name the store by a loopback name
//!   or an IP address in `Host`, so a rebound name is refused. A store that
//!   listens on other addresses (Kubernetes) is reached by many names and
//!   skips this check.
//! - **Framing and sniffing.** Every response forbids framing and MIME
//!   sniffing, and carries a CSP that lets the UI run only its own scripts
//!   and styles and talk only to the store.

use axum::extract::{Request, State};
use axum::http::header::{HOST, HeaderName, HeaderValue, ORIGIN};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// The CSP of every response; the UI loads only its own files.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Why a request was refused before routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A state-changing request from a page of another origin.
    CrossOriginWrite {
        /// The `Origin` the browser sent.
        origin: String,
    },
    /// A loopback-only store addressed by a name that is not loopback.
    HostNotAllowed {
        /// The host the request named.
        host: String,
    },
}

impl Refusal {
    fn reason(&self) -> &'static str {
        match self {
            Refusal::CrossOriginWrite { .. } => "cross_origin_write",
            Refusal::HostNotAllowed { .. } => "host_not_allowed",
        }
    }

    fn message(&self) -> String {
        match self {
            Refusal::CrossOriginWrite { origin } => format!(
                "a request from the web page at {origin} may not change this store; \
                 send it from a client, not a browser page of another site"
            ),
            Refusal::HostNotAllowed { host } => format!(
                "this store listens on loopback only and is not known as {host}; \
                 address it as localhost or by its IP address"
            ),
        }
    }
}

/// The host of an authority (`host[:port]`, IPv6 in brackets), lowercased.
fn host_of(authority: &str) -> String {
    let authority = authority.trim().to_ascii_lowercase();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_owned();
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host.to_owned(),
        _ => authority,
    }
}

/// Whether `host` can only mean this machine or is an address, not a name
/// an attacker's DNS could rebind.
fn is_loopback_name_or_address(host: &str) -> bool {
    host == "localhost" || host.ends_with(".localhost") || host.parse::<std::net::IpAddr>().is_ok()
}

/// The authority of an `Origin` value (`scheme://authority`); `None` for
/// `null` and anything unparseable.
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(rest.trim_end_matches('/'))
}

/// Checks one request: its method, `Origin`, and the authority it names
/// (`Host`, or the URI's in HTTP/2).
pub fn check(
    method: &Method,
    origin: Option<&str>,
    authority: Option<&str>,
    loopback_only: bool,
) -> Result<(), Refusal> {
    if loopback_only && let Some(authority) = authority {
        let host = host_of(authority);
        if !is_loopback_name_or_address(&host) {
            return Err(Refusal::HostNotAllowed { host });
        }
    }
    let changes_state = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if let (true, Some(origin)) = (changes_state, origin) {
        let same = origin_authority(origin)
            .zip(authority)
            .is_some_and(|(from, to)| from.eq_ignore_ascii_case(to.trim()));
        if !same {
            return Err(Refusal::CrossOriginWrite {
                origin: origin.to_owned(),
            });
        }
    }
    Ok(())
}

/// The middleware: refuses what [`check`] refuses, and sets the security
/// headers on every response.
pub async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    // Decided before the await: a borrowed request (its body is not Sync)
    // must not live across it.
    let verdict = {
        let header = |name| {
            request
                .headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        let authority = header(HOST).or_else(|| request.uri().authority().map(|a| a.as_str()));
        check(
            request.method(),
            header(ORIGIN),
            authority,
            state.loopback_only(),
        )
    };
    let mut response = match verdict {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            let body = serde_json::json!({
                "error": refusal.message(),
                "reason": refusal.reason(),
            });
            (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
        }
    };
    let headers = response.headers_mut();
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("content-security-policy", CONTENT_SECURITY_POLICY),
    ] {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_from_another_origin_are_refused_and_same_origin_or_no_origin_pass() {
        let post = Method::POST;
        let here = Some("127.0.0.1:7470");
        assert_eq!(check(&post, None, here, true), Ok(()));
        assert_eq!(
            check(&post, Some("http://127.0.0.1:7470"), here, true),
            Ok(())
        );
        assert_eq!(
            check(&post, Some("https://evil.example"), here, false),
            Err(Refusal::CrossOriginWrite {
                origin: "https://evil.example".into()
            })
        );
        assert!(check(&post, Some("null"), here, false).is_err());
        assert!(check(&post, Some("http://127.0.0.1:9999"), here, false).is_err());
        // Reads are left to the browser's same-origin policy (no CORS here).
        assert_eq!(
            check(&Method::GET, Some("https://evil.example"), here, false),
            Ok(())
        );
    }

    #[test]
    fn a_loopback_store_answers_only_to_loopback_names_and_addresses() {
        let get = Method::GET;
        for ok in [
            "localhost:7470",
            "LOCALHOST",
            "kiln.localhost:7470",
            "127.0.0.1:7470",
            "[::1]:7470",
            "10.0.0.5",
        ] {
            assert_eq!(check(&get, None, Some(ok), true), Ok(()), "{ok}");
        }
        assert_eq!(
            check(&get, None, Some("rebound.evil.example:7470"), true),
            Err(Refusal::HostNotAllowed {
                host: "rebound.evil.example".into()
            })
        );
        // Listening beyond loopback (Kubernetes), any name is fine.
        assert_eq!(
            check(&get, None, Some("kiln.kiln-system.svc:7470"), false),
            Ok(())
        );
        // No authority at all (HTTP/1.0 clients) is not a browser.
        assert_eq!(check(&get, None, None, true), Ok(()));
    }

    #[test]
    fn hosts_are_parsed_from_authorities() {
        assert_eq!(host_of("Example.COM:80"), "example.com");
        assert_eq!(host_of("[::1]:7470"), "::1");
        assert_eq!(host_of("example.com"), "example.com");
        assert_eq!(origin_authority("http://a.b:1/"), Some("a.b:1"));
        assert_eq!(origin_authority("null"), None);
    }
}
