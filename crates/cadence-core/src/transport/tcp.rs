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
//!   [`WireHeader`] plus the message's number on the link and the chunk's
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
//! - **failover** (several paths; see `Failover`): the link keeps a copy
//!   of each chunk until the peer's kernel acknowledges it; a path whose
//!   peer stops answering, or that errs, goes down, and its unacknowledged
//!   chunks go again on the others (flagged [`FLAG_RESENT`]). Receivers
//!   drop second copies and read later messages' frames ahead ("park")
//!   when the chunks they wait for may be queued behind them. A path that
//!   was only silent comes back once it has delivered what it held.
//!
//! Sockets are non-blocking; the engine calls `*_progress` and, when nothing
//! moves, waits in `poll(2)` on the streams it needs. Streams are set up (and
//! authenticated) in `tcp_setup.rs`.

use super::{
    check_data_frame, AbortNotice, ChunkCursor, LinkCounters, RecvJob, SendJob, Source,
    StallNotice, WireHeader, ABORT_TEXT_MAX, FRAME_ABORT, FRAME_STALL, MAGIC, STALL_CHAIN_MAX,
};
use crate::error::ErrorKind;
use bytemuck::{Pod, Zeroable};
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes per chunk. Large enough that a header per chunk costs nothing
/// (64 bytes in 64 KiB), small enough that a ring step's 1 MiB slice is 16
/// chunks to spread over the paths in proportion to their rates. Every
/// element size divides it, so chunks hold whole elements. Messages below
/// it travel whole, as one frame.
pub const CHUNK_BYTES: usize = 64 * 1024;
/// How often a stream's delivery rate is sampled (at most).
const RATE_SAMPLE: Duration = Duration::from_millis(2);
/// How far back the published rate looks (see [`TxRate::published_bps`]).
const PUBLISHED_WINDOW: Duration = Duration::from_secs(1);
/// Weight of a new rate sample in the running estimate.
const RATE_GAIN: f64 = 0.3;
/// A rate estimate this old counts double, and so on (see
/// [`TxRate::planning_bps`]).
const RATE_STALE: Duration = Duration::from_millis(250);
/// Unsent bytes a socket may hold before it stops taking more
/// (`TCP_NOTSENT_LOWAT`): what a stream keeps ready beyond what its
/// congestion window has in flight. Bounds how long a slow path holds the
/// last chunks of a message.
const NOTSENT_LOWAT: usize = 128 * 1024;
/// Longest payload of a stall notice: its chain of u32 ranks.
const STALL_PAYLOAD_MAX: usize = STALL_CHAIN_MAX * 4;

/// Leads every frame on a TCP stream: the common header, then what only a
/// multi-stream transport needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq, Eq)]
pub struct TcpHeader {
    pub base: WireHeader,
    /// The message's number on this link and direction (wrapping); 0 on
    /// control frames.
    pub msg: u32,
    /// [`FLAG_RESENT`] or 0.
    pub flags: u32,
    /// Byte offset of this chunk in its message.
    pub off: u64,
}

pub const TCP_HEADER_BYTES: usize = std::mem::size_of::<TcpHeader>();

impl TcpHeader {
    /// A control frame's header (no message, no offset).
    pub fn control(base: WireHeader) -> TcpHeader {
        TcpHeader {
            base,
            ..Default::default()
        }
    }
}

/// How many chunks a message of `total` bytes travels as (a 0-byte message
/// still sends one frame: its header is the signal).
pub fn nchunks(total: usize) -> usize {
    total.div_ceil(CHUNK_BYTES).max(1)
}

/// All streams to one peer.
pub struct TcpLink {
    pub peer: usize,
    streams: Vec<TcpStream>,
    /// Per stream: the chunk being written, if any.
    tx: Vec<Option<TxChunk>>,
    /// Per stream: what it has delivered and how fast (see [`TxRate`]).
    rate: Vec<TxRate>,
    /// Number of the next message this link sends.
    tx_msg: u32,
    /// Per stream: where its incoming bytes stand.
    rx: Vec<RxState>,
    /// Number of the next message this link receives.
    rx_msg: u32,
    /// Per stream: a reducing receive's chunk, staged whole before it is
    /// reduced (a chunk cut off by a failing path is never half-applied).
    staging: Vec<Vec<u8>>,
    /// Control frames (stall notices) waiting to go on `ctl_stream`, whole
    /// frames only, and how many of their bytes are written. A chunk starts
    /// on that stream only once this is empty, and a control frame only
    /// between chunks, so neither is ever spliced into the other.
    tx_ctl: Vec<u8>,
    tx_ctl_done: usize,
    ctl_stream: usize,
    /// Per stream: a control frame whose header has arrived and whose
    /// payload is being read (non-blocking, like everything else).
    rx_ctl: Vec<Option<CtlIn>>,
    /// The last stall notice the peer sent.
    pub stall: Option<StallNotice>,
    /// Paths, and the one each stream runs on (s % npaths unless set by
    /// [`TcpLink::place_streams`]).
    npaths: usize,
    path_of: Vec<usize>,
    /// Failover (only with several paths; see [`Failover`]); boxed, as it
    /// is large and touched off the hot path mostly.
    fo: Box<Failover>,
    pub stats: Arc<LinkCounters>,
}

/// What a link with several paths keeps so that no chunk is lost when a
/// path fails: copies of the chunks the peer's kernel has not yet
/// acknowledged, each path's state, and (receiving) frames of later
/// messages read ahead of the chunks sent again.
struct Failover {
    /// Whether failover is on (several paths).
    on: bool,
    /// Per stream: frames written whose last byte the peer's kernel has not
    /// acknowledged yet, oldest first.
    unacked: Vec<VecDeque<Copy>>,
    /// Chunks to write again on a path that works, oldest message first.
    resend: VecDeque<Copy>,
    /// Chunk buffers to reuse.
    spare: Vec<Vec<u8>>,
    paths: Vec<PathState>,
    /// No delivery for this long, with the kernel retrying: the path is
    /// down (`CADENCE_PATH_TIMEOUT`).
    timeout: Duration,
    /// "10.0.1.2 -> 10.0.1.3" per path, and the peer's host, for log lines
    /// and errors.
    names: Vec<String>,
    peer_host: String,
    /// Prefix of log lines ("cadence rank 3"); `None`: no log lines.
    log_as: Option<String>,
    last_check: Instant,
    /// Receiver: the peer has sent a chunk again (copies that arrive twice
    /// are then expected and dropped, not garbage).
    rx_resent: bool,
    /// Receiver: frames of later messages read ahead (see `park`), and
    /// their bytes.
    parked: Vec<(TcpHeader, Vec<u8>)>,
    parked_bytes: usize,
    /// Receiver: the message whose receive reads later frames ahead.
    parking_for: Option<u32>,
}

/// A chunk's frame, with its own copy of the payload.
struct Copy {
    /// Stream position just past the frame (unacked frames only).
    end: u64,
    hdr: TcpHeader,
    data: Vec<u8>,
}

/// One path's state.
struct PathState {
    up: bool,
    /// Failed with an error (reset, broken pipe): never comes back (taking
    /// it back would need a new connection).
    dead: bool,
    /// Why it went down.
    reason: String,
    /// Down: per stream of the path, the stream position its kernel must
    /// deliver before the path counts as working again.
    probe: Vec<(usize, u64)>,
    since: Instant,
}

