//! Connections held open and idle. A store that only waits for each idle
//! connection's timeout lets one client that opens as many connections as
//! the cap allows (each with a request done, so none is new) keep every
//! other client waiting in the kernel's accept queue for that timeout, and
//! again, since it can open them as fast as they close. Here a client
//! opens half again as many HTTP/2 connections as the store's cap (HTTP/2:
//! an idle HTTP/1 connection is already closed at the header timeout),
//! each asking one request and then holding the connection idle, while the
//! good client must be served throughout, on new connections.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::{Answer, Attack, Expect, Hostile};

/// The store's connection cap in this test.
const CAP: usize = 100;
/// Idle connections the attack holds open: more than the cap.
const HELD: usize = CAP * 3 / 2;
/// How long they are held after the last one was served.
const HOLD: Duration = Duration::from_secs(3);
/// How long one of them waits for its answer (the store's idle timeout,
/// 2 minutes, is what it would wait without room being made).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// One held connection: its answer, and the task driving it (finished
/// once the store closed it).
struct Held {
    answer: Answer,
    took: Duration,
    driver: Option<tokio::task::JoinHandle<()>>,
    /// Kept so the connection is not closed from this side.
    _sender: Option<hyper::client::conn::http2::SendRequest<Empty<Bytes>>>,
}

/// Opens an HTTP/2 connection and asks `GET /healthz` on it.
async fn open_and_ask(addr: SocketAddr) -> Held {
    let started = Instant::now();
    let failed = |why: String| Held {
        answer: Answer::Nothing(why),
        took: started.elapsed(),
        driver: None,
        _sender: None,
    };
    let tcp = match tokio::net::TcpStream::connect(addr).await {
        Ok(tcp) => tcp,
        Err(err) => return failed(format!("connect: {err}")),
    };
    let (mut sender, connection) = match hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    {
        Ok(handshake) => handshake,
        Err(err) => return failed(format!("HTTP/2 handshake: {err}")),
    };
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::get(format!("http://{addr}/healthz"))
        .body(Empty::new())
        .expect("request");
    let answer = match tokio::time::timeout(ANSWER_WITHIN, sender.send_request(request)).await {
        Ok(Ok(response)) => Answer::Http {
            status: response.status().as_u16(),
            excerpt: String::new(),
        },
        Ok(Err(err)) => Answer::Nothing(err.to_string()),
        Err(_) => Answer::Nothing(format!("no answer within {} s", ANSWER_WITHIN.as_secs())),
    };
    Held {
        answer,
        took: started.elapsed(),
        driver: Some(driver),
        _sender: Some(sender),
    }
}

#[test]
fn connections_held_idle_past_the_cap_do_not_keep_other_clients_out() {
    let cap = format!("--max-connections={CAP}");
    let Some(attack) = Attack::start_with_flags("idle_http2_connections_x150_at_cap_100", &[&cap])
    else {
        return;
    };
    attack.run(|addr| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let started = Instant::now();
            let mut held = Vec::with_capacity(HELD);
            for _ in 0..HELD {
                held.push(open_and_ask(addr).await);
            }
            let served_in = started.elapsed();
            tokio::time::sleep(HOLD).await;
            let closed = held
                .iter()
                .filter(|h| h.driver.as_ref().is_some_and(|d| d.is_finished()))
                .count();
            eprintln!(
                "{HELD} HTTP/2 connections opened and served in {:.1} s at a cap of {CAP}; \
                 {closed} of them closed by the store to make room",
                served_in.as_secs_f64()
            );
            assert!(
                closed >= HELD - CAP,
                "at the cap, {closed} idle connections were closed for {} newer ones",
                HELD - CAP
            );
            // Below the cap there is room for each: past it, each answer is
            // the attack's to report; below it, only one that failed.
            held.into_iter()
                .enumerate()
                .filter(|(i, h)| *i >= CAP || !matches!(h.answer, Answer::Http { status: 200, .. }))
                .map(|(i, h)| Hostile {
                    what: format!("idle HTTP/2 connection {i}, its one request"),
                    expect: Expect::ServedOrRefused,
                    answer: h.answer,
                    took: h.took,
                })
                .collect()
        })
    });
}
