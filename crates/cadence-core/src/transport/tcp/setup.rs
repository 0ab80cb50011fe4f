//! Setting up TCP streams: the thin socket loops that drive the handshake
//! machines of `transport/handshake.rs`. Reached as `transport::tcp_setup`
//! as well.
//!
//! - [`connect`] (the client) is a blocking loop over one [`Dial`]
//!   (`dial.rs`: connect, HELLO, the answer, WELCOME or REFUSE), retried
//!   until the listener is up, bounded by the bootstrap deadline.
//! - [`accept_all`] (the server) accepts without blocking and drives every
//!   half-open handshake at once, each with its own [`HANDSHAKE_TIMEOUT`], so
//!   a stranger that connects and says nothing (or says garbage) costs the
//!   job nothing: members keep getting through around it.

pub use super::dial::{Attempt, Connected, Dial, Dialer};
use super::socket::poll_fds;
use crate::transport::handshake::{Acceptor, Expected, JobSecret, ReplayGuard, Step, StreamKey};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long an accepted connection may take to complete its handshake. A
/// member answers within a round trip (its HELLO is sent with the connect);
/// this only bounds what a stranger can hold.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Half-open handshakes held at once; more connections are refused until
/// some finish (a flood must not exhaust file descriptors).
const MAX_PENDING: usize = 256;
/// Rejections logged one by one; beyond that they are counted.
const MAX_LOGGED: usize = 64;

/// Why [`accept_all`] failed, and the rank to blame when one is.
#[derive(Debug)]
pub struct SetupFailure {
    pub detail: String,
    pub culprit: Option<usize>,
}

impl SetupFailure {
    fn new(detail: String) -> SetupFailure {
        SetupFailure {
            detail,
            culprit: None,
        }
    }
}

/// Connects stream `stream` of the link to `peer_rank` at its listener
/// `addr` (from `from`, and one of `sports` when the path planner chose
/// some: `Dial::start`; retrying until it listens and until the handshake
/// completes) and
/// proves `who`'s membership. Fails at once if the listener cannot prove
/// its own or refuses this rank's.
pub fn connect(
    who: Dialer<'_>,
    addr: SocketAddr,
    from: Option<IpAddr>,
    sports: &[u16],
    stream: usize,
    peer_rank: usize,
    deadline: Instant,
) -> io::Result<Connected> {
    let mut last = String::new();
    // Between handshake attempts the listener refused: it may refuse again
    // (its log says why), so do not hammer it.
    let mut backoff = Duration::from_millis(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let why = if last.is_empty() {
                String::new()
            } else {
                format!(" (last attempt: {last})")
            };
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {addr} timed out{why}"),
            ));
        }
        let within = left.min(Duration::from_secs(5));
        let dial = match Dial::start(who, addr, from, sports, stream, peer_rank, within) {
            Ok(d) => d,
            Err(Attempt::Retry(why)) => {
                last = why;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(Attempt::Fatal(e)) => return Err(e),
        };
        match dial.wait(deadline) {
            Ok(c) => return Ok(c),
            // The listener dropped us before deciding (e.g. it held us past
            // its handshake timeout while busy), or was not up yet: try
            // again. Its log says why if it refused us.
            Err(Attempt::Retry(why)) => {
                last = why;
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(Attempt::Fatal(e)) => return Err(e),
        }
    }
}

/// One accepted connection whose handshake is under way.
struct Pending<'a> {
    sock: TcpStream,
    from: SocketAddr,
    machine: Acceptor<'a>,
    /// Bytes to send, and how many are sent.
    out: Vec<u8>,
    out_done: usize,
    /// Set once the client proved itself; the connection is handed over once
    /// WELCOME is out (when kept).
    key: Option<StreamKey>,
    keep: bool,
    expires: Instant,
}

/// Counts and logs rejected connections (each once, the first
/// [`MAX_LOGGED`] by address and reason).
struct Rejections<'w> {
    warn: &'w mut dyn FnMut(String),
    count: usize,
}

impl Rejections<'_> {
    fn drop_conn(&mut self, from: SocketAddr, why: &str) {
        self.count += 1;
        if self.count <= MAX_LOGGED {
            (self.warn)(format!("dropped connection from {from}: {why}"));
        }
        if self.count == MAX_LOGGED {
            (self.warn)("more connections are being dropped; counting them from now on".into());
        }
    }
}