/// Header flag: the chunk is sent again, after the path that carried it
/// first failed. A copy may then arrive twice.
pub const FLAG_RESENT: u32 = 1;
/// Default for `CADENCE_PATH_TIMEOUT`.
pub const PATH_TIMEOUT: Duration = Duration::from_secs(2);
/// Later messages' bytes a receiver reads ahead, per link, while it waits
/// for chunks sent again (see [`TcpLink::park`]).
const PARK_MAX: usize = 512 << 20;
/// A later message's frame that has waited this long while the message
/// being received stays incomplete is read ahead (parked), since the
/// chunks that complete it may be queued behind it.
const PARK_AFTER: Duration = Duration::from_millis(100);
/// Longest wait between retransmissions on a stream of a link with several
/// paths (`TCP_RTO_MAX_MS`, Linux 6.15+; the kernel's default is 120 s).
const RTO_MAX: Duration = Duration::from_secs(1);
/// `TCP_RTO_MAX_MS` from `linux/tcp.h` (not in the libc crate yet).
const TCP_RTO_MAX_MS: libc::c_int = 44;
/// How long a stream of a link with several paths may go without an
/// acknowledgement before the kernel drops the connection
/// (`TCP_USER_TIMEOUT`): a cut path stays a connection that can come back.
const OUTAGE_MAX: Duration = Duration::from_secs(600);
/// How often paths are checked for failure and recovery (at most).
const PATH_CHECK: Duration = Duration::from_millis(1);

/// What one stream has delivered to the peer, and its measured rate.
#[derive(Clone, Debug)]
struct TxRate {
    /// Bytes (headers included) written to the socket, ever.
    written: u64,
    /// Bytes the kernel still holds (unsent or unacknowledged), as last
    /// read.
    queued: u64,
    /// At the last sample: delivered bytes (written - queued), the time,
    /// and whether the stream had bytes queued.
    delivered: u64,
    at: Instant,
    backlogged: bool,
    /// Bytes per second; 0 until measured.
    bps: f64,
    /// When `bps` last rested on a sample.
    measured_at: Instant,
    /// When the stream last delivered a byte or had nothing queued, and
    /// what it had delivered then (failure detection).
    progress_at: Instant,
    progress_mark: u64,
    /// Bytes delivered and seconds spent while backlogged, recent ones
    /// weighing most (see [`TxRate::published_bps`]).
    busy_bytes: f64,
    busy_secs: f64,
}

/// Bytes the kernel still holds for a socket: not yet sent, or sent and not
/// yet acknowledged by the peer (`TIOCOUTQ`).
fn queued_bytes(s: &TcpStream) -> u64 {
    let mut v: libc::c_int = 0;
    // SAFETY: FFI call on a socket descriptor `s` owns and keeps open;
    // TIOCOUTQ writes one c_int to the valid, exclusively borrowed `v`.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut v as *mut libc::c_int) };
    if rc == 0 {
        v.max(0) as u64
    } else {
        0
    }
}

impl TxRate {
    fn new() -> TxRate {
        let now = Instant::now();
        TxRate {
            written: 0,
            queued: 0,
            delivered: 0,
            at: now,
            backlogged: false,
            bps: 0.0,
            measured_at: now,
            progress_at: now,
            progress_mark: 0,
            busy_bytes: 0.0,
            busy_secs: 0.0,
        }
    }

    /// The delivery rate the counters show: bytes over time while the
    /// stream was backlogged, over about the last [`PUBLISHED_WINDOW`] of
    /// such time. Steadier than `bps`, whose short samples follow bursts
    /// of acknowledgements (fine for choosing the next chunk's stream, not
    /// for a figure a user reads).
    fn published_bps(&self) -> f64 {
        if self.busy_secs > 0.0 {
            self.busy_bytes / self.busy_secs
        } else {
            0.0
        }
    }

    /// Bytes the peer's kernel has acknowledged, as last read.
    fn acked(&self) -> u64 {
        self.written - self.queued
    }

    /// Reads the socket's queue and, at most every [`RATE_SAMPLE`], folds
    /// what it delivered since the last sample into the rate. Only a stream
    /// that had bytes queued from start to end of the interval shows its
    /// rate; one that ran dry delivered all it had, faster than it seems, so
    /// its sample can only raise an estimate, never start one (a 48-byte
    /// barrier message over an idle millisecond is no measure of a path).
    fn sample(&mut self, sock: &TcpStream, now: Instant) {
        self.queued = queued_bytes(sock).min(self.written);
        if self.queued == 0 || self.acked() > self.progress_mark {
            self.progress_at = now;
            self.progress_mark = self.acked();
        }
        let dt = now.duration_since(self.at);
        if dt < RATE_SAMPLE {
            return;
        }
        let delivered = self.written - self.queued;
        let inst = delivered.saturating_sub(self.delivered) as f64 / dt.as_secs_f64();
        if self.backlogged && self.queued > 0 {
            // The published rate: bytes over time while backlogged, with
            // older intervals fading over about a second.
            let fade = (-dt.as_secs_f64() / PUBLISHED_WINDOW.as_secs_f64()).exp();
            self.busy_bytes = self.busy_bytes * fade + inst * dt.as_secs_f64();
            self.busy_secs = self.busy_secs * fade + dt.as_secs_f64();
            self.bps = if self.bps == 0.0 {
                inst
            } else {
                self.bps + RATE_GAIN * (inst - self.bps)
            };
            self.measured_at = now;
        } else if self.backlogged && self.bps > 0.0 && inst > self.bps {
            // Smoothed too: a burst of acknowledgements (delayed ACKs, a
            // shaper's bucket) can make one short interval look far faster
            // than the path.
            self.bps += RATE_GAIN * (inst - self.bps);
            self.measured_at = now;
        }
        self.delivered = delivered;
        self.at = now;
        self.backlogged = self.queued > 0;
    }

    /// The rate to plan with: the estimate, doubled for every
    /// [`RATE_STALE`] without a sample. A path that gets no chunks because
    /// it measured slow is thus offered one now and then, and a path that
    /// has recovered is found again. `None` until first measured.
    fn planning_bps(&self, now: Instant) -> Option<f64> {
        if self.bps == 0.0 {
            return None;
        }
        let stale = now.duration_since(self.measured_at).as_secs_f64() / RATE_STALE.as_secs_f64();
        Some(self.bps * 2f64.powf(stale.floor().min(30.0)))
    }
}

/// A chunk being written on one stream.
struct TxChunk {
    hdr: TcpHeader,
    /// Header bytes written so far (of TCP_HEADER_BYTES).
    hdr_done: usize,
    /// Payload bytes written so far.
    done: usize,
    /// The payload, when the link keeps its own copy (failover on): the
    /// chunk may then outlive its send, and be sent again.
    copy: Option<Vec<u8>>,
}

/// Where one stream's incoming bytes stand.
enum RxState {
    /// Between frames: the next header, `done` bytes of it so far.
    Header {
        buf: [u8; TCP_HEADER_BYTES],
        done: usize,
    },
    /// Inside a chunk of the message being received.
    Chunk(RxChunk),
    /// The next frame belongs to a later message; its header, read and
    /// checked for sanity, waits here until that message's receive starts
    /// (or, failover on, until it is read ahead: see [`TcpLink::park`]).
    Stashed { hdr: TcpHeader, at: Instant },
    /// The peer closed the stream between frames. Not an error by itself:
    /// a peer that sent everything and closed may have left the last
    /// message on another stream.
    Closed,
}

impl RxState {
    fn idle() -> RxState {
        RxState::Header {
            buf: [0; TCP_HEADER_BYTES],
            done: 0,
        }
    }
}

struct RxChunk {
    hdr: TcpHeader,
    index: usize,
    off: usize,
    len: usize,
    done: usize,
    to: Into,
}

/// Where a chunk's payload goes as it is read.
enum Into {
    /// Straight into the receive's destination (copying receives).
    Sink,
    /// Into the stream's staging buffer, applied whole at the end
    /// (reducing receives).
    Stage,
    /// Read and dropped: a second copy, or the rest of a chunk whose
    /// message is complete.
    Discard,
    /// Into a buffer kept until that (later) message's receive starts.
    Park(Vec<u8>),
}

/// What reading a stream's next header came to.
enum HeaderStep {
    /// Incomplete: the socket has no more now (`moved`: some bytes came).
    Blocked { moved: bool },
    /// The peer closed the stream between frames.
    Closed,
    /// A control frame's header; its payload is to be read next.
    Control,
    /// A data frame's header.
    Data(TcpHeader),
}

