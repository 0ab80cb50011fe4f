//! One client stream on its way, without blocking: the TCP connect, the
//! HELLO, the answer ([`Dial`]). A link's streams dial at once, so the
//! whole link waits for one handshake round trip; the engine drives the
//! dials of links made on first use from its own loop (`comm/lazy.rs`),
//! and [`Dial::wait`] is the blocking form set-up uses.

use super::socket::poll_fds;
use crate::transport::handshake::{fresh_nonce, Connector, JobSecret, Reject, Step};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// A stream made: the socket (blocking again), and whether the listener
/// keeps it (`false`: it keeps its own link to this rank instead; only a
/// listener of links made on first use says so).
pub type Connected = (TcpStream, bool);

/// How one attempt ended: worth another (the listener was not up yet, or
/// dropped us undecided), or not.
#[derive(Debug)]
pub enum Attempt {
    Retry(String),
    Fatal(io::Error),
}

/// Who dials: this rank of a communicator, with the job's secret to prove
/// its membership.
#[derive(Clone, Copy)]
pub struct Dialer<'a> {
    pub secret: &'a JobSecret,
    pub comm_id: &'a str,
    pub rank: usize,
    /// Print each planned stream's source port next to its plan (a line
    /// on stderr; `CADENCE_DEBUG=INFO`): where the planner's spines and the
    /// traffic disagree, this says whether the stream got its port.
    pub say_ports: bool,
}

/// One stream's connect and handshake, moved on by [`Dial::advance`].
pub struct Dial {
    sock: TcpStream,
    machine: Connector,
    hello: Vec<u8>,
    sent: usize,
    connected: bool,
    /// The TCP connect fails past this.
    connect_by: Instant,
    peer_rank: usize,
    /// The listener's answer, once read: keep or drop.
    answered: Option<bool>,
}