/// Accepts connections until every `(peer, stream)` in `expected` has one
/// that proved its membership. Connections that fail the handshake
/// (strangers, other jobs, replays, garbage, silence past
/// [`HANDSHAKE_TIMEOUT`]) are dropped with a warning naming the address and
/// the reason; they are never fatal and never hold up members: a port
/// scanner must not kill or slow a job.
pub fn accept_all(
    listeners: &[TcpListener],
    secret: &JobSecret,
    comm_id: &str,
    my_rank: usize,
    expected: &[StreamKey],
    deadline: Instant,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<(StreamKey, TcpStream)>, SetupFailure> {
    let mut out = Vec::with_capacity(expected.len());
    accept_each(
        listeners,
        secret,
        comm_id,
        my_rank,
        Expected::These(expected),
        deadline,
        warn,
        &mut |_| true,
        &mut |k, s| out.push((k, s)),
        None,
    )?;
    Ok(out)
}

/// What ends an [`accept_each`] early: `flag` set, and `fd` (polled with
/// the listeners) readable from then on, so the loop sleeps until a
/// connection or the stop comes instead of looking at the flag every
/// 100 ms: a thousand acceptors on two cores, each looking ten times a
/// second, cost the cores as much as the set-up itself.
#[derive(Clone, Copy)]
pub struct Stop<'a> {
    pub flag: &'a AtomicBool,
    pub fd: RawFd,
}