/// A control frame being received: its header and the payload so far.
struct CtlIn {
    hdr: WireHeader,
    payload: Vec<u8>,
}

/// What a finished control frame means for the receive in progress.
enum Ctl {
    /// Noted (a stall notice); go on reading frames.
    Noted,
    /// The peer failed.
    Abort(AbortNotice),
}

/// Checks a control frame's header before its payload is read: the length
/// must be what that kind of frame can carry, or the stream is garbage.
fn control_payload_len(h: &WireHeader, peer: usize) -> Result<usize, ErrorKind> {
    let max = match h.frame {
        FRAME_STALL => STALL_PAYLOAD_MAX,
        FRAME_ABORT => ABORT_TEXT_MAX,
        _ => unreachable!("only control frames are checked here"),
    };
    if h.len > max as u64 || (h.frame == FRAME_STALL && !h.len.is_multiple_of(4)) {
        return Err(ErrorKind::Garbage {
            peer,
            detail: format!(
                "control frame {} with a {}-byte payload (at most {max})",
                h.frame, h.len
            ),
        });
    }
    Ok(h.len as usize)
}

/// Interprets a complete control frame.
fn decode_control(c: CtlIn) -> (Ctl, Option<StallNotice>) {
    let h = c.hdr;
    match h.frame {
        FRAME_ABORT => (
            // The header carries the blamed rank in `root` and, for
            // mismatches (`redop == 1`), the blamed signature in `seq`, the
            // detector's in `sig` and the detector's rank in `count`.
            Ctl::Abort(AbortNotice {
                origin: h.root as usize,
                detail: String::from_utf8_lossy(&c.payload).into_owned(),
                mismatch: (h.redop == 1).then_some((h.seq, h.count as usize, h.sig)),
            }),
            None,
        ),
        _ => {
            let chain = c
                .payload
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (Ctl::Noted, Some(StallNotice { seq: h.seq, chain }))
        }
    }
}

/// Whether message number `msg` comes after `current` (wrapping: up to half
/// the number space ahead).
fn is_later(msg: u32, current: u32) -> bool {
    let d = msg.wrapping_sub(current);
    d != 0 && d <= u32::MAX / 2
}

/// Sets `TCP_NOTSENT_LOWAT` on a socket (see [`NOTSENT_LOWAT`]).
fn set_notsent_lowat(s: &TcpStream, bytes: usize) -> io::Result<()> {
    set_tcp_option(s, libc::TCP_NOTSENT_LOWAT, bytes as libc::c_int)
}

