//! TCP transport between ranks on different hosts.
//!
//! Terms:
//! - **stream**: one TCP connection to a peer. A link has several: `nstreams`
//!   (`CADENCE_NSTREAMS`) per **path** (a local NIC and the peer's NIC it
//!   reaches), so one flow's congestion window or one core's softirq work
//!   does not cap a large transfer, and every NIC carries traffic.
//! - **chunk**: a message is cut into chunks of [`CHUNK_BYTES`] (the last
//!   one shorter; a message below that size is one chunk). A chunk travels
//!   whole on one stream as a **frame**: a [`TcpHeader`] (the common
//!   [`WireHeader`](super::WireHeader) plus the message's number on the link and the chunk's
//!   byte offset), then `len` bytes.
//! - **earliest finish**: each chunk goes to the stream expected to deliver
//!   it first: (bytes the stream's socket still holds + the rest of the
//!   chunk it is writing + this chunk) / the stream's measured delivery rate.
//!   A stream that is not that one waits, even when its socket has room, so
//!   a path running at a fifth of its sibling's rate carries about a fifth
//!   of the bytes and does not hold a message's last chunks long after the
//!   others are done (the "earliest completion first" idea of multipath TCP
//!   schedulers). Rates are re-measured all the time from what the sockets
//!   have delivered (`TIOCOUTQ`), so the split follows the paths as they
//!   are now. `TCP_NOTSENT_LOWAT` keeps each socket's unsent backlog short,
//!   so those queue lengths are what the kernel really still has to send.
//!   A message of one chunk goes on stream 0 when nothing is queued.
//! - The receiver places each chunk at its offset, wherever it arrives. A
//!   stream's next frame may already belong to the peer's next message (it
//!   finished its share of this one while another stream still carries the
//!   rest): its header is read and kept ("stashed"), and that stream waits
//!   until the receive of that message starts.
//! - **failover** (several paths; see `multipath.rs`): the link keeps a copy
//!   of each chunk until the peer's kernel acknowledges it; a path whose
//!   peer stops answering, or that errs, goes down, and its unacknowledged
//!   chunks go again on the others (flagged [`FLAG_RESENT`]). Receivers
//!   drop second copies and read later messages' frames ahead ("park")
//!   when the chunks they wait for may be queued behind them. A path that
//!   was only silent comes back once it has delivered what it held.
//!
//! Sockets are non-blocking; the engine calls `*_progress` and, when nothing
//! moves, waits in `poll(2)` on the streams it needs.
//!
//! The files follow the layers a byte goes through, so that each can be
//! read (and the decisions tested) alone:
//! - `frame.rs`: what travels on a stream (headers, control frames); no I/O.
//! - `send.rs`, `recv.rs`, `park.rs`: the send path, the receive path, and
//!   the receiver's reading ahead after a path failed.
//! - `multipath.rs`: every multipath decision (rates, which stream takes a
//!   chunk, path failure, resending, failback) as a state machine that does
//!   no I/O and is handed the time, tested on simulated time;
//!   `multipath_io.rs` feeds it what the kernel says. `rate.rs`: one
//!   stream's rate estimate, which it uses.
//! - `holds.rs`: streams the path planner holds down (an uplink they cross
//!   is cut), applied to the multipath state.
//! - `socket.rs`: socket options and the other kernel calls (all `unsafe`).
//! - `setup.rs`: connecting and authenticating the streams.

mod dial;
mod frame;
mod holds;
mod multipath;
mod multipath_io;
mod park;
mod rate;
mod recv;
mod send;
pub mod setup;
mod socket;

pub use frame::{nchunks, TcpHeader, CHUNK_BYTES, FLAG_RESENT, TCP_HEADER_BYTES};
pub use holds::{Hold, PathHolds};
pub use multipath::PATH_TIMEOUT;
pub use socket::poll_fds;

use super::{LinkCounters, StallNotice};
use crate::error::ErrorKind;
use frame::ControlIn;
use multipath::Multipath;
use park::Parking;
use recv::RxState;
use send::TxChunk;
use socket::{io_error, keep_through_outages, set_notsent_lowat, NOTSENT_LOWAT};
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// All streams to one peer.
pub struct TcpLink {
    pub peer: usize,
    streams: Vec<TcpStream>,
    /// Per stream: the chunk being written, if any.
    tx: Vec<Option<TxChunk>>,
    /// Number of the next message this link sends.
    tx_msg: u32,
    /// Per stream: where its incoming bytes stand.
    rx: Vec<RxState>,
    /// Number of the next message this link receives.
    rx_msg: u32,
    /// Per stream: a reducing receive's chunk, staged whole before it is
    /// reduced (a chunk cut off by a failing path is never half-applied).
    staging: Vec<Vec<u8>>,
    /// Control frames (stall notices) waiting to go on the control stream
    /// ([`Multipath::ctl_stream`]), whole frames only, and how many of
    /// their bytes are written. A chunk starts on that stream only once
    /// this is empty, and a control frame only between chunks, so neither
    /// is ever spliced into the other.
    tx_ctl: Vec<u8>,
    tx_ctl_done: usize,
    /// Per stream: a control frame whose header has arrived and whose
    /// payload is being read (non-blocking, like everything else).
    rx_ctl: Vec<Option<ControlIn>>,
    /// The last stall notice the peer sent.
    pub stall: Option<StallNotice>,
    /// Receiver: the peer has sent a chunk again (copies that arrive twice
    /// are then expected and dropped, not garbage).
    rx_resent: bool,
    /// Receiver: frames of later messages read ahead (see `park.rs`).
    parked: Parking,
    /// Paths, rates and failover (see `multipath.rs`); boxed, as it is
    /// large and touched off the hot path mostly.
    multipath: Box<Multipath>,
    /// The rank's table of streams held down by the path planner, when the
    /// job has one (see `holds.rs`).
    holds: Option<holds::Following>,
    /// Prefix of log lines ("cadence rank 3"); `None`: no log lines.
    log_as: Option<String>,
    pub stats: Arc<LinkCounters>,
}

