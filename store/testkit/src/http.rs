//! A minimal HTTP/1.1 client for talking to a store on loopback: one
//! request per connection (`Connection: close`), chunked bodies decoded.
//! Tests use it instead of a client library so that they send exactly the
//! bytes they mean to.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A free loopback port (bound, then released for the caller to use).
pub fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr")
}

/// One HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The body as text, invalid UTF-8 replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON. Flame graph trees nest one object per frame, and
    /// real stacks run past serde_json's default depth of 128 (a peer agent
    /// once sent over a thousand `[unknown]` frames), so the limit is lifted
    /// and the parse gets a stack of its own, as the CLI's does.
    pub fn json(&self) -> serde_json::Value {
        let body = self.body.clone();
        let parsed = std::thread::Builder::new()
            .name("test-json".to_owned())
            .stack_size(256 << 20)
            .spawn(move || {
                let mut deserializer = serde_json::Deserializer::from_slice(&body);
                deserializer.disable_recursion_limit();
                let value = serde::Deserialize::deserialize(&mut deserializer)
                    .and_then(|value: serde_json::Value| deserializer.end().map(|()| value));
                value.map_err(|e| e.to_string())
            })
            .expect("JSON decoder thread")
            .join()
            .expect("JSON decoder thread panicked");
        parsed.unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one HTTP/1.1 request with `Connection: close` and reads the reply.
/// A `Content-Length` is added unless `headers` has one (tests that lie
/// about the length pass their own).
pub fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    let mut has_length = false;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-length") {
            has_length = true;
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_length {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// Posts `folded` stacks (`a;b;c 7` lines) to Pyroscope's `/ingest` as
/// the CPU profile of app `app` over the last 10 s at 100 Hz: each sample
/// counts 10 ms, and the series is `process_cpu{service_name="<app>"}`.
pub fn post_folded(addr: SocketAddr, app: &str, folded: &[u8]) -> HttpResponse {
    http(
        addr,
        "POST",
        &format!("/ingest?name={app}.cpu&from=now-10s&until=now&sampleRate=100"),
        &[],
        folded,
    )
    .expect("ingest")
}

/// [`post_folded`], which the store must accept.
#[track_caller]
pub fn ingest_folded(addr: SocketAddr, app: &str, folded: &[u8]) {
    let response = post_folded(addr, app, folded);
    assert_eq!(response.status, 200, "{}", response.text());
}

/// Parses a whole HTTP/1.1 response as read from its connection, for
/// tests that write their requests themselves.
pub fn parse_response(raw: &[u8]) -> std::io::Result<HttpResponse> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// GET returning the response, panicking on IO errors.
#[track_caller]
pub fn get(addr: SocketAddr, target: &str) -> HttpResponse {
    http(addr, "GET", target, &[], b"").expect("GET")
}

/// Status and body of a GET to `127.0.0.1:<port>`, or `None` when nothing
/// answers (for tests that wait for a store to come up or go away).
pub fn http_get(port: u16, path: &str) -> Option<(u16, Vec<u8>)> {
    let response = http(loopback(port), "GET", path, &[], b"").ok()?;
    Some((response.status, response.body))
}

/// Status and body of a POST of `body` to `127.0.0.1:<port>`, or `None`
/// when nothing answers.
pub fn http_post(port: u16, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let response = http(loopback(port), "POST", path, &[], body).ok()?;
    Some((response.status, response.body))
}

/// The status code of a GET to `127.0.0.1:<port>`, or `None` when nothing
/// answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).map(|(status, _)| status)
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The two encodings of a Connect unary call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    /// `application/json`, as Grafana's Pyroscope datasource sends.
    Json,
    /// `application/proto`, binary protobuf.
    Proto,
}

/// A Connect unary call to `querier.v1.QuerierService/<method>`, sent as
/// Grafana's clients send it (with `Connect-Protocol-Version: 1`),
/// panicking on IO errors.
#[track_caller]
pub fn querier_call(
    addr: SocketAddr,
    method: &str,
    encoding: Connect,
    body: &[u8],
) -> HttpResponse {
    let content_type = match encoding {
        Connect::Json => "application/json",
        Connect::Proto => "application/proto",
    };
    http(
        addr,
        "POST",
        &format!("/querier.v1.QuerierService/{method}"),
        &[
            ("Content-Type", content_type),
            ("Connect-Protocol-Version", "1"),
        ],
        body,
    )
    .expect("POST a querier call")
}

/// A Connect JSON querier call, as Grafana's datasource makes it: the
/// status and the JSON answer.
#[track_caller]
pub fn querier_json(
    addr: SocketAddr,
    method: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let response = querier_call(addr, method, Connect::Json, body.to_string().as_bytes());
    (response.status, response.json())
}

/// A protobuf JSON int64: a string, or a number from a lenient writer.
#[track_caller]
pub fn json_int64(value: &serde_json::Value) -> i64 {
    match value {
        serde_json::Value::String(s) => s.parse().expect("int64 string"),
        other => other.as_i64().expect("int64"),
    }
}

/// The first profile type a store lists for the last ten minutes whose id
/// starts with `prefix` (`""`: the first); panics when none does.
#[track_caller]
pub fn stored_profile_type(addr: SocketAddr, prefix: &str) -> String {
    let types = get(addr, "/api/v1/profile-types?from=now-10m").json();
    types["profile_types"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["id"].as_str())
        .find(|id| id.starts_with(prefix))
        .unwrap_or_else(|| panic!("no profile type {prefix:?}... in {types}"))
        .to_owned()
}

/// Percent-encodes a query value.
pub fn enc(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Every function name in a flame graph JSON response.
pub fn flamegraph_names(response: &serde_json::Value) -> Vec<String> {
    response["flamegraph"]["names"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