/// Sets an `IPPROTO_TCP` option whose value is an int.
fn set_tcp_option(s: &TcpStream, option: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: FFI call on a socket descriptor `s` owns and keeps open; the
    // option value is a valid c_int whose size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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
        let now = Instant::now();
        Ok(TcpLink {
            peer,
            streams,
            tx: (0..n).map(|_| None).collect(),
            rate: (0..n).map(|_| TxRate::new()).collect(),
            tx_msg: 0,
            rx: (0..n).map(|_| RxState::idle()).collect(),
            rx_msg: 0,
            staging: vec![Vec::new(); n],
            tx_ctl: Vec::new(),
            tx_ctl_done: 0,
            ctl_stream: 0,
            rx_ctl: (0..n).map(|_| None).collect(),
            stall: None,
            npaths,
            path_of: (0..n).map(|s| s % npaths).collect(),
            fo: Box::new(Failover {
                on: npaths > 1,
                unacked: (0..n).map(|_| VecDeque::new()).collect(),
                resend: VecDeque::new(),
                spare: Vec::new(),
                paths: (0..npaths)
                    .map(|_| PathState {
                        up: true,
                        dead: false,
                        reason: String::new(),
                        probe: Vec::new(),
                        since: now,
                    })
                    .collect(),
                timeout: PATH_TIMEOUT,
                names: (0..npaths).map(|p| format!("path {p}")).collect(),
                peer_host: String::new(),
                log_as: None,
                last_check: now,
                rx_resent: false,
                parked: Vec::new(),
                parked_bytes: 0,
                parking_for: None,
            }),
            stats: LinkCounters::with_paths(peer, "tcp", npaths),
        })
    }

    /// Sets how long a path may hold bytes while its peer answers nothing
    /// before it counts as down, the peer's host and the paths' names (one
    /// per path) for log lines and errors, and where log lines go (`None`:
    /// nowhere).
    ///
    /// With several paths it also tunes the streams' retransmission (best
    /// effort: older kernels lack the options): the kernel retries at least
    /// every [`RTO_MAX`], so a path that comes back is found within about
    /// that long, and keeps a connection whose path is cut for up to
    /// [`OUTAGE_MAX`] instead of the 15 retries (~15 min by default, but
    /// ~13 s with the shorter retry interval) after which it would give up.
    pub fn set_failover(
        &mut self,
        timeout: Duration,
        peer_host: &str,
        names: Vec<String>,
        log_as: Option<String>,
    ) {
        self.fo.peer_host = peer_host.to_string();
        self.fo.timeout = timeout;
        if names.len() == self.npaths {
            self.fo.names = names;
        }
        self.fo.log_as = log_as;
        if self.fo.on {
            for s in &self.streams {
                let _ = set_tcp_option(s, TCP_RTO_MAX_MS, RTO_MAX.as_millis() as libc::c_int);
                let _ = set_tcp_option(
                    s,
                    libc::TCP_USER_TIMEOUT,
                    OUTAGE_MAX.as_millis() as libc::c_int,
                );
            }
        }
    }

    /// Whether the link has several paths (and so fails over).
    pub fn multipath(&self) -> bool {
        self.fo.on
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

    /// Whether a frame is partly written on stream `s` (a control frame
    /// must not be spliced into it).
    fn tx_mid_frame(&self, s: usize) -> bool {
        self.tx[s].as_ref().is_some_and(|c| c.hdr_done > 0)
    }

    /// The streams of path `p`.
    fn streams_of(&self, p: usize) -> Vec<usize> {
        (0..self.streams.len())
            .filter(|&s| self.path_of[s] == p)
            .collect()
    }

    /// Whether stream `s`'s path carries chunks.
    fn stream_up(&self, s: usize) -> bool {
        self.fo.paths[self.path_of[s]].up
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
        assert_eq!(path_of.len(), self.streams.len());
        self.path_of = path_of;
        let mut empty = Vec::new();
        for p in 0..self.npaths {
            if !self.path_of.contains(&p) {
                let st = &mut self.fo.paths[p];
                st.up = false;
                st.dead = true;
                st.reason = why
                    .iter()
                    .find(|(q, _)| *q == p)
                    .map_or_else(|| "no stream connected on it".into(), |(_, w)| w.clone());
                self.stats.paths[p].down.set(1);
                empty.push(p);
            }
        }
        if self.tx_ctl_done == 0 && !self.stream_up(self.ctl_stream) {
            if let Some(s) = (0..self.streams.len()).find(|&s| self.stream_up(s)) {
                self.ctl_stream = s;
            }
        }
        empty
    }

    fn log(&self, line: String) {
        if let Some(who) = &self.fo.log_as {
            stderr_line!("{who}: WARN {line}");
        }
    }

    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        let total = job.src.len();
        if !job.started {
            job.tcp = ChunkCursor {
                msg: self.tx_msg,
                nchunks: nchunks(total),
                ..Default::default()
            };
            self.tx_msg = self.tx_msg.wrapping_add(1);
            job.started = true;
        }
        let mut progressed = false;
        if !self.tx_ctl.is_empty() {
            // A control frame goes first on its stream, between chunks.
            progressed |= self.flush_ctl()?;
        }
        progressed |= self.pump(Some(job))?;
        if !job.tcp.unassigned() && self.tx_idle() {
            job.done = true;
            self.stats.msgs_sent.add(1);
        }
        Ok(progressed)
    }

    /// Whether nothing is being written: no chunk under way on a working
    /// path, none waiting to go again.
    fn tx_idle(&self) -> bool {
        self.fo.resend.is_empty()
            && (0..self.streams.len()).all(|s| self.tx[s].is_none() || !self.stream_up(s))
    }

    /// Writes on every working stream as far as the sockets take it:
    /// first chunks to send again (a path failed), then `job`'s next
    /// chunks, each on the stream expected to deliver it first.
    fn pump(&mut self, mut job: Option<&mut SendJob>) -> Result<bool, ErrorKind> {
        // Queues and rates are read once per call, and only when a free
        // stream has to decide whether the next chunk is its own.
        let multi = self.streams.len() > 1;
        let mut sampled = false;
        let mut progressed = false;
        for s in 0..self.streams.len() {
            if !self.stream_up(s) {
                continue;
            }
            loop {
                if self.tx[s].is_none() {
                    if s == self.ctl_stream && !self.tx_ctl.is_empty() {
                        break;
                    }
                    if let Some(mut c) = self.fo.resend.pop_front() {
                        c.hdr.flags |= FLAG_RESENT;
                        self.tx[s] = Some(TxChunk {
                            hdr: c.hdr,
                            hdr_done: 0,
                            done: 0,
                            copy: Some(c.data),
                        });
                    } else {
                        let Some(job) = job.as_deref_mut() else {
                            break;
                        };
                        if !job.tcp.unassigned() {
                            break;
                        }
                        let index = job.tcp.next;
                        let off = index * CHUNK_BYTES;
                        let len = CHUNK_BYTES.min(job.src.len() - off);
                        if multi {
                            if !sampled {
                                self.sample_rates();
                                sampled = true;
                            }
                            if self.first_to_finish(len) != s {
                                break;
                            }
                        }
                        job.tcp.next += 1;
                        // With failover on, the link keeps its own copy:
                        // the send completes when its chunks are written,
                        // and the caller may then reuse its buffer while a
                        // chunk may still have to go again.
                        let copy = self.fo.on.then(|| {
                            let mut v = self.fo.spare.pop().unwrap_or_default();
                            v.clear();
                            v.extend_from_slice(job.src.bytes(off, len));
                            v
                        });
                        self.tx[s] = Some(TxChunk {
                            hdr: TcpHeader {
                                base: job.meta.header(len),
                                msg: job.tcp.msg,
                                flags: 0,
                                off: off as u64,
                            },
                            hdr_done: 0,
                            done: 0,
                            copy,
                        });
                    }
                }
                // Whether the chunk is the send's own (not a copy going
                // again, nor the rest of an earlier send's chunk): only
                // those count as the send's progress.
                let own = job.as_deref().is_some_and(|j| {
                    self.tx[s]
                        .as_ref()
                        .is_some_and(|c| c.hdr.msg == j.tcp.msg && c.hdr.flags & FLAG_RESENT == 0)
                });
                match self.write_chunk(s, job.as_deref().map(|j| &j.src)) {
                    Ok(None) => break,
                    Ok(Some(n)) => {
                        progressed = true;
                        if let Some(j) = job.as_deref_mut().filter(|_| own) {
                            j.sent += n;
                        }
                    }
                    Err(e) => {
                        let why = self.io_err(e);
                        self.stream_failed(s, why)?;
                        break;
                    }
                }
            }
        }
        Ok(progressed)
    }

    /// Writes what stream `s`'s socket takes of its chunk. `Ok(None)`: it
    /// took nothing (full, or no chunk); else the payload bytes written. A
    /// finished chunk frees the stream (and, failover on, its copy waits
    /// for the peer's kernel to acknowledge it).
    fn write_chunk(&mut self, s: usize, src: Option<&Source>) -> io::Result<Option<usize>> {
        let Some(c) = self.tx[s].as_mut() else {
            return Ok(None);
        };
        let off = c.hdr.off as usize;
        let len = c.hdr.base.len as usize;
        let payload: &[u8] = match (&c.copy, src) {
            (Some(v), _) => &v[c.done..],
            (None, Some(src)) => src.bytes(off + c.done, len - c.done),
            // A chunk without a copy is written only by its own send.
            (None, None) => return Ok(None),
        };
        let stream = &mut self.streams[s];
        let hdr_bytes = bytemuck::bytes_of(&c.hdr);
        let res = loop {
            let r = if c.hdr_done < TCP_HEADER_BYTES {
                stream.write_vectored(&[
                    IoSlice::new(&hdr_bytes[c.hdr_done..]),
                    IoSlice::new(payload),
                ])
            } else {
                stream.write(payload)
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let mut n = match res {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        let h = n.min(TCP_HEADER_BYTES - c.hdr_done);
        c.hdr_done += h;
        let total = n as u64;
        n -= h;
        c.done += n;
        let finished = c.hdr_done == TCP_HEADER_BYTES && c.done == len;
        let r = &mut self.rate[s];
        r.written += total;
        r.queued += total;
        self.stats.bytes_sent.add(n as u64);
        self.stats.paths[self.path_of[s]].bytes_sent.add(n as u64);
        if finished {
            let done = self.tx[s].take().expect("the chunk just written");
            if let Some(data) = done.copy {
                self.fo.unacked[s].push_back(Copy {
                    end: self.rate[s].written,
                    hdr: done.hdr,
                    data,
                });
            }
        }
        Ok(Some(n))
    }

    /// Reads every stream's queue and updates the rates (see
    /// [`TxRate::sample`]) and the per-path rate counters; drops the copies
    /// of chunks the peer's kernel has acknowledged since.
    fn sample_rates(&mut self) {
        let now = Instant::now();
        for (s, (r, sock)) in self.rate.iter_mut().zip(&self.streams).enumerate() {
            r.sample(sock, now);
            let acked = r.acked();
            let q = &mut self.fo.unacked[s];
            while q.front().is_some_and(|c| c.end <= acked) {
                let c = q.pop_front().expect("front exists");
                if self.fo.spare.len() < 64 {
                    self.fo.spare.push(c.data);
                }
            }
        }
        for (p, c) in self.stats.paths.iter().enumerate() {
            let bps: f64 = (0..self.rate.len())
                .filter(|&s| self.path_of[s] == p)
                .map(|s| self.rate[s].published_bps())
                .sum();
            c.rate_bps.set(bps as u64);
        }
    }

    /// The working stream expected to deliver a further `len`-byte chunk
    /// first: what it holds (in the kernel, and the unwritten rest of its
    /// chunk), plus the chunk, over its rate. Streams not measured yet
    /// count at the fastest measured rate (so each gets tried); ties go to
    /// the lowest stream, which keeps small messages on stream 0.
    fn first_to_finish(&self, len: usize) -> usize {
        let now = Instant::now();
        let up = |s: &usize| self.stream_up(*s);
        let fastest = (0..self.rate.len())
            .filter(up)
            .filter_map(|s| self.rate[s].planning_bps(now))
            .fold(0.0, f64::max);
        let mut best = (f64::INFINITY, usize::MAX);
        for s in (0..self.rate.len()).filter(up) {
            let r = &self.rate[s];
            let pending = self.tx[s].as_ref().map_or(0, |c| {
                (TCP_HEADER_BYTES - c.hdr_done) + (c.hdr.base.len as usize - c.done)
            });
            let bytes = (r.queued as usize + pending + len + TCP_HEADER_BYTES) as f64;
            let bps = r.planning_bps(now).unwrap_or(fastest).max(1.0);
            let t = bytes / bps;
            if t < best.0 {
                best = (t, s);
            }
        }
        best.1
    }

    /// Background work of a link with several paths (the engine calls it
    /// between rounds and while it waits): checks the paths for failure
    /// and recovery, and writes what the link itself owns — chunks sent
    /// again, and the rest of chunks whose sends have completed. Returns
    /// whether any byte moved.
    pub fn maintain(&mut self) -> Result<bool, ErrorKind> {
        if !self.fo.on {
            return Ok(false);
        }
        let now = Instant::now();
        if now.duration_since(self.fo.last_check) >= PATH_CHECK {
            self.fo.last_check = now;
            self.sample_rates();
            self.check_paths(now)?;
        }
        let mut moved = false;
        if !self.tx_ctl.is_empty() {
            moved |= self.flush_ctl()?;
        }
        if !self.tx_idle() {
            moved |= self.pump(None)?;
        }
        Ok(moved)
    }

    /// Streams the link's own writes wait on (see [`TcpLink::maintain`]).
    pub fn background_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        let on = self.fo.on;
        self.streams
            .iter()
            .enumerate()
            .filter(move |(s, _)| on && self.tx[*s].is_some() && self.stream_up(*s))
            .map(|(_, sock)| sock.as_raw_fd())
    }

    /// Marks paths down that stopped delivering, and up those that
    /// delivered again.
    fn check_paths(&mut self, now: Instant) -> Result<(), ErrorKind> {
        for p in 0..self.npaths {
            if self.fo.paths[p].up {
                let stuck = self.streams_of(p).into_iter().find(|&s| {
                    let r = &self.rate[s];
                    r.queued > 0
                        && now.duration_since(r.progress_at) >= self.fo.timeout
                        && peer_silent(&self.streams[s], self.fo.timeout)
                });
                if let Some(s) = stuck {
                    let r = &self.rate[s];
                    let why = format!(
                        "no answer for {:.1} s with {} bytes outstanding",
                        now.duration_since(r.progress_at).as_secs_f64(),
                        r.queued
                    );
                    self.path_down(p, why, false)?;
                }
            } else if !self.fo.paths[p].dead {
                let back = self.fo.paths[p]
                    .probe
                    .iter()
                    .all(|&(s, mark)| self.rate[s].acked() >= mark);
                if back {
                    self.path_up(p, now);
                }
            }
        }
        Ok(())
    }

    /// Stream `s` failed with an error. With several paths, its path goes
    /// down for good and its chunks go again on the others; otherwise (or
    /// when no path is left) the error is the link's.
    fn stream_failed(&mut self, s: usize, why: ErrorKind) -> Result<(), ErrorKind> {
        if !self.fo.on {
            return Err(why);
        }
        let p = self.path_of[s];
        self.fo.paths[p].dead = true;
        if !self.fo.paths[p].up {
            for s in self.streams_of(p) {
                self.drop_tx(s);
            }
            return Ok(());
        }
        self.path_down(p, why.to_string(), true)
    }

    /// Stops writing stream `s`'s chunk (its copy is already queued to go
    /// again).
    fn drop_tx(&mut self, s: usize) {
        if let Some(data) = self.tx[s].take().and_then(|c| c.copy) {
            self.fo.spare.push(data);
        }
    }

    /// Takes path `p` out of use: every chunk its streams carry that the
    /// peer's kernel has not acknowledged goes again on the other paths,
    /// oldest message first. Errs when no other path works.
    fn path_down(&mut self, p: usize, why: String, dead: bool) -> Result<(), ErrorKind> {
        let now = Instant::now();
        if !self.fo.paths[p].up {
            return Ok(());
        }
        if !(0..self.npaths).any(|q| q != p && self.fo.paths[q].up) {
            let tried: Vec<String> = (0..self.npaths)
                .map(|q| {
                    let st = &self.fo.paths[q];
                    let reason = if q == p { &why } else { &st.reason };
                    format!("{} ({reason})", self.fo.names[q])
                })
                .collect();
            return Err(ErrorKind::PeerClosed {
                peer: self.peer,
                detail: format!(
                    "no path to it works (host {}): {}",
                    self.fo.peer_host,
                    tried.join("; ")
                ),
            });
        }
        let mut again = Vec::new();
        let mut probe = Vec::new();
        for s in self.streams_of(p) {
            self.rate[s].sample(&self.streams[s], now);
            let acked = self.rate[s].acked();
            for c in self.fo.unacked[s].drain(..) {
                if c.end > acked {
                    again.push(c);
                }
            }
            if let Some(c) = &self.tx[s] {
                if let Some(data) = &c.copy {
                    again.push(Copy {
                        end: 0,
                        hdr: c.hdr,
                        data: data.clone(),
                    });
                }
            }
            if dead {
                self.drop_tx(s);
            }
            if self.rate[s].written > acked {
                probe.push((s, self.rate[s].written));
            }
            self.rate[s].bps = 0.0;
        }
        let bytes: usize = again.iter().map(|c| c.data.len()).sum();
        let chunks = again.len();
        self.fo.resend.extend(again);
        // Oldest message first: the peer waits on it.
        let newest = self.tx_msg;
        self.fo
            .resend
            .make_contiguous()
            .sort_by_key(|c| (std::cmp::Reverse(newest.wrapping_sub(c.hdr.msg)), c.hdr.off));
        let st = &mut self.fo.paths[p];
        st.up = false;
        st.dead = dead;
        st.reason = why.clone();
        st.probe = probe;
        st.since = now;
        let c = &self.stats.paths[p];
        c.down.set(1);
        c.downs.add(1);
        c.resent_bytes.add(bytes as u64);
        if self.tx_ctl_done == 0 && !self.stream_up(self.ctl_stream) {
            self.ctl_stream = (0..self.streams.len())
                .find(|&s| self.stream_up(s))
                .expect("another path works");
        }
        let others: Vec<&str> = (0..self.npaths)
            .filter(|&q| self.fo.paths[q].up)
            .map(|q| self.fo.names[q].as_str())
            .collect();
        self.log(format!(
            "path {} to rank {} is down ({why}); {chunks} chunks ({bytes} bytes) go again on {}",
            self.fo.names[p],
            self.peer,
            others.join(", ")
        ));
        Ok(())
    }

    /// Takes path `p` back: it delivered everything it held when it went
    /// down. Its rates are measured afresh (unknown counts as the fastest,
    /// so it is tried at once).
    fn path_up(&mut self, p: usize, now: Instant) {
        let down_for = now.duration_since(self.fo.paths[p].since).as_secs_f64();
        let st = &mut self.fo.paths[p];
        st.up = true;
        st.reason.clear();
        st.probe.clear();
        for s in self.streams_of(p) {
            let r = &mut self.rate[s];
            r.bps = 0.0;
            r.measured_at = now;
            r.progress_at = now;
        }
        self.stats.paths[p].down.set(0);
        self.log(format!(
            "path {} to rank {} works again (down {down_for:.1} s); it carries chunks again",
            self.fo.names[p], self.peer
        ));
    }

    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        if !job.started {
            let n = nchunks(job.sink.len());
            job.tcp = ChunkCursor {
                msg: self.rx_msg,
                nchunks: n,
                seen: vec![0; n.div_ceil(64)],
                ..Default::default()
            };
            job.started = true;
        }
        let mut progressed = false;
        if !self.fo.parked.is_empty() {
            progressed |= self.take_parked(job)?;
        }
        for s in 0..self.streams.len() {
            if job.tcp.received == job.tcp.nchunks {
                break;
            }
            progressed |= self.recv_stream(s, job)?;
        }
        if job.tcp.received == job.tcp.nchunks {
            self.finish_recv(job);
        } else if self.rx.iter().all(|r| matches!(r, RxState::Closed)) {
            return Err(self.closed());
        } else if !self.fo.on
            && self
                .rx
                .iter()
                .all(|r| matches!(r, RxState::Stashed { .. } | RxState::Closed))
        {
            // Each stream is in order, and every open one's next frame
            // belongs to a later message: the rest of this one can never
            // come. (With several paths it may: sent again behind those
            // frames, which are then read ahead; see `park`.)
            if self.rx.iter().any(|r| matches!(r, RxState::Closed)) {
                return Err(self.closed());
            }
            return Err(self.garbage(format!(
                "every stream went on to a later message while message {} still misses {} of \
                 its {} chunks",
                job.tcp.msg,
                job.tcp.nchunks - job.tcp.received,
                job.tcp.nchunks
            )));
        }
        Ok(progressed)
    }

    /// The receive `job` has every chunk. A copy of one of its chunks still
    /// being read on another stream (sent again, or cut off when its path
    /// failed) is read on into nothing: the destination belongs to the
    /// caller again.
    fn finish_recv(&mut self, job: &mut RecvJob) {
        job.done = true;
        self.rx_msg = self.rx_msg.wrapping_add(1);
        self.stats.msgs_recv.add(1);
        for r in &mut self.rx {
            if let RxState::Chunk(c) = r {
                if c.hdr.msg == job.tcp.msg && matches!(c.to, Into::Sink | Into::Stage) {
                    c.to = Into::Discard;
                }
            }
        }
    }

    /// Applies the read-ahead frames that belong to `job`'s message, and
    /// drops those of messages already complete.
    fn take_parked(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        let mut moved = false;
        let mut i = 0;
        while i < self.fo.parked.len() {
            let msg = self.fo.parked[i].0.msg;
            if is_later(msg, job.tcp.msg) {
                i += 1;
                continue;
            }
            let (h, data) = self.fo.parked.swap_remove(i);
            self.fo.parked_bytes -= data.len();
            if msg != job.tcp.msg {
                continue;
            }
            moved = true;
            let c = self.begin_chunk(&h, job)?;
            if data.len() != c.len {
                return Err(self.garbage(format!(
                    "a {}-byte frame at byte offset {} of message {msg}",
                    data.len(),
                    c.off
                )));
            }
            if !matches!(c.to, Into::Discard) {
                job.sink.deliver(c.off, &data);
                job.got += c.len;
                job.tcp.seen[c.index / 64] |= 1 << (c.index % 64);
                job.tcp.received += 1;
            }
            if job.tcp.received == job.tcp.nchunks {
                break;
            }
        }
        Ok(moved)
    }

    /// Reads the frame whose header waits on stream `s` (a later message's)
    /// into memory, so that what follows it on the stream can be read:
    /// chunks of the message being received that were sent again after a
    /// path failed may be queued behind it.
    fn park(&mut self, s: usize, h: TcpHeader) -> Result<(), ErrorKind> {
        let len = h.base.len as usize;
        if len > CHUNK_BYTES {
            return Err(self.garbage(format!("a {len}-byte chunk (at most {CHUNK_BYTES})")));
        }
        if self.fo.parked_bytes + len > PARK_MAX {
            return Err(self.garbage(format!(
                "more than {} MiB of later messages arrived while message {} is incomplete",
                PARK_MAX >> 20,
                self.rx_msg
            )));
        }
        self.fo.parked_bytes += len;
        self.rx[s] = RxState::Chunk(RxChunk {
            hdr: h,
            index: 0,
            off: 0,
            len,
            done: 0,
            to: Into::Park(vec![0; len]),
        });
        Ok(())
    }

    /// Stream `s` broke while receiving (an error, or its end inside a
    /// frame). With several paths that is its path failing: the peer sends
    /// what it carried again on the others, and the path is not written to
    /// either. Otherwise (or when no path is left) the error is the link's.
    fn lose_stream(&mut self, s: usize, why: ErrorKind) -> Result<(), ErrorKind> {
        if !self.fo.on {
            return Err(why);
        }
        if let RxState::Chunk(RxChunk {
            to: Into::Park(_),
            len,
            ..
        }) = &self.rx[s]
        {
            self.fo.parked_bytes -= len;
        }
        self.rx[s] = RxState::Closed;
        self.rx_ctl[s] = None;
        if self.rx.iter().all(|r| matches!(r, RxState::Closed)) {
            return Err(why);
        }
        self.stream_failed(s, why)
    }

    /// Moves what stream `s` has for the receive `job`.
    fn recv_stream(&mut self, s: usize, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        let mut progressed = false;
        loop {
            if self.rx_ctl[s].is_some() {
                let Some(ctl) = self.read_ctl(s)? else {
                    return Ok(progressed);
                };
                progressed = true;
                self.note_control(ctl, job.meta.sig)?;
                continue;
            }
            match &mut self.rx[s] {
                RxState::Stashed { hdr, at } => {
                    if hdr.msg != job.tcp.msg {
                        // Once one frame is read ahead for this receive,
                        // the rest follow at once: there may be megabytes
                        // of them before the copies sent again.
                        let parking = self.fo.parking_for == Some(job.tcp.msg);
                        if self.fo.on && (parking || at.elapsed() >= PARK_AFTER) {
                            let h = *hdr;
                            self.fo.parking_for = Some(job.tcp.msg);
                            self.park(s, h)?;
                            continue;
                        }
                        return Ok(progressed);
                    }
                    let h = *hdr;
                    let c = self.begin_chunk(&h, job)?;
                    self.rx[s] = RxState::Chunk(c);
                }
                RxState::Closed => return Ok(progressed),
                RxState::Header { .. } => {
                    let h = match self.read_header(s)? {
                        HeaderStep::Blocked { moved } => return Ok(progressed || moved),
                        HeaderStep::Closed => return Ok(true),
                        HeaderStep::Control => {
                            progressed = true;
                            continue;
                        }
                        HeaderStep::Data(h) => h,
                    };
                    progressed = true;
                    if h.msg == job.tcp.msg {
                        let c = self.begin_chunk(&h, job)?;
                        self.rx[s] = RxState::Chunk(c);
                    } else if self.set_aside(s, h, job.tcp.msg)? {
                        return Ok(progressed);
                    }
                }
                RxState::Chunk(c) => {
                    if matches!(c.to, Into::Sink | Into::Stage) && c.hdr.msg != job.tcp.msg {
                        // A message's chunks are only ever read into its own
                        // receive (see `finish_recv`).
                        c.to = Into::Discard;
                    }
                    if c.done == c.len {
                        let RxState::Chunk(c) = std::mem::replace(&mut self.rx[s], RxState::idle())
                        else {
                            unreachable!("matched a chunk");
                        };
                        self.chunk_read(s, c, job);
                        if job.tcp.received == job.tcp.nchunks {
                            return Ok(progressed);
                        }
                        continue;
                    }
                    let remaining = c.len - c.done;
                    let stream = &mut self.streams[s];
                    let stage = &mut self.staging[s];
                    if stage.len() < CHUNK_BYTES {
                        stage.resize(CHUNK_BYTES, 0);
                    }
                    let res = match &mut c.to {
                        Into::Sink => {
                            let dst = job
                                .sink
                                .direct(c.off + c.done, remaining)
                                .expect("copying receives read in place");
                            stream.read(dst)
                        }
                        Into::Stage => stream.read(&mut stage[c.done..c.len]),
                        Into::Discard => stream.read(&mut stage[..remaining.min(CHUNK_BYTES)]),
                        Into::Park(buf) => stream.read(&mut buf[c.done..]),
                    };
                    match res {
                        Ok(0) => {
                            let why = ErrorKind::PeerClosed {
                                peer: self.peer,
                                detail: "end of stream inside a frame".into(),
                            };
                            self.lose_stream(s, why)?;
                            return Ok(true);
                        }
                        Ok(n) => {
                            progressed = true;
                            c.done += n;
                            if matches!(c.to, Into::Sink | Into::Stage) {
                                job.got += n;
                            }
                            self.stats.bytes_recv.add(n as u64);
                            self.stats.paths[self.path_of[s]].bytes_recv.add(n as u64);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progressed),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            let why = self.io_err(e);
                            self.lose_stream(s, why)?;
                            return Ok(true);
                        }
                    }
                }
            }
        }
    }

    /// A chunk's last byte has been read on stream `s`: applies it, unless
    /// a copy of it came first.
    fn chunk_read(&mut self, s: usize, c: RxChunk, job: &mut RecvJob) {
        let bit = 1u64 << (c.index % 64);
        let fresh = c.hdr.msg == job.tcp.msg && job.tcp.seen[c.index / 64] & bit == 0;
        match c.to {
            Into::Sink | Into::Stage if fresh => {
                if matches!(c.to, Into::Stage) {
                    job.sink.deliver(c.off, &self.staging[s][..c.len]);
                }
                job.tcp.seen[c.index / 64] |= bit;
                job.tcp.received += 1;
            }
            Into::Park(data) => self.fo.parked.push((c.hdr, data)),
            _ => {}
        }
    }

    /// Reads stream `s`'s next frame header (the stream is between frames)
    /// as far as the socket has it. A control frame's header sets the
    /// stream up to read its payload; the end of the stream here marks it
    /// closed; the end inside a header, or an error, is the stream lost
    /// (see [`TcpLink::lose_stream`]).
    fn read_header(&mut self, s: usize) -> Result<HeaderStep, ErrorKind> {
        let mut moved = false;
        loop {
            let RxState::Header { buf, done } = &mut self.rx[s] else {
                unreachable!("read_header on a stream inside a frame");
            };
            let lost = match self.streams[s].read(&mut buf[*done..]) {
                Ok(0) if *done == 0 => {
                    self.rx[s] = RxState::Closed;
                    return Ok(HeaderStep::Closed);
                }
                Ok(0) => ErrorKind::PeerClosed {
                    peer: self.peer,
                    detail: "end of stream inside a frame header".into(),
                },
                Ok(n) => {
                    moved = true;
                    *done += n;
                    if *done < TCP_HEADER_BYTES {
                        continue;
                    }
                    let h: TcpHeader = bytemuck::pod_read_unaligned(&buf[..]);
                    self.rx[s] = RxState::idle();
                    if self.take_control(s, &h.base)? {
                        return Ok(HeaderStep::Control);
                    }
                    if h.flags & FLAG_RESENT != 0 {
                        self.fo.rx_resent = true;
                    }
                    return Ok(HeaderStep::Data(h));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(HeaderStep::Blocked { moved })
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => self.io_err(e),
            };
            self.lose_stream(s, lost)?;
            return Ok(HeaderStep::Closed);
        }
    }

    /// If `h` leads a control frame, sets stream `s` up to read its payload
    /// and returns `true`.
    fn take_control(&mut self, s: usize, h: &WireHeader) -> Result<bool, ErrorKind> {
        if h.magic != MAGIC || !matches!(h.frame, FRAME_ABORT | FRAME_STALL) {
            return Ok(false);
        }
        let len = control_payload_len(h, self.peer)?;
        self.rx_ctl[s] = Some(CtlIn {
            hdr: *h,
            payload: Vec::with_capacity(len),
        });
        Ok(true)
    }

    /// Acts on a complete control frame: notes a stall notice, fails on an
    /// abort (`my_sig`: the signature of the call that receives it).
    fn note_control(&mut self, ctl: CtlIn, my_sig: u64) -> Result<(), ErrorKind> {
        match decode_control(ctl) {
            (Ctl::Abort(notice), _) => Err(notice.into_error(my_sig)),
            (Ctl::Noted, Some(stall)) => {
                self.stall = Some(stall);
                Ok(())
            }
            (Ctl::Noted, None) => Ok(()),
        }
    }

    /// A data frame on stream `s` that is not of the message `current`
    /// being received. A later message's header waits there until its
    /// receive starts (returns `true`). An earlier message's frame is a
    /// copy sent again after a path failed, read and dropped, once the peer
    /// is known to have sent copies again; otherwise, like bytes that are
    /// not a frame, it is garbage.
    fn set_aside(&mut self, s: usize, h: TcpHeader, current: u32) -> Result<bool, ErrorKind> {
        check_data_frame(&h.base, self.peer)?;
        if is_later(h.msg, current) {
            self.rx[s] = RxState::Stashed {
                hdr: h,
                at: Instant::now(),
            };
            return Ok(true);
        }
        if self.fo.rx_resent && h.base.len <= CHUNK_BYTES as u64 {
            self.rx[s] = RxState::Chunk(RxChunk {
                hdr: h,
                index: 0,
                off: 0,
                len: h.base.len as usize,
                done: 0,
                to: Into::Discard,
            });
            return Ok(false);
        }
        Err(self.garbage(format!(
            "a frame of message {} arrived while message {current} is received",
            h.msg
        )))
    }

    /// Checks the header of a chunk of the message `job` receives and
    /// returns its cursor. A chunk already received is dropped when it may
    /// be a copy sent again, and is garbage otherwise.
    fn begin_chunk(&self, h: &TcpHeader, job: &RecvJob) -> Result<RxChunk, ErrorKind> {
        let total = job.sink.len();
        let off = h.off;
        let in_range = off.is_multiple_of(CHUNK_BYTES as u64)
            && (off < total as u64 || (total == 0 && off == 0));
        if !in_range {
            // Arguments that differ are reported as such; otherwise the
            // offset is garbage.
            job.meta.check(&h.base, self.peer, h.base.len as usize)?;
            return Err(self.garbage(format!(
                "chunk at byte offset {off} of a {total}-byte message"
            )));
        }
        let off = off as usize;
        let len = CHUNK_BYTES.min(total - off);
        job.meta.check(&h.base, self.peer, len)?;
        let index = off / CHUNK_BYTES;
        let to = if job.tcp.seen[index / 64] & (1 << (index % 64)) != 0 {
            if !self.fo.rx_resent {
                return Err(self.garbage(format!(
                    "chunk at byte offset {off} of message {} arrived twice",
                    h.msg
                )));
            }
            Into::Discard
        } else if job.sink.copies() {
            Into::Sink
        } else {
            Into::Stage
        };
        Ok(RxChunk {
            hdr: *h,
            index,
            off,
            len,
            done: 0,
            to,
        })
    }

    /// The header of the next message from this peer, without taking it:
    /// headers that have arrived are read and kept for the receive that
    /// will take them (control frames ahead of them are consumed as a
    /// receive would). `None` while none has arrived. Only valid between
    /// receives.
    pub fn peek_header(&mut self) -> Result<Option<WireHeader>, ErrorKind> {
        if let Some((h, _)) = self.fo.parked.iter().find(|(h, _)| h.msg == self.rx_msg) {
            return Ok(Some(h.base));
        }
        for s in 0..self.streams.len() {
            loop {
                if self.rx_ctl[s].is_some() {
                    let Some(ctl) = self.read_ctl(s)? else {
                        break;
                    };
                    self.note_control(ctl, 0)?;
                    continue;
                }
                if !matches!(self.rx[s], RxState::Header { .. }) {
                    break;
                }
                let h = match self.read_header(s)? {
                    HeaderStep::Blocked { .. } | HeaderStep::Closed => break,
                    HeaderStep::Control => continue,
                    HeaderStep::Data(h) => h,
                };
                if h.msg == self.rx_msg {
                    check_data_frame(&h.base, self.peer)?;
                    self.rx[s] = RxState::Stashed {
                        hdr: h,
                        at: Instant::now(),
                    };
                } else {
                    self.set_aside(s, h, self.rx_msg)?;
                }
                break;
            }
        }
        let next = self.rx.iter().find_map(|r| match r {
            RxState::Stashed { hdr, .. } if hdr.msg == self.rx_msg => Some(hdr.base),
            _ => None,
        });
        if next.is_none() && self.rx.iter().all(|r| matches!(r, RxState::Closed)) {
            return Err(self.closed());
        }
        Ok(next)
    }

    /// Reads the payload of the control frame pending on stream `s`, as far
    /// as the socket has it; `None` until it is complete.
    fn read_ctl(&mut self, s: usize) -> Result<Option<CtlIn>, ErrorKind> {
        let peer = self.peer;
        let (Some(c), stream) = (self.rx_ctl[s].as_mut(), &mut self.streams[s]) else {
            return Ok(None);
        };
        let want = c.hdr.len as usize;
        let mut buf = [0u8; 512];
        while c.payload.len() < want {
            let k = (want - c.payload.len()).min(buf.len());
            let lost = match stream.read(&mut buf[..k]) {
                Ok(0) => ErrorKind::PeerClosed {
                    peer,
                    detail: "end of stream inside a control frame".into(),
                },
                Ok(n) => {
                    c.payload.extend_from_slice(&buf[..n]);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => io_error(peer, e),
            };
            self.lose_stream(s, lost)?;
            return Ok(None);
        }
        Ok(self.rx_ctl[s].take())
    }

    /// Writes queued control bytes on the control stream as far as the
    /// socket takes them, unless a chunk is half-written there. Returns
    /// whether any byte moved. With several paths, a control stream that
    /// fails takes its path down and the notice is dropped (notices are
    /// advice; the next one goes on a path that works).
    fn flush_ctl(&mut self) -> Result<bool, ErrorKind> {
        let s = self.ctl_stream;
        if self.tx_ctl.is_empty() || self.tx_mid_frame(s) {
            return Ok(false);
        }
        let mut moved = false;
        while self.tx_ctl_done < self.tx_ctl.len() {
            let why = match self.streams[s].write(&self.tx_ctl[self.tx_ctl_done..]) {
                Ok(0) => self.closed(),
                Ok(n) => {
                    self.tx_ctl_done += n;
                    moved = true;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => self.io_err(e),
            };
            self.tx_ctl.clear();
            self.tx_ctl_done = 0;
            self.stream_failed(s, why)?;
            return Ok(moved);
        }
        self.tx_ctl.clear();
        self.tx_ctl_done = 0;
        Ok(moved)
    }

    /// Sends what is left of queued control frames (the engine calls this
    /// while it waits; a stall notice must reach the peer even when no data
    /// goes that way). Errors surface on the next data transfer.
    pub fn flush_control(&mut self) {
        let _ = self.flush_ctl();
    }

    /// Queues a stall notice on the control stream and writes what the socket takes
    /// now, never blocking: the rest goes out between chunks. A newer
    /// notice replaces one not yet started.
    pub fn post_stall(&mut self, n: &StallNotice) {
        let payload: Vec<u8> = n
            .chain
            .iter()
            .take(STALL_CHAIN_MAX)
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let hdr = TcpHeader::control(WireHeader {
            magic: MAGIC,
            frame: FRAME_STALL,
            seq: n.seq,
            len: payload.len() as u64,
            ..Default::default()
        });
        if self.tx_ctl_done == 0 {
            self.tx_ctl.clear();
        }
        self.tx_ctl.extend_from_slice(bytemuck::bytes_of(&hdr));
        self.tx_ctl.extend_from_slice(&payload);
        let _ = self.flush_ctl();
    }

    /// Sends an abort frame on every stream that is between frames, without
    /// blocking. A stream where a frame is half-written, or where the socket
    /// does not take the whole abort frame at once, is shut down instead: the
    /// peer then sees the end of the stream rather than waiting, and never a
    /// frame cut by another. The link is not used after this.
    pub fn send_abort(&mut self, n: &AbortNotice) {
        let text = n.wire_text();
        let (flag, blamed_sig, detector, detector_sig) = match n.mismatch {
            Some((b, d, ds)) => (1, b, d as u64, ds),
            None => (0, 0, 0, 0),
        };
        let hdr = TcpHeader::control(WireHeader {
            magic: MAGIC,
            frame: FRAME_ABORT,
            redop: flag,
            root: n.origin as u32,
            seq: blamed_sig,
            sig: detector_sig,
            count: detector,
            len: text.len() as u64,
            ..Default::default()
        });
        let mut frame = bytemuck::bytes_of(&hdr).to_vec();
        frame.extend_from_slice(text.as_bytes());
        let ctl_mid = self.tx_ctl_done > 0;
        for i in 0..self.streams.len() {
            let mid = self.tx_mid_frame(i) || (i == self.ctl_stream && ctl_mid);
            let sock = &mut self.streams[i];
            if mid || !write_all_now(sock, &frame) {
                let _ = sock.shutdown(Shutdown::Both);
            }
        }
    }

    /// File descriptors of every stream.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.streams.iter().map(|s| s.as_raw_fd())
    }

    /// The streams a transfer still waits on. A sender waits on the streams
    /// writing a chunk (the next chunk goes to one of them or to a free
    /// stream at once), and on stream 0 while control bytes wait. A receiver
    /// waits on every stream not holding a later message's header and not
    /// closed. A
    /// stream with nothing to do for the transfer must not be polled: it is
    /// writable (or holds the next message) at once, and poll(2) would
    /// return at once until the slowest stream ends — a spin that takes
    /// cores from the kernel's network work.
    pub fn waiting_fds<'a>(
        &'a self,
        is_send: bool,
        started: bool,
    ) -> impl Iterator<Item = RawFd> + 'a {
        self.streams.iter().enumerate().filter_map(move |(i, s)| {
            let waits = !started
                || if is_send {
                    (self.tx[i].is_some() && self.stream_up(i))
                        || (i == self.ctl_stream && !self.tx_ctl.is_empty())
                } else {
                    !matches!(self.rx[i], RxState::Stashed { .. } | RxState::Closed)
                };
            waits.then(|| s.as_raw_fd())
        })
    }

    /// Test hook: takes path `p` down as if it had stopped delivering (its
    /// streams stay open; it comes back once they deliver what they hold).
    pub fn force_path_down(&mut self, p: usize) -> Result<(), ErrorKind> {
        self.sample_rates();
        self.path_down(p, "taken down by a test".into(), false)
    }

    /// Test hook: writes bytes that are not a frame on stream 0.
    pub fn inject_garbage(&mut self) -> io::Result<()> {
        let _ = self.streams[0].set_nonblocking(false);
        let r = self.streams[0].write_all(&[0xAB; 256]);
        let _ = self.streams[0].set_nonblocking(true);
        r
    }
}

