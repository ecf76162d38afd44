//! An HTTP proxy in front of `moto_server` that can refuse the uploads of
//! blocks' `meta.json` with 503, as an S3 endpoint failing mid-upload does
//! (the block's data is stored, its `meta.json` is not, and the store keeps
//! retrying), and can slow down reads of blocks' data, as a distant bucket
//! does (so a query reading blocks takes long enough for another replica's
//! compaction to delete some of them under it). One request per connection
//! (it answers `Connection: close`), so every request passes the filter.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The proxy, listening on 127.0.0.1:`port` until the test process ends.
#[derive(Debug)]
pub struct S3Proxy {
    pub port: u16,
    /// While set, `PUT .../meta.json` is answered 503 without reaching moto.
    pub refuse_meta_puts: Arc<AtomicBool>,
    /// How many requests were refused.
    pub refused: Arc<AtomicU64>,
    /// Milliseconds added before each `GET .../data` reaches moto.
    pub data_get_delay_ms: Arc<AtomicU64>,
}

impl S3Proxy {
    /// Starts forwarding to `127.0.0.1:<upstream_port>` (moto), with no
    /// fault switched on.
    pub fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let refuse_meta_puts = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let data_get_delay_ms = Arc::new(AtomicU64::new(0));
        let faults = Faults {
            refuse_meta_puts: Arc::clone(&refuse_meta_puts),
            refused: Arc::clone(&refused),
            data_get_delay_ms: Arc::clone(&data_get_delay_ms),
        };
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let faults = faults.clone();
                std::thread::spawn(move || {
                    // A client that hangs up early is not the test's concern.
                    let _ = serve(client, upstream_port, &faults);
                });
            }
        });
        Self {
            port,
            refuse_meta_puts,
            refused,
            data_get_delay_ms,
        }
    }
}

#[derive(Clone)]
struct Faults {
    refuse_meta_puts: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    data_get_delay_ms: Arc<AtomicU64>,
}

fn serve(client: TcpStream, upstream_port: u16, faults: &Faults) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = Vec::new();
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            content_length = value.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("connection:") {
            continue;
        }
        headers.push(line);
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body)?;
    let mut client = client;
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if faults.refuse_meta_puts.load(Ordering::SeqCst)
        && method == "PUT"
        && path.ends_with("/meta.json")
    {
        faults.refused.fetch_add(1, Ordering::SeqCst);
        client.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        return Ok(());
    }
    if method == "GET" && path.ends_with("/data") {
        let delay = faults.data_get_delay_ms.load(Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(delay));
    }
    let mut upstream = TcpStream::connect(("127.0.0.1", upstream_port))?;
    let mut head = request_line;
    for header in headers {
        head.push_str(&header);
    }
    head.push_str("Connection: close\r\n\r\n");
    upstream.write_all(head.as_bytes())?;
    upstream.write_all(&body)?;
    let mut response = Vec::new();
    upstream.read_to_end(&mut response)?;
    // Tell the client this connection ends here, so its next request
    // comes through the filter on a new one.
    if let Some(end) = response.windows(2).position(|w| w == b"\r\n") {
        response.splice(end + 2..end + 2, b"Connection: close\r\n".iter().copied());
    }
    client.write_all(&response)?;
    Ok(())
}
