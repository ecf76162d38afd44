//! An address that swallows connections, as a replaced pod's old address
//! does while the cluster's DNS still names it: a SYN sent there is
//! neither answered nor refused, and a connect hangs until its caller
//! gives up.
//!
//! Made without root: a loopback listener with an accept queue of one
//! (`listen(0)`), filled by a connection nobody accepts. Linux then drops
//! every further SYN (counted in `ListenOverflows`) and the client
//! retransmits, exactly as toward a dead address. An unroutable TEST-NET
//! address is no substitute: on this project's hosts it was refused within
//! 4 ms. [`SilentAddress::new`] checks that a connect really hangs, so a
//! host that resets instead (`net.ipv4.tcp_abort_on_overflow = 1`) fails
//! the test that relies on it rather than passing it for the wrong reason.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A loopback address whose connects hang; kept while the value lives.
#[derive(Debug)]
pub struct SilentAddress {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _filling: TcpStream,
}

impl SilentAddress {
    #[track_caller]
    pub fn new() -> Self {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        socket.bind(&any_port.into()).expect("bind");
        socket.listen(0).expect("listen");
        let listener: TcpListener = socket.into();
        let addr = listener.local_addr().expect("local addr");
        let filling = TcpStream::connect(addr).expect("the connection that fills the queue");
        let probe = TcpStream::connect_timeout(&addr, Duration::from_millis(300));
        assert!(
            probe.is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut),
            "a connect to a full accept queue on {addr} did not hang: this host answers \
             such SYNs (net.ipv4.tcp_abort_on_overflow?)"
        );
        Self {
            addr,
            _listener: listener,
            _filling: filling,
        }
    }
}

impl Default for SilentAddress {
    fn default() -> Self {
        Self::new()
    }
}
