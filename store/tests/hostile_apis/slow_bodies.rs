//! Bodies that arrive a byte at a time. A store that admits a request
//! (a slot, a memory reservation sized for the largest body) before its
//! body has arrived lets a few slow clients hold what every other client
//! needs, for as long as its body timeout allows, and then again. Here 8
//! ingest bodies without a length trickle in (on 8 connections, then as 8
//! streams of one HTTP/2 connection), and 64 querier bodies, each for
//! [`HOLD`], while the good client must be served throughout.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::{Answer, Attack, Expect, Hostile};

/// How long the slow clients hold their requests open.
const HOLD: Duration = Duration::from_secs(20);
/// Between two bytes of a slow body.
const TRICKLE_EVERY: Duration = Duration::from_secs(1);
/// Ingest bodies without a length (chunked) trickling at once.
const SLOW_INGESTS: usize = 8;
/// Querier bodies trickling at once, as many as the default query slots.
const SLOW_QUERIES: usize = 64;
/// The length the slow querier bodies announce.
const QUERY_BODY_BYTES: usize = 1000;

/// One slow request: its connection, still open for writing or not.
struct Slow {
    stream: TcpStream,
    open: bool,
    /// Body bytes written so far.
    sent: usize,
    started: Instant,
}

impl Slow {
    fn start(addr: SocketAddr, head: &str, first: &[u8]) -> Self {
        let started = Instant::now();
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(90)))
            .expect("read timeout");
        let open = stream.write_all(head.as_bytes()).is_ok();
        let mut slow = Slow {
            stream,
            open,
            sent: 0,
            started,
        };
        slow.send(first);
        slow
    }

    /// Writes `bytes` unless the server stopped reading (it answered early
    /// or closed the connection).
    fn send(&mut self, bytes: &[u8]) {
        if self.open {
            self.open = self.stream.write_all(bytes).is_ok();
            if self.open {
                self.sent += bytes.len();
            }
        }
    }

    /// The status line the server answered, after the rest of the body.
    fn finish(mut self, what: String, rest: &[u8]) -> Hostile {
        self.send(rest);
        let mut raw = Vec::new();
        let read = self.stream.read_to_end(&mut raw);
        let status = std::str::from_utf8(&raw)
            .ok()
            .and_then(|text| text.split(' ').nth(1))
            .and_then(|code| code.parse().ok());
        let answer = match (status, read) {
            (Some(status), _) => Answer::Http {
                status,
                excerpt: String::from_utf8_lossy(&raw)
                    .lines()
                    .next_back()
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect(),
            },
            (None, Err(err)) => Answer::Nothing(err.to_string()),
            (None, Ok(_)) => Answer::Nothing("closed without an answer".to_owned()),
        };
        Hostile {
            what,
            expect: Expect::Refused,
            answer,
            took: self.started.elapsed(),
        }
    }
}

/// Sends `byte` on every slow request each [`TRICKLE_EVERY`] for [`HOLD`].
fn trickle(slow: &mut [Slow], byte: &[u8]) {
    let until = Instant::now() + HOLD;
    while Instant::now() < until {
        std::thread::sleep(TRICKLE_EVERY);
        for request in slow.iter_mut() {
            request.send(byte);
        }
    }
}

