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
//!
//! Sockets are non-blocking; the engine calls `*_progress` and, when nothing
//! moves, waits in `poll(2)` on the streams it needs. Streams are set up (and
//! authenticated) in `tcp_setup.rs`.

use super::{
    check_data_frame, AbortNotice, ChunkCursor, LinkCounters, RecvJob, SendJob, StallNotice,
    WireHeader, ABORT_TEXT_MAX, FRAME_ABORT, FRAME_STALL, MAGIC, STALL_CHAIN_MAX,
};
use crate::error::ErrorKind;
use bytemuck::{Pod, Zeroable};
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
/// Receive staging for reducing receives (bytes per stream).
const STAGING: usize = 256 * 1024;
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
    pub _pad: u32,
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
    staging: Vec<Vec<u8>>,
    /// Control frames (stall notices) waiting to go on stream 0, whole
    /// frames only, and how many of their bytes are written. A chunk starts
    /// on stream 0 only once this is empty, and a control frame only between
    /// chunks, so neither is ever spliced into the other.
    tx_ctl: Vec<u8>,
    tx_ctl_done: usize,
    /// Per stream: a control frame whose header has arrived and whose
    /// payload is being read (non-blocking, like everything else).
    rx_ctl: Vec<Option<CtlIn>>,
    /// The last stall notice the peer sent.
    pub stall: Option<StallNotice>,
    /// Paths the streams run on (stream s: path s % npaths).
    npaths: usize,
    pub stats: Arc<LinkCounters>,
}

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
        }
    }

    /// Reads the socket's queue and, at most every [`RATE_SAMPLE`], folds
    /// what it delivered since the last sample into the rate. Only a stream
    /// that had bytes queued from start to end of the interval shows its
    /// rate; one that ran dry delivered all it had, faster than it seems, so
    /// its sample can only raise an estimate, never start one (a 48-byte
    /// barrier message over an idle millisecond is no measure of a path).
    fn sample(&mut self, sock: &TcpStream, now: Instant) {
        self.queued = queued_bytes(sock).min(self.written);
        let dt = now.duration_since(self.at);
        if dt < RATE_SAMPLE {
            return;
        }
        let delivered = self.written - self.queued;
        let inst = delivered.saturating_sub(self.delivered) as f64 / dt.as_secs_f64();
        if self.backlogged && self.queued > 0 {
            self.bps = if self.bps == 0.0 {
                inst
            } else {
                self.bps + RATE_GAIN * (inst - self.bps)
            };
            self.measured_at = now;
        } else if self.backlogged && self.bps > 0.0 && inst > self.bps {
            self.bps = inst;
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
    /// checked for sanity, waits here until that message's receive starts.
    Stashed(TcpHeader),
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
    index: usize,
    off: usize,
    len: usize,
    done: usize,
    /// Reducing receives: bytes staged that do not yet make a whole element.
    carry: usize,
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
    let v = bytes as libc::c_int;
    // SAFETY: FFI call on a socket descriptor `s` owns and keeps open; the
    // option value is a valid c_int whose size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
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
            rx_ctl: (0..n).map(|_| None).collect(),
            stall: None,
            npaths,
            stats: LinkCounters::with_paths(peer, "tcp", npaths),
        })
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
            // A control frame goes first on stream 0, between chunks.
            progressed |= self.flush_ctl()?;
        }
        // Queues and rates are read once per call, and only when a free
        // stream has to decide whether the next chunk is its own.
        let multi = self.streams.len() > 1;
        let mut sampled = false;
        for s in 0..self.streams.len() {
            loop {
                if self.tx[s].is_none() {
                    if s == 0 && !self.tx_ctl.is_empty() {
                        break;
                    }
                    if !job.tcp.unassigned() {
                        break;
                    }
                    let index = job.tcp.next;
                    let off = index * CHUNK_BYTES;
                    let len = CHUNK_BYTES.min(total - off);
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
                    self.tx[s] = Some(TxChunk {
                        hdr: TcpHeader {
                            base: job.meta.header(len),
                            msg: job.tcp.msg,
                            _pad: 0,
                            off: off as u64,
                        },
                        hdr_done: 0,
                        done: 0,
                    });
                }
                let Some(c) = self.tx[s].as_mut() else {
                    unreachable!("a chunk was just assigned");
                };
                let off = c.hdr.off as usize;
                let len = c.hdr.base.len as usize;
                let payload = job.src.bytes(off + c.done, len - c.done);
                let hdr_bytes = bytemuck::bytes_of(&c.hdr);
                let res = if c.hdr_done < TCP_HEADER_BYTES {
                    self.streams[s].write_vectored(&[
                        IoSlice::new(&hdr_bytes[c.hdr_done..]),
                        IoSlice::new(payload),
                    ])
                } else {
                    self.streams[s].write(payload)
                };
                match res {
                    Ok(0) => return Err(self.closed()),
                    Ok(mut n) => {
                        progressed = true;
                        let h = n.min(TCP_HEADER_BYTES - c.hdr_done);
                        c.hdr_done += h;
                        n -= h;
                        self.rate[s].written += (h + n) as u64;
                        self.rate[s].queued += (h + n) as u64;
                        c.done += n;
                        job.sent += n;
                        self.stats.bytes_sent.add(n as u64);
                        self.stats.paths[s % self.npaths].bytes_sent.add(n as u64);
                        if c.hdr_done == TCP_HEADER_BYTES && c.done == len {
                            // Finished: the stream is free for the next chunk.
                            self.tx[s] = None;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(self.io_err(e)),
                }
            }
        }
        if !job.tcp.unassigned() && self.tx.iter().all(Option::is_none) {
            job.done = true;
            self.stats.msgs_sent.add(1);
        }
        Ok(progressed)
    }

    /// Reads every stream's queue and updates the rates (see
    /// [`TxRate::sample`]) and the per-path rate counters.
    fn sample_rates(&mut self) {
        let now = Instant::now();
        for (r, sock) in self.rate.iter_mut().zip(&self.streams) {
            r.sample(sock, now);
        }
        for (p, c) in self.stats.paths.iter().enumerate() {
            let bps: f64 = self
                .rate
                .iter()
                .skip(p)
                .step_by(self.npaths)
                .map(|r| r.bps)
                .sum();
            c.rate_bps.set(bps as u64);
        }
    }

    /// The stream expected to deliver a further `len`-byte chunk first:
    /// what it holds (in the kernel, and the unwritten rest of its chunk),
    /// plus the chunk, over its rate. Streams not measured yet count at the
    /// fastest measured rate (so each gets tried); ties go to the lowest
    /// stream, which keeps small messages on stream 0.
    fn first_to_finish(&self, len: usize) -> usize {
        let now = Instant::now();
        let fastest = self
            .rate
            .iter()
            .filter_map(|r| r.planning_bps(now))
            .fold(0.0, f64::max);
        let mut best = (f64::INFINITY, 0);
        for (s, r) in self.rate.iter().enumerate() {
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
        for s in 0..self.streams.len() {
            progressed |= self.recv_stream(s, job)?;
            if job.tcp.received == job.tcp.nchunks {
                break;
            }
        }
        if job.tcp.received == job.tcp.nchunks {
            job.done = true;
            self.rx_msg = self.rx_msg.wrapping_add(1);
            self.stats.msgs_recv.add(1);
        } else if self.rx.iter().all(|r| matches!(r, RxState::Closed)) {
            return Err(self.closed());
        } else if self
            .rx
            .iter()
            .all(|r| matches!(r, RxState::Stashed(_) | RxState::Closed))
        {
            // Each stream is in order, and every open one's next frame
            // belongs to a later message: the rest of this one can never
            // come.
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
                RxState::Stashed(h) => {
                    if h.msg != job.tcp.msg {
                        return Ok(progressed);
                    }
                    let h = *h;
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
                    } else {
                        self.stash(s, h, job.tcp.msg)?;
                        return Ok(progressed);
                    }
                }
                RxState::Chunk(c) => {
                    if c.done == c.len {
                        let index = c.index;
                        job.tcp.seen[index / 64] |= 1 << (index % 64);
                        job.tcp.received += 1;
                        self.rx[s] = RxState::idle();
                        if job.tcp.received == job.tcp.nchunks {
                            return Ok(progressed);
                        }
                        continue;
                    }
                    let elem = job.sink.elem_size();
                    let remaining = c.len - c.done;
                    let stream = &mut self.streams[s];
                    let res = if let Some(dst) = job.sink.direct(c.off + c.done, remaining) {
                        // Copying receive: straight from the socket into the
                        // destination.
                        stream.read(dst).inspect(|&n| c.done += n)
                    } else {
                        // Reducing receive: stage, then reduce whole elements.
                        let stage = &mut self.staging[s];
                        if stage.len() < STAGING {
                            stage.resize(STAGING, 0);
                        }
                        let want = (STAGING - c.carry).min(remaining - c.carry);
                        stream
                            .read(&mut stage[c.carry..c.carry + want])
                            .inspect(|&n| {
                                let avail = c.carry + n;
                                let whole = avail - avail % elem;
                                job.sink.deliver(c.off + c.done, &stage[..whole]);
                                c.done += whole;
                                stage.copy_within(whole..avail, 0);
                                c.carry = avail - whole;
                            })
                    };
                    match res {
                        Ok(0) => return Err(self.closed()),
                        Ok(n) => {
                            progressed = true;
                            job.got += n;
                            self.stats.bytes_recv.add(n as u64);
                            self.stats.paths[s % self.npaths].bytes_recv.add(n as u64);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progressed),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(self.io_err(e)),
                    }
                }
            }
        }
    }

    /// Reads stream `s`'s next frame header (the stream is between frames)
    /// as far as the socket has it. A control frame's header sets the
    /// stream up to read its payload; the end of the stream here marks it
    /// closed; the end inside a header is an error.
    fn read_header(&mut self, s: usize) -> Result<HeaderStep, ErrorKind> {
        let mut moved = false;
        loop {
            let RxState::Header { buf, done } = &mut self.rx[s] else {
                unreachable!("read_header on a stream inside a frame");
            };
            match self.streams[s].read(&mut buf[*done..]) {
                Ok(0) if *done == 0 => {
                    self.rx[s] = RxState::Closed;
                    return Ok(HeaderStep::Closed);
                }
                Ok(0) => return Err(self.closed()),
                Ok(n) => {
                    moved = true;
                    *done += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(HeaderStep::Blocked { moved })
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err(e)),
            }
            if *done < TCP_HEADER_BYTES {
                continue;
            }
            let h: TcpHeader = bytemuck::pod_read_unaligned(&buf[..]);
            self.rx[s] = RxState::idle();
            if self.take_control(s, &h.base)? {
                return Ok(HeaderStep::Control);
            }
            return Ok(HeaderStep::Data(h));
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

    /// Keeps the header of a later message's frame on stream `s` until its
    /// receive starts. Only data frames of a later message may wait; an
    /// earlier message number, or bytes that are not a frame, is garbage.
    fn stash(&mut self, s: usize, h: TcpHeader, current: u32) -> Result<(), ErrorKind> {
        check_data_frame(&h.base, self.peer)?;
        if !is_later(h.msg, current) {
            return Err(self.garbage(format!(
                "a frame of message {} arrived while message {current} is received",
                h.msg
            )));
        }
        self.rx[s] = RxState::Stashed(h);
        Ok(())
    }

    /// Checks the header of a chunk of the message `job` receives and
    /// returns its cursor.
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
        if job.tcp.seen[index / 64] & (1 << (index % 64)) != 0 {
            return Err(self.garbage(format!(
                "chunk at byte offset {off} of message {} arrived twice",
                h.msg
            )));
        }
        Ok(RxChunk {
            index,
            off,
            len,
            done: 0,
            carry: 0,
        })
    }

    /// The header of the next message from this peer, without taking it:
    /// headers that have arrived are read and kept for the receive that
    /// will take them (control frames ahead of them are consumed as a
    /// receive would). `None` while none has arrived. Only valid between
    /// receives.
    pub fn peek_header(&mut self) -> Result<Option<WireHeader>, ErrorKind> {
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
                    self.rx[s] = RxState::Stashed(h);
                } else {
                    self.stash(s, h, self.rx_msg)?;
                }
                break;
            }
        }
        let next = self.rx.iter().find_map(|r| match r {
            RxState::Stashed(h) if h.msg == self.rx_msg => Some(h.base),
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
            match stream.read(&mut buf[..k]) {
                Ok(0) => {
                    return Err(ErrorKind::PeerClosed {
                        peer,
                        detail: "end of stream inside a control frame".into(),
                    })
                }
                Ok(n) => c.payload.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(peer, e)),
            }
        }
        Ok(self.rx_ctl[s].take())
    }

    /// Writes queued control bytes on stream 0 as far as the socket takes
    /// them, unless a chunk is half-written there. Returns whether any
    /// byte moved.
    fn flush_ctl(&mut self) -> Result<bool, ErrorKind> {
        if self.tx_ctl.is_empty() || self.tx_mid_frame(0) {
            return Ok(false);
        }
        let mut moved = false;
        while self.tx_ctl_done < self.tx_ctl.len() {
            match self.streams[0].write(&self.tx_ctl[self.tx_ctl_done..]) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => {
                    self.tx_ctl_done += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err(e)),
            }
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

    /// Queues a stall notice on stream 0 and writes what the socket takes
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
            let mid = self.tx_mid_frame(i) || (i == 0 && ctl_mid);
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
                    self.tx[i].is_some() || (i == 0 && !self.tx_ctl.is_empty())
                } else {
                    !matches!(self.rx[i], RxState::Stashed(_) | RxState::Closed)
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