/// [`accept_all`], handing each connection to `deliver` as soon as its
/// handshake completes (the peer-table exchange answers each while later
/// ones are still to come); ends early, without error, on `stop` (links
/// made on first use accept what `expected` admits for the communicator's
/// life, until `stop`). `keep` decides, for each member that proved itself,
/// whether its stream is kept (delivered) or dropped: its WELCOME says
/// which (links made on first use drop the loser of a race).
#[allow(clippy::too_many_arguments)]
pub fn accept_each(
    listeners: &[TcpListener],
    secret: &JobSecret,
    comm_id: &str,
    my_rank: usize,
    expected: Expected<'_>,
    deadline: Instant,
    warn: &mut dyn FnMut(String),
    keep: &mut dyn FnMut(StreamKey) -> bool,
    deliver: &mut dyn FnMut(StreamKey, TcpStream),
    stop: Option<Stop<'_>>,
) -> Result<(), SetupFailure> {
    let mut got: Vec<StreamKey> = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut seen = ReplayGuard::default();
    let mut rejected = Rejections { warn, count: 0 };
    for listener in listeners {
        listener
            .set_nonblocking(true)
            .map_err(|e| SetupFailure::new(format!("listener: {e}")))?;
    }
    let mut buf = [0u8; 512];
    let stopped = || stop.is_some_and(|s| s.flag.load(Ordering::Acquire));
    let all_in = |got: &[StreamKey]| match expected {
        Expected::These(keys) => got.len() >= keys.len(),
        Expected::Admitted(_) => false,
    };
    while !all_in(&got) && !stopped() {
        let now = Instant::now();
        if now > deadline {
            let missing: Vec<&StreamKey> = match expected {
                Expected::These(keys) => keys.iter().filter(|k| !got.contains(k)).collect(),
                Expected::Admitted(_) => Vec::new(),
            };
            if rejected.count > MAX_LOGGED {
                (rejected.warn)(format!("dropped {} connections in all", rejected.count));
            }
            let names: Vec<String> = missing
                .iter()
                .map(|(r, s)| format!("rank {r} stream {s}"))
                .collect();
            return Err(SetupFailure {
                detail: format!(
                    "timed out waiting for connections from {}",
                    names.join(", ")
                ),
                // The lowest rank that never connected (ranks connect in
                // order, so it is the first one stuck).
                culprit: missing.iter().map(|(r, _)| *r).min(),
            });
        }
        // Wait for a new connection, bytes from a pending one, room to send,
        // or the next expiry.
        let mut fds = Vec::with_capacity(pending.len() + listeners.len());
        fds.extend(listeners.iter().map(|l| libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        for p in &pending {
            let out = p.out_done < p.out.len();
            fds.push(libc::pollfd {
                fd: p.sock.as_raw_fd(),
                events: if out { libc::POLLOUT } else { libc::POLLIN },
                revents: 0,
            });
        }
        if let Some(s) = stop {
            fds.push(libc::pollfd {
                fd: s.fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let next = pending
            .iter()
            .map(|p| p.expires)
            .chain([deadline])
            .min()
            .unwrap_or(deadline);
        // Nothing but these descriptors, a handshake's expiry and the
        // deadline can end the wait: no looking in between (a thousand
        // exchanges' acceptors waking ten times a second each cost two
        // cores a tenth of their time).
        let wait = next
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        poll_fds(&mut fds, wait);

        // New connections, on every NIC's listener.
        for listener in listeners {
            accept_new(
                listener,
                &mut pending,
                &mut rejected,
                secret,
                comm_id,
                my_rank,
                expected,
            )?;
        }

        // Progress every pending handshake; keep the ones still under way.
        let now = Instant::now();
        let mut i = 0;
        while i < pending.len() {
            match drive(&mut pending[i], &mut buf, &got, &mut seen, keep) {
                Ok(false) if now < pending[i].expires => i += 1,
                Ok(false) => {
                    let p = pending.swap_remove(i);
                    let got_bytes = p.machine.partial();
                    let why = if p.key.is_some() {
                        "could not be sent its welcome in time".to_string()
                    } else if got_bytes == 0 && p.out.is_empty() {
                        format!("sent nothing within {:?}", HANDSHAKE_TIMEOUT)
                    } else {
                        format!(
                            "did not complete the handshake within {:?}",
                            HANDSHAKE_TIMEOUT
                        )
                    };
                    rejected.drop_conn(p.from, &why);
                }
                // Dropped for the peer's own link: told so, closed.
                Ok(true) if !pending[i].keep => drop(pending.swap_remove(i)),
                Ok(true) => {
                    let p = pending.swap_remove(i);
                    let _ = p.sock.set_nodelay(true);
                    let key = p.key.expect("finished handshakes have a key");
                    got.push(key);
                    deliver(key, p.sock);
                }
                Err(why) => {
                    let p = pending.swap_remove(i);
                    rejected.drop_conn(p.from, &why);
                }
            }
        }
    }
    // Every expected member is in, so what is still pending is strangers
    // (or duplicates): closed here, each named once.
    for p in pending {
        let why = if p.machine.partial() == 0 && p.out.is_empty() {
            "sent nothing before set-up finished"
        } else {
            "did not complete the handshake before set-up finished"
        };
        rejected.drop_conn(p.from, why);
    }
    if rejected.count > MAX_LOGGED {
        (rejected.warn)(format!("dropped {} connections in all", rejected.count));
    }
    Ok(())
}

/// Takes every connection waiting on `listener` into `pending` (as a
/// handshake under way), without blocking.
#[allow(clippy::too_many_arguments)]
fn accept_new<'a>(
    listener: &TcpListener,
    pending: &mut Vec<Pending<'a>>,
    rejected: &mut Rejections<'_>,
    secret: &'a JobSecret,
    comm_id: &'a str,
    my_rank: usize,
    expected: Expected<'a>,
) -> Result<(), SetupFailure> {
    loop {
        match listener.accept() {
            Ok((sock, from)) => {
                if pending.len() >= MAX_PENDING {
                    rejected.drop_conn(from, "too many handshakes under way");
                    continue;
                }
                if let Err(e) = sock.set_nonblocking(true) {
                    rejected.drop_conn(from, &format!("socket: {e}"));
                    continue;
                }
                pending.push(Pending {
                    sock,
                    from,
                    machine: Acceptor::new(secret, comm_id, my_rank, expected),
                    out: Vec::new(),
                    out_done: 0,
                    key: None,
                    keep: false,
                    expires: Instant::now() + HANDSHAKE_TIMEOUT,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // A connection reset before we took it, or fds exhausted:
            // neither is a reason to fail the job; wait and go on.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) || e.raw_os_error() == Some(libc::EMFILE)
                    || e.raw_os_error() == Some(libc::ENFILE) =>
            {
                return Ok(())
            }
            Err(e) => return Err(SetupFailure::new(format!("accept: {e}"))),
        }
    }
}

/// Moves one handshake forward without blocking: `Ok(true)` when it is done
/// and its WELCOME is sent, `Ok(false)` while under way, `Err(reason)` to
/// drop it (a member refused is told why first, best effort).
fn drive(
    p: &mut Pending,
    buf: &mut [u8],
    got: &[StreamKey],
    seen: &mut ReplayGuard,
    keep: &mut dyn FnMut(StreamKey) -> bool,
) -> Result<bool, String> {
    loop {
        // Send what is queued first: the client waits for it.
        while p.out_done < p.out.len() {
            match p.sock.write(&p.out[p.out_done..]) {
                Ok(0) => return Err("closed the connection during the handshake".into()),
                Ok(n) => p.out_done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("handshake interrupted: {e}")),
            }
        }
        if p.key.is_some() {
            return Ok(true);
        }
        // Read a little more than the message, so a peer that does not wait
        // its turn is caught (the machine refuses surplus bytes).
        let want = (p.machine.wants() + 1).min(buf.len());
        let n = match p.sock.read(&mut buf[..want]) {
            Ok(0) if p.machine.partial() == 0 && p.out.is_empty() => {
                return Err("closed the connection without a handshake".into())
            }
            Ok(0) => return Err("closed the connection during the handshake".into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("handshake interrupted: {e}")),
        };
        match p.machine.feed(&buf[..n], seen) {
            Ok(Step::NeedMore) => {}
            Ok(Step::Verified { key }) => {
                if got.contains(&key) {
                    // Only a holder of the secret gets here: a member that
                    // connected twice (a bug), never a stranger.
                    return Err(format!(
                        "second connection for rank {} stream {}",
                        key.0, key.1
                    ));
                }
                p.keep = keep(key);
                p.key = Some(key);
                p.out = p.machine.welcome(p.keep).map_err(|r| r.to_string())?;
                p.out_done = 0;
            }
            Ok(Step::Done { .. }) => unreachable!("a server is verified, never done"),
            Err(r) => {
                if let Some(b) = r.refusal() {
                    // One try: a full send buffer is a peer not listening.
                    let _ = p.sock.write(&b);
                }
                return Err(r.to_string());
            }
        }
    }
}