impl Dial {
    /// Starts connecting stream `stream` of the link to `peer_rank` at
    /// `addr` (from the local address `from` when given: the NIC of a path;
    /// a multi-rail host has a route to each rank through its NIC, and
    /// binding makes the source address that NIC's as well) and sends the
    /// HELLO as soon as the connection is up (at once on a loopback). The
    /// connect may take `connect_within`. `sports`: source ports the path
    /// planner chose (`fabric::planner`), tried in order; one that is busy
    /// (bound, or its 4-tuple still in TIME_WAIT) gives way to the next, and
    /// none left to the kernel's choice.
    pub fn start(
        who: Dialer<'_>,
        addr: SocketAddr,
        from: Option<IpAddr>,
        sports: &[u16],
        stream: usize,
        peer_rank: usize,
        connect_within: Duration,
    ) -> Result<Dial, Attempt> {
        let fatal = Attempt::Fatal;
        let mut ports = sports.iter().map(|&p| Some(p)).chain(std::iter::once(None));
        let (sock, connected) = loop {
            let port = ports.next().expect("ends with the kernel's choice");
            let sock = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )
            .map_err(fatal)?;
            sock.set_nonblocking(true).map_err(fatal)?;
            sock.set_tcp_nodelay(true).map_err(fatal)?;
            let busy = |e: &io::Error| {
                port.is_some()
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EADDRINUSE | libc::EADDRNOTAVAIL)
                    )
            };
            if let Some(p) = port {
                // A planned port's last connection may linger in TIME_WAIT.
                sock.set_reuse_address(true).map_err(fatal)?;
                let ip = from.unwrap_or_else(|| unspecified(addr));
                match sock.bind(&SocketAddr::new(ip, p).into()) {
                    Ok(()) => {}
                    Err(e) if busy(&e) => continue,
                    Err(e) => return Err(fatal(e)),
                }
            } else if let Some(ip) = from {
                sock.bind(&SocketAddr::new(ip, 0).into()).map_err(fatal)?;
            }
            match sock.connect(&addr.into()) {
                Ok(()) => break (sock, true),
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => break (sock, false),
                Err(e) if busy(&e) => continue,
                Err(e) => return Err(refused_or_fatal(e)),
            }
        };
        if who.say_ports && !sports.is_empty() {
            let bound = sock.local_addr().ok().and_then(|a| a.as_socket());
            let port = bound.map_or_else(|| "unknown".to_string(), |a| a.port().to_string());
            stderr_line!(
                "cadence: rank {} stream {stream} to rank {peer_rank} ({addr}): source port {port}, planned {sports:?}",
                who.rank
            );
        }
        let nonce = fresh_nonce().map_err(|e| fatal(io::Error::other(e)))?;
        let (machine, hello) =
            Connector::new(who.secret, who.comm_id, who.rank, stream, peer_rank, nonce);
        let mut dial = Dial {
            sock: sock.into(),
            machine,
            hello,
            sent: 0,
            connected,
            connect_by: Instant::now() + connect_within,
            peer_rank,
            answered: None,
        };
        if dial.connected {
            dial.send_hello()?;
        }
        Ok(dial)
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// What to poll for: writable while connecting or sending the HELLO,
    /// readable for the answer.
    pub fn events(&self) -> libc::c_short {
        if !self.connected || self.sent < self.hello.len() {
            libc::POLLOUT
        } else {
            libc::POLLIN
        }
    }

    /// Moves the dial on without blocking: `Some(keep)` once the listener
    /// answered and proved itself (then [`Dial::into_stream`]).
    pub fn advance(&mut self) -> Result<Option<bool>, Attempt> {
        if !self.connected {
            if let Some(e) = self.sock.take_error().map_err(Attempt::Fatal)? {
                return Err(refused_or_fatal(e));
            }
            if self.sock.peer_addr().is_err() {
                if Instant::now() > self.connect_by {
                    return Err(Attempt::Retry("the connect timed out".into()));
                }
                return Ok(None);
            }
            self.connected = true;
        }
        if self.answered.is_some() {
            return Ok(self.answered);
        }
        if !self.send_hello()? {
            return Ok(None);
        }
        let retry = |e: io::Error| Attempt::Retry(format!("handshake interrupted: {e}"));
        let mut buf = [0u8; 128];
        loop {
            // Exactly what the machine wants: after WELCOME come frames.
            let want = self.machine.wants().min(buf.len());
            let n = match (&self.sock).read(&mut buf[..want]) {
                Ok(0) => {
                    return Err(Attempt::Retry(format!(
                        "rank {} closed the connection during the handshake",
                        self.peer_rank
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(retry(e)),
            };
            match self.machine.feed(&buf[..n]) {
                Ok(Step::NeedMore) => {}
                Ok(Step::Done { keep, .. }) => {
                    self.answered = Some(keep);
                    return Ok(self.answered);
                }
                Ok(Step::Verified { .. }) => unreachable!("a client is never verified"),
                Err(r) => return Err(rejected(r)),
            }
        }
    }

    /// Writes what is left of the HELLO; whether all of it is out.
    fn send_hello(&mut self) -> Result<bool, Attempt> {
        while self.sent < self.hello.len() {
            match (&self.sock).write(&self.hello[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Attempt::Retry(format!("handshake interrupted: {e}"))),
            }
        }
        Ok(true)
    }

    /// The stream of a dial done, blocking again.
    pub fn into_stream(self) -> io::Result<TcpStream> {
        self.sock.set_nonblocking(false)?;
        Ok(self.sock)
    }

    /// Blocks until the dial is done or `deadline`.
    pub fn wait(mut self, deadline: Instant) -> Result<Connected, Attempt> {
        loop {
            if let Some(keep) = self.advance()? {
                let retry = |e: io::Error| Attempt::Retry(format!("handshake interrupted: {e}"));
                return Ok((self.into_stream().map_err(retry)?, keep));
            }
            let now = Instant::now();
            let until = if self.connected {
                deadline
            } else {
                deadline.min(self.connect_by)
            };
            if now >= until {
                // Without an answer by the deadline; a connect that took
                // too long is worth another try.
                if !self.connected {
                    return Err(Attempt::Retry("the connect timed out".into()));
                }
                return Err(Attempt::Fatal(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "rank {} did not complete the handshake in time",
                        self.peer_rank
                    ),
                )));
            }
            let mut fds = [libc::pollfd {
                fd: self.fd(),
                events: self.events(),
                revents: 0,
            }];
            poll_fds(&mut fds, (until - now).max(Duration::from_micros(100)));
        }
    }
}

/// A connect refused or unreachable is a listener not up yet: try again.
/// The any-address of `addr`'s family.
fn unspecified(addr: SocketAddr) -> IpAddr {
    match addr {
        SocketAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

fn refused_or_fatal(e: io::Error) -> Attempt {
    match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut => Attempt::Retry(e.to_string()),
        _ => Attempt::Fatal(e),
    }
}

/// What a handshake rejection on the client side means for the caller.
fn rejected(r: Reject) -> Attempt {
    let (kind, text) = match r {
        Reject::BadProof => (
            io::ErrorKind::PermissionDenied,
            format!(
                "the listener failed to prove it belongs to this job \
                 (a different job secret: another job's process, or a stale address): {r}"
            ),
        ),
        Reject::Refused(_) => (io::ErrorKind::PermissionDenied, r.to_string()),
        r => (
            io::ErrorKind::InvalidData,
            format!("bad handshake answer: {r}"),
        ),
    };
    Attempt::Fatal(io::Error::new(kind, text))
}