/// Whether this socket's peer has answered nothing for `quiet` while the
/// kernel has something out to it (bytes in flight, or a zero-window probe).
/// A live peer answers every retransmission and probe with an ACK, even
/// when it does not read (its window closed, or its receive memory full so
/// that it drops what arrives): only a path that carries nothing is silent.
/// With [`RTO_MAX`] the kernel retries at least every second, so a live
/// path is never silent for much longer than that.
fn peer_silent(s: &TcpStream, quiet: Duration) -> bool {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: FFI call on a socket descriptor `s` owns and keeps open;
    // `info` and `len` are valid and exclusively borrowed, and `len` says
    // how many bytes the kernel may write into `info`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    rc == 0
        && (info.tcpi_unacked > 0 || info.tcpi_probes > 0)
        && u128::from(info.tcpi_last_ack_recv) >= quiet.as_millis()
}

/// The error an I/O failure on a link to `peer` means.
fn io_error(peer: usize, e: io::Error) -> ErrorKind {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionAborted => ErrorKind::PeerClosed {
            peer,
            detail: e.to_string(),
        },
        _ => ErrorKind::Io {
            peer,
            detail: e.to_string(),
        },
    }
}

/// Writes `bytes` whole if the socket takes them without blocking; `false`
/// when it took only part (or failed).
fn write_all_now(sock: &mut TcpStream, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        match sock.write(&bytes[done..]) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Waits until one of `fds` is ready for `events` or `timeout` passes.
pub fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    if fds.is_empty() {
        std::thread::sleep(timeout);
        return;
    }
    let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed slice of pollfd structs and
    // its length is passed alongside; poll only writes their `revents` fields.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
    }
}