#[test]
fn ingest_bodies_without_length_trickling_on_8_connections() {
    let Some(attack) = Attack::start("ingest_bodies_without_length_trickling_x8") else {
        return;
    };
    attack.run(|addr| {
        // Not a profile: once the body is whole, it is refused as such.
        let head = format!(
            "POST /ingest?name=slow&format=pprof HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        );
        let mut slow: Vec<Slow> = (0..SLOW_INGESTS)
            .map(|_| Slow::start(addr, &head, b"1\r\nx\r\n"))
            .collect();
        trickle(&mut slow, b"1\r\nx\r\n");
        slow.into_iter()
            .enumerate()
            .map(|(i, request)| {
                request.finish(
                    format!(
                        "chunked /ingest body trickling a byte a second for {} s, request {i}",
                        HOLD.as_secs()
                    ),
                    b"0\r\n\r\n",
                )
            })
            .collect()
    });
}

#[test]
fn querier_bodies_trickling_on_64_connections() {
    let Some(attack) = Attack::start("querier_bodies_trickling_x64") else {
        return;
    };
    attack.run(|addr| {
        let head = format!(
            "POST /querier.v1.QuerierService/LabelNames HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {QUERY_BODY_BYTES}\r\nConnection: close\r\n\r\n"
        );
        let mut slow: Vec<Slow> = (0..SLOW_QUERIES)
            .map(|_| Slow::start(addr, &head, b"x"))
            .collect();
        trickle(&mut slow, b"x");
        slow.into_iter()
            .enumerate()
            .map(|(i, request)| {
                // The rest of the body, so that it is whole (and not JSON,
                // so refused once read).
                let rest = vec![b'x'; QUERY_BODY_BYTES.saturating_sub(request.sent)];
                request.finish(
                    format!(
                        "querier LabelNames body trickling a byte a second for {} s, request {i}",
                        HOLD.as_secs()
                    ),
                    &rest,
                )
            })
            .collect()
    });
}

/// A request body fed from a channel: each message one DATA frame, the
/// end when the sender is dropped. It announces no length.
struct Trickle(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Trickle {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|bytes| bytes.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// 8 trickling `/ingest` bodies as streams of one HTTP/2 connection.
async fn trickle_streams(addr: SocketAddr) -> Vec<Hostile> {
    let started = Instant::now();
    let nothing = |why: String| {
        (0..SLOW_INGESTS)
            .map(|i| Hostile {
                what: format!("HTTP/2 stream {i}"),
                expect: Expect::Refused,
                answer: Answer::Nothing(why.clone()),
                took: started.elapsed(),
            })
            .collect()
    };
    let tcp = match tokio::net::TcpStream::connect(addr).await {
        Ok(tcp) => tcp,
        Err(err) => return nothing(format!("connect: {err}")),
    };
    let (sender, connection) = match hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    {
        Ok(handshake) => handshake,
        Err(err) => return nothing(format!("HTTP/2 handshake: {err}")),
    };
    tokio::spawn(connection);
    let mut feeds = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..SLOW_INGESTS {
        let (feed, body) = tokio::sync::mpsc::channel(4);
        let request = hyper::Request::post(format!("http://{addr}/ingest?name=slow&format=pprof"))
            .body(Trickle(body))
            .expect("request");
        let mut sender = sender.clone();
        answers.push(tokio::spawn(async move {
            match sender.send_request(request).await {
                Ok(response) => Answer::Http {
                    status: response.status().as_u16(),
                    excerpt: String::new(),
                },
                Err(err) => Answer::Nothing(err.to_string()),
            }
        }));
        feeds.push(feed);
    }
    let until = Instant::now() + HOLD;
    while Instant::now() < until {
        tokio::time::sleep(TRICKLE_EVERY).await;
        for feed in &feeds {
            // A stream the store has answered no longer takes bytes.
            let _ = feed.try_send(Bytes::from_static(b"x"));
        }
    }
    // The bodies end; not profiles, they are refused as such.
    drop(feeds);
    let mut hostile = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        let answer = answer
            .await
            .unwrap_or_else(|err| Answer::Nothing(err.to_string()));
        hostile.push(Hostile {
            what: format!(
                "/ingest body without length trickling a byte a second for {} s, HTTP/2 stream {i}",
                HOLD.as_secs()
            ),
            expect: Expect::Refused,
            answer,
            took: started.elapsed(),
        });
    }
    hostile
}

#[test]
fn ingest_bodies_without_length_trickling_on_8_streams_of_one_http2_connection() {
    let Some(attack) = Attack::start("ingest_bodies_trickling_x8_http2_streams") else {
        return;
    };
    attack.run(|addr| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(trickle_streams(addr))
    });
}
