//! `kiln up` starts a real kiln-store (found next to `kiln`), prints the
//! UI address, serves the UI there, and stops the store on Ctrl-C.

use kiln_testkit::binaries::built_binary;
use kiln_testkit::http::{http_get, http_status};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn kiln_up_serves_the_ui_and_stops_the_store_on_ctrl_c() {
    // kiln up looks beside itself, so only the binary in the build directory counts.
    if built_binary("kiln-store", "KILN_UP_TEST_UNUSED").is_none() {
        return;
    }
    let data = tempfile::tempdir().expect("temporary data directory");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut kiln = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["up", "--no-agent", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(data.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kiln up starts");
    let stdout = kiln.stdout.take().expect("stdout is piped");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let announced = format!("http://127.0.0.1:{port}/");
    let mut printed = String::new();
    while !printed.contains(&announced) {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                printed.push_str(&line);
                printed.push('\n');
            }
            Err(_) => {
                let _ = kiln.kill();
                panic!("kiln up did not print the UI address; it printed:\n{printed}");
            }
        }
    }

    let (status, body) = http_get(port, "/").expect("the store answers");
    assert_eq!(status, 200);
    assert_eq!(
        body,
        kiln_ui_index(),
        "the UI is served at the printed address"
    );

    let pid = libc::pid_t::try_from(kiln.id()).expect("pid fits");
    // SAFETY: signalling our own child, which has not been reaped yet.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    let status = kiln.wait().expect("kiln exits");
    assert!(
        status.success(),
        "kiln up exits cleanly after Ctrl-C: {status}"
    );
    assert_eq!(
        http_status(port, "/healthz"),
        None,
        "the store stopped with it"
    );
}

/// The index page as embedded in the store, fetched from the UI crate's file.
fn kiln_ui_index() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/assets/index.html"))
        .expect("index.html is readable")
}