impl TcpLink {
    /// A link over `streams`, stream s running on path s % `npaths`.
    pub fn new(peer: usize, streams: Vec<TcpStream>, npaths: usize) -> io::Result<TcpLink> {
        let npaths = npaths.clamp(1, streams.len().max(1));
        for s in &streams {
            s.set_nonblocking(true)?;
            set_notsent_lowat(s, NOTSENT_LOWAT)?;
        }
        let n = streams.len();
        Ok(TcpLink {
            peer,
            streams,
            tx: (0..n).map(|_| None).collect(),
            tx_msg: 0,
            rx: (0..n).map(|_| RxState::idle()).collect(),
            rx_msg: 0,
            staging: vec![Vec::new(); n],
            tx_ctl: Vec::new(),
            tx_ctl_done: 0,
            rx_ctl: (0..n).map(|_| None).collect(),
            stall: None,
            rx_resent: false,
            parked: Parking::default(),
            multipath: Box::new(Multipath::new(peer, n, npaths, Instant::now())),
            holds: None,
            log_as: None,
            stats: LinkCounters::with_paths(peer, "tcp", npaths),
        })
    }

    /// Sets how long a path may hold bytes while its peer answers nothing
    /// before it counts as down, the peer's host and the paths' names (one
    /// per path) for log lines and errors, and where log lines go (`None`:
    /// nowhere).
    ///
    /// With several paths it also tunes the streams' retransmission so that
    /// a path that comes back is found within about a second and a cut path
    /// stays a connection (see `socket::keep_through_outages`).
    pub fn set_failover(
        &mut self,
        timeout: Duration,
        peer_host: &str,
        names: Vec<String>,
        log_as: Option<String>,
    ) {
        self.multipath.configure(timeout, peer_host, names);
        self.log_as = log_as;
        if self.multipath.on() {
            for s in &self.streams {
                keep_through_outages(s);
            }
        }
    }

    /// Whether the link has several paths (and so fails over).
    pub fn multipath(&self) -> bool {
        self.multipath.on()
    }

    fn io_err(&self, e: io::Error) -> ErrorKind {
        io_error(self.peer, e)
    }

    fn closed(&self) -> ErrorKind {
        ErrorKind::PeerClosed {
            peer: self.peer,
            detail: "end of stream".into(),
        }
    }

    fn garbage(&self, detail: String) -> ErrorKind {
        ErrorKind::Garbage {
            peer: self.peer,
            detail,
        }
    }

    /// Each stream's local address (its NIC), where known.
    pub fn local_ips(&self) -> Vec<Option<std::net::IpAddr>> {
        self.streams
            .iter()
            .map(|s| s.local_addr().ok().map(|a| a.ip()))
            .collect()
    }

    /// Says which path each stream really runs on (at set-up, a stream
    /// whose own path did not connect runs on another). A path left with
    /// no stream starts down for good, with the reason given in `why` (or
    /// "no stream connected on it"); returns those paths.
    pub fn place_streams(&mut self, path_of: Vec<usize>, why: &[(usize, String)]) -> Vec<usize> {
        let empty = self
            .multipath
            .place_streams(path_of, why, self.tx_ctl_done > 0);
        for &p in &empty {
            self.stats.paths[p].down.set(1);
        }
        empty
    }

    fn log(&self, line: String) {
        if let Some(who) = &self.log_as {
            stderr_line!("{who}: WARN {line}");
        }
    }

    /// File descriptors of every stream.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.streams.iter().map(|s| s.as_raw_fd())
    }

    /// The streams a transfer still waits on. A sender waits on the streams
    /// writing a chunk (the next chunk goes to one of them or to a free
    /// stream at once), and on the control stream while control bytes
    /// wait. A receiver waits on every stream not holding a later message's
    /// header and not closed. A stream with nothing to do for the transfer
    /// must not be polled: it is writable (or holds the next message) at
    /// once, and poll(2) would return at once until the slowest stream ends
    /// — a spin that takes cores from the kernel's network work.
    pub fn waiting_fds<'a>(
        &'a self,
        is_send: bool,
        started: bool,
    ) -> impl Iterator<Item = RawFd> + 'a {
        self.streams.iter().enumerate().filter_map(move |(i, s)| {
            let waits = !started
                || if is_send {
                    (self.tx[i].is_some() && self.multipath.stream_up(i))
                        || (i == self.multipath.ctl_stream() && !self.tx_ctl.is_empty())
                } else {
                    !matches!(self.rx[i], RxState::Stashed { .. } | RxState::Closed)
                };
            waits.then(|| s.as_raw_fd())
        })
    }

    /// Test hook: writes bytes that are not a frame on stream 0.
    pub fn inject_garbage(&mut self) -> io::Result<()> {
        let _ = self.streams[0].set_nonblocking(false);
        let r = self.streams[0].write_all(&[0xAB; 256]);
        let _ = self.streams[0].set_nonblocking(true);
        r
    }
}
