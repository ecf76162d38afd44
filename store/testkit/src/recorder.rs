//! An HTTP/1.1 listener that keeps every request byte for byte (method,
//! target, headers, body) and answers each with an empty 200, so a test can
//! capture what a real client sends and replay it against `kiln-store`.
//! An empty body with `application/proto` is an empty Connect reply, which
//! the Pyroscope clients accept for Push.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;

/// One request as the client sent it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A listening recorder on 127.0.0.1.
#[derive(Debug)]
pub struct Recorder {
    url: String,
    requests: mpsc::Receiver<Recorded>,
}

impl Recorder {
    /// Starts listening; connections are served on threads of their own.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the recorder");
        let url = format!(
            "http://{}",
            listener.local_addr().expect("recorder address")
        );
        let (sender, requests) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let sender = sender.clone();
                std::thread::spawn(move || serve_connection(stream, &sender));
            }
        });
        Self { url, requests }
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every request received so far, in arrival order. Each is recorded
    /// before it is answered, so once the client has exited (it waits for
    /// its answers) all of its requests are here.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.try_iter().collect()
    }
}

/// Reads requests from one connection until the client closes it.
fn serve_connection(stream: TcpStream, requests: &mpsc::Sender<Recorded>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = request_line.trim_end().split(' ');
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("").to_owned();
        let mut headers = Vec::new();
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("read a header");
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').expect("a header with a colon");
            let (name, value) = (name.trim().to_owned(), value.trim().to_owned());
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().expect("a content-length number");
            }
            assert!(
                !name.eq_ignore_ascii_case("transfer-encoding"),
                "the recorder reads content-length bodies only; the client sent {name}: {value}"
            );
            headers.push((name, value));
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("read the body");
        let _ = requests.send(Recorded {
            method,
            target,
            headers,
            body,
        });
        writer
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/proto\r\ncontent-length: 0\r\n\r\n",
            )
            .expect("answer");
    }
}
