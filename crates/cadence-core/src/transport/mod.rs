//! Transports move messages between two ranks. Every transport implements the
//! same small interface ([`Link`]): progress a send, progress a receive, say
//! what to wait on when idle. The engine never blocks inside a transport; it
//! calls `*_progress` until the transfer is done and backs off when nothing
//! moved.
//!
//! Terms: a **message** is what one schedule `Send` step transfers (possibly 0
//! bytes: it still carries its header, which is how barriers signal). A message
//! travels as one or more **frames** (shm: one per slot; TCP: one per chunk,
//! see `tcp.rs`), each led by a [`WireHeader`] so that the receiver checks, before
//! touching data, that the sender is running the same operation with the same
//! arguments.

pub mod handshake;
pub mod shm;
pub mod tcp;
pub use tcp::setup as tcp_setup;

use crate::copy::copy_bytes;
use crate::error::ErrorKind;
use crate::reduce;
use crate::types::{CollKind, DType, ElemOp, RedOp};
use bytemuck::{Pod, Zeroable};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// "CDNC" little-endian.
pub const MAGIC: u32 = 0x434e_4443;
pub const FRAME_DATA: u8 = 1;
pub const FRAME_ABORT: u8 = 2;
/// "I have been stuck past my deadline; here is who I wait on" (see
/// [`StallNotice`]).
pub const FRAME_STALL: u8 = 3;
/// Shared memory only: "read this message from my memory" (single copy; see
/// `transport::shm`).
pub const FRAME_CMA: u8 = 4;

/// Longest wait-for chain a stall notice carries.
pub const STALL_CHAIN_MAX: usize = 6;

/// Longest abort text (UTF-8 bytes) any transport carries; longer reasons
/// are cut at a character boundary and end in [`TRUNCATED`].
pub const ABORT_TEXT_MAX: usize = 2048;
/// Marks an abort text that was cut to fit [`ABORT_TEXT_MAX`].
pub const TRUNCATED: &str = " \u{2026}[truncated]";

/// A rank stuck past its deadline tells its peers whom it waits on, as a
/// chain `[self, waits_on, that rank's target, ...]` as far as it knows it.
/// A rank that times out waiting on a peer which itself waits on a third
/// blames the end of the chain, not the innocent peer in the middle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StallNotice {
    /// Sequence number of the operation the sender is stuck in.
    pub seq: u64,
    pub chain: Vec<u32>,
}

/// Leads every frame on every transport.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable, PartialEq, Eq)]
pub struct WireHeader {
    pub magic: u32,
    pub frame: u8,
    pub coll: u8,
    pub dtype: u8,
    pub redop: u8,
    /// Root (or p2p peer) of the sender's operation; for ABORT frames the
    /// rank the failure is blamed on.
    pub root: u32,
    pub _pad: u32,
    /// Sequence number of the operation on its stream of operations
    /// (collectives, or p2p messages of one direction between two ranks).
    pub seq: u64,
    /// Hash of the operation's full arguments; equal on every rank that
    /// called the same collective with the same arguments.
    pub sig: u64,
    /// The sender's total element count (for error messages).
    pub count: u64,
    /// Payload bytes of this frame.
    pub len: u64,
}

pub const HEADER_BYTES: usize = std::mem::size_of::<WireHeader>();

/// The identity of the operation a message belongs to. The receiver compares
/// it with the header of each incoming frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpMeta {
    pub coll: CollKind,
    pub dtype: DType,
    pub redop: u8,
    pub root: u32,
    pub seq: u64,
    pub sig: u64,
    pub count: u64,
}

impl OpMeta {
    pub fn header(&self, len: usize) -> WireHeader {
        WireHeader {
            magic: MAGIC,
            frame: FRAME_DATA,
            coll: self.coll.code(),
            dtype: self.dtype.code(),
            redop: self.redop,
            root: self.root,
            _pad: 0,
            seq: self.seq,
            sig: self.sig,
            count: self.count,
            len: len as u64,
        }
    }

    /// "allreduce #5 (count=100, float32, sum, root 0)"
    pub fn describe(&self) -> String {
        describe(
            self.coll.code(),
            self.seq,
            self.count,
            self.dtype.code(),
            self.redop,
            self.root,
        )
    }

    /// Checks an incoming frame header against this operation; `want_len` is
    /// the payload length the receiver expects for this frame.
    pub fn check(&self, h: &WireHeader, peer: usize, want_len: usize) -> Result<(), ErrorKind> {
        self.check_len(h, peer, h.len == want_len as u64, || want_len.to_string())
    }

    /// Like [`OpMeta::check`] for a transport whose frames may be shorter
    /// than the rest of the message (shared memory sizes them by the room
    /// in its ring): the frame must carry something of the `left` bytes
    /// still expected, and no more than them.
    pub fn check_frame(&self, h: &WireHeader, peer: usize, left: usize) -> Result<(), ErrorKind> {
        let fits = h.len <= left as u64 && (h.len > 0 || left == 0);
        self.check_len(h, peer, fits, || match left {
            0 => "0".to_string(),
            _ => format!("1 to {left}"),
        })
    }

    /// The checks of both: `want` says what was expected, for the error.
    fn check_len(
        &self,
        h: &WireHeader,
        peer: usize,
        len_ok: bool,
        want: impl FnOnce() -> String,
    ) -> Result<(), ErrorKind> {
        check_data_frame(h, peer)?;
        if h.seq != self.seq || h.sig != self.sig || !len_ok {
            let mut theirs = describe(h.coll, h.seq, h.count, h.dtype, h.redop, h.root);
            if h.seq == self.seq && h.sig == self.sig {
                theirs.push_str(&format!(
                    " but sent a {}-byte frame where {} bytes were expected",
                    h.len,
                    want()
                ));
            }
            return Err(ErrorKind::Mismatch {
                peer,
                ours: self.describe(),
                theirs,
                our_sig: self.sig,
                their_sig: h.sig,
            });
        }
        Ok(())
    }
}

/// Checks that `h` leads a data frame at all (magic, frame type), before
/// anything of the operation it belongs to is compared.
pub fn check_data_frame(h: &WireHeader, peer: usize) -> Result<(), ErrorKind> {
    if h.magic != MAGIC {
        return Err(ErrorKind::Garbage {
            peer,
            detail: format!("bad frame magic {:#010x} (expected {MAGIC:#010x})", h.magic),
        });
    }
    if h.frame != FRAME_DATA {
        return Err(ErrorKind::Garbage {
            peer,
            detail: format!("unknown frame type {}", h.frame),
        });
    }
    Ok(())
}

fn describe(coll: u8, seq: u64, count: u64, dtype: u8, redop: u8, root: u32) -> String {
    let coll_s = CollKind::from_code(coll).map_or("?", |c| c.name());
    let dtype_s = DType::from_code(dtype).map_or("?", |d| d.name());
    let mut s = format!("{coll_s} #{seq} (count={count}, {dtype_s}");
    if CollKind::from_code(coll).is_some_and(|c| c.reduces()) {
        s.push_str(", ");
        s.push_str(RedOp::name_of_code(redop));
    }
    if CollKind::from_code(coll).is_some_and(|c| c.is_rooted()) {
        s.push_str(&format!(", root/peer {root}"));
    }
    s.push(')');
    s
}

/// What a failing rank tells its peers.
#[derive(Clone, Debug, PartialEq)]
pub struct AbortNotice {
    /// The rank the sender blames.
    pub origin: usize,
    pub detail: String,
    /// For argument mismatches: (blamed rank's signature, detecting rank,
    /// detecting rank's signature). A mismatch is symmetric — the detector
    /// cannot know which side is wrong — but a third rank can: the culprit is
    /// the side whose call differs from its own.
    pub mismatch: Option<(u64, usize, u64)>,
}

impl AbortNotice {
    /// The notice a rank sends after failing with `kind`.
    pub fn from_error(kind: &ErrorKind, me: usize) -> AbortNotice {
        let mismatch = match kind {
            ErrorKind::Mismatch {
                our_sig, their_sig, ..
            } => Some((*their_sig, me, *our_sig)),
            _ => None,
        };
        let detail = match kind {
            // Already a relayed report: pass the original on unchanged.
            ErrorKind::Aborted { detail, .. } => detail.clone(),
            k => format!("rank {me} reported: {k}"),
        };
        AbortNotice {
            origin: kind.culprit().unwrap_or(me),
            detail,
            mismatch,
        }
    }

    /// The text as it goes on the wire: whole when it fits in
    /// [`ABORT_TEXT_MAX`] bytes, else cut at a character boundary with a
    /// [`TRUNCATED`] mark, so a receiver never sees half a character.
    pub fn wire_text(&self) -> std::borrow::Cow<'_, str> {
        let d = &self.detail;
        if d.len() <= ABORT_TEXT_MAX {
            return std::borrow::Cow::Borrowed(d);
        }
        let mut end = ABORT_TEXT_MAX - TRUNCATED.len();
        while !d.is_char_boundary(end) {
            end -= 1;
        }
        std::borrow::Cow::Owned(format!("{}{TRUNCATED}", &d[..end]))
    }

    /// The error a receiver raises, given the signature of its own call.
    pub fn into_error(self, my_sig: u64) -> ErrorKind {
        let origin = match self.mismatch {
            Some((_, detector, detector_sig)) if detector_sig != my_sig => detector,
            _ => self.origin,
        };
        ErrorKind::Aborted {
            origin,
            detail: self.detail,
        }
    }
}

/// Where received bytes go: copied into `dst`, or reduced into it.
pub struct Sink {
    dst: *mut u8,
    len: usize,
    mode: SinkMode,
    dtype: DType,
    op: ElemOp,
}

#[derive(Clone, Copy)]
pub enum SinkMode {
    /// dst = incoming
    Copy,
    /// dst = dst ⊕ incoming
    ReduceInPlace,
    /// dst = a ⊕ incoming, `a` disjoint from dst
    ReduceWith(*const u8),
}

impl Sink {
    /// # Safety
    /// `dst` must be valid for reads and writes of `len` bytes, and (for
    /// `ReduceWith(a)`) `a` valid for reads of `len` bytes and disjoint from
    /// `dst`, for as long as the sink is used; nothing else may access those
    /// bytes meanwhile.
    pub unsafe fn new(dst: *mut u8, len: usize, mode: SinkMode, dtype: DType, op: ElemOp) -> Sink {
        Sink {
            dst,
            len,
            mode,
            dtype,
            op,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn elem_size(&self) -> usize {
        self.dtype.size()
    }

    /// Applies `data` at byte offset `off`. `data.len()` must be a multiple of
    /// the element size unless the sink only copies.
    pub fn deliver(&mut self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len, "sink overflow");
        if data.is_empty() {
            return;
        }
        // SAFETY: `Sink::new`'s contract: dst/a valid for `len` bytes, exclusive
        // to this sink, and `off + data.len() <= len` was checked above. `data`
        // comes from transport memory, never from dst.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.dst.add(off), data.len());
            match self.mode {
                SinkMode::Copy => copy_bytes(dst, data),
                SinkMode::ReduceInPlace => reduce::reduce_inplace(self.dtype, self.op, dst, data),
                SinkMode::ReduceWith(a) => {
                    let a = std::slice::from_raw_parts(a.add(off), data.len());
                    reduce::reduce_into(self.dtype, self.op, dst, a, data)
                }
            }
        }
    }

    /// Whether received bytes are copied (not reduced) into the destination.
    pub fn copies(&self) -> bool {
        matches!(self.mode, SinkMode::Copy)
    }

    /// For copy sinks, the destination bytes themselves, so a transport can
    /// read from a socket straight into them. `None` for reducing sinks.
    pub fn direct(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        match self.mode {
            SinkMode::Copy if len == 0 => Some(&mut []),
            SinkMode::Copy => {
                assert!(off + len <= self.len, "sink overflow");
                // SAFETY: as in `deliver`; the returned borrow is tied to
                // `&mut self`, so no second view can exist meanwhile.
                Some(unsafe { std::slice::from_raw_parts_mut(self.dst.add(off), len) })
            }
            _ => None,
        }
    }
}

// SAFETY: a Sink is plain pointers into buffers whose owner guarantees (see
// `Sink::new`) that they stay valid and exclusive while the sink is used; the
// engine may run on the communicator's progress thread, and only one thread
// ever uses a given sink.
unsafe impl Send for Sink {}

/// Bytes a send reads from.
pub struct Source {
    ptr: *const u8,
    len: usize,
}

impl Source {
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes while the source is used,
    /// and nothing may write those bytes meanwhile.
    pub unsafe fn new(ptr: *const u8, len: usize) -> Source {
        Source { ptr, len }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len, "source overflow");
        if len == 0 {
            return &[];
        }
        // SAFETY: `Source::new`'s contract, bounds checked above.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }
}

// SAFETY: as for `Sink`: valid, unmodified memory for the send's lifetime,
// used by one thread at a time.
unsafe impl Send for Source {}

/// A send in progress.
pub struct SendJob {
    pub meta: OpMeta,
    pub src: Source,
    /// Transport-specific cursor (bytes handed to the transport so far, or
    /// per-stream state); owned by the transport.
    pub sent: usize,
    pub started: bool,
    pub done: bool,
    /// Looked ahead into a later phase but not allowed to move yet (the
    /// engine's hazard check); transports never see held jobs.
    pub held: bool,
    /// Its call is one where streaming through the shared-memory ring can
    /// beat single copy ([`crate::engine::prefers_stream`]); shared memory
    /// keeps it in the ring whatever its size when its collective is in
    /// `ShmConfig::stream` (`CADENCE_SHM_STREAM`).
    pub prefer_stream: bool,
    /// TCP's chunk bookkeeping (unused on shared memory).
    pub tcp: ChunkCursor,
    /// Evidence for the records (see [`JobTrace`]).
    pub trace: JobTrace,
}

/// What the records keep of one message besides its cursor: when it first
/// and last moved (stamped by the engine, never by transports), and which
/// operation it belongs to where one batch mixes several.
#[derive(Clone, Copy, Debug, Default)]
pub struct JobTrace {
    pub first: Option<std::time::Instant>,
    pub last: Option<std::time::Instant>,
    /// The communicator's record of the operation (0: the one running).
    pub tag: u64,
}

impl JobTrace {
    /// Notes that the message moved at `now`.
    pub fn stamp(&mut self, now: std::time::Instant) {
        if self.first.is_none() {
            self.first = Some(now);
        }
        self.last = Some(now);
    }
}

/// A receive in progress.
pub struct RecvJob {
    pub meta: OpMeta,
    pub sink: Sink,
    pub got: usize,
    pub started: bool,
    pub done: bool,
    /// See [`SendJob::held`].
    pub held: bool,
    /// See [`SendJob::tcp`].
    pub tcp: ChunkCursor,
    /// See [`SendJob::trace`].
    pub trace: JobTrace,
}

/// Where a message stands in its chunks (TCP; see `tcp.rs`). A message of
/// `nchunks` chunks is done when every chunk has been written (sender) or
/// received (receiver); which stream carries which chunk is decided as
/// streams free up, so the cursor counts chunks rather than tracking stripes.
#[derive(Clone, Debug, Default)]
pub struct ChunkCursor {
    /// The message's number on its link and direction (wrapping).
    pub msg: u32,
    pub nchunks: usize,
    /// Sender: the next chunk no stream has taken yet.
    pub next: usize,
    /// Receiver: chunks complete so far, and which ones (a bit per chunk).
    pub received: usize,
    pub seen: Vec<u64>,
}

impl ChunkCursor {
    /// Sender: whether some chunk still waits for a stream.
    pub fn unassigned(&self) -> bool {
        self.next < self.nchunks
    }
}

impl SendJob {
    /// Waiting on its peer: neither finished nor held back.
    pub fn active(&self) -> bool {
        !self.done && !self.held
    }
    pub fn new(meta: OpMeta, src: Source) -> SendJob {
        SendJob {
            meta,
            src,
            sent: 0,
            started: false,
            done: false,
            held: false,
            prefer_stream: false,
            tcp: ChunkCursor::default(),
            trace: JobTrace::default(),
        }
    }
    /// Payload bytes handed to the transport so far.
    pub fn moved(&self) -> usize {
        self.sent
    }
}

impl RecvJob {
    /// See [`SendJob::active`].
    pub fn active(&self) -> bool {
        !self.done && !self.held
    }
    pub fn new(meta: OpMeta, sink: Sink) -> RecvJob {
        RecvJob {
            meta,
            sink,
            got: 0,
            started: false,
            done: false,
            held: false,
            tcp: ChunkCursor::default(),
            trace: JobTrace::default(),
        }
    }
    /// Payload bytes received so far.
    pub fn moved(&self) -> usize {
        self.got
    }

    /// How many bytes from the start of the message have landed in the
    /// sink: everything once done; over TCP the leading chunks that are
    /// complete (streams deliver chunks out of order, `ChunkCursor`); over
    /// shared memory, which delivers in order, every byte received. A fold
    /// (`Step::Fold`) may read this prefix while the rest still arrives.
    pub fn landed(&self) -> usize {
        if self.done {
            return self.sink.len();
        }
        if self.tcp.nchunks == 0 {
            return self.got;
        }
        let mut whole = 0;
        for word in &self.tcp.seen {
            whole += word.trailing_ones() as usize;
            if *word != u64::MAX {
                break;
            }
        }
        (whole * tcp::CHUNK_BYTES).min(self.sink.len())
    }
}

/// A counter with one writer (the engine, which owns the link; the
/// communicator's lock hands it from thread to thread) and readers on any
/// thread at any time (metrics, dumps, also while an operation runs). The
/// writer adds with a relaxed load and store: plain moves, no locked
/// instruction; a reader sees a recent value, never a torn one.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the link's owner may call it (one writer: see above).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    /// Replaces the value (a gauge). Only the link's owner may call it.
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counters every connection keeps (always on, cheap: a few adds per
/// frame), shared with the communicator so they can be read while the
/// engine runs (see [`Counter`]).
#[derive(Debug, Default)]
pub struct LinkCounters {
    pub peer: usize,
    pub transport: &'static str,
    pub bytes_sent: Counter,
    pub bytes_recv: Counter,
    pub msgs_sent: Counter,
    pub msgs_recv: Counter,
    /// Nanoseconds during which this link had a transfer pending.
    pub busy_ns: Counter,
    /// Messages sent by single copy.
    pub single_copy_sent: Counter,
    /// Bytes of those this rank wrote into the receiver's memory itself,
    /// helping the receiver's read.
    pub single_copy_helped: Counter,
    /// Shared memory: futex wake-ups this rank sent the peer (a publish or
    /// a freed slot that found the peer asleep).
    pub doorbells_rung: Counter,
    /// TCP: the same per path (local NIC k to the peer's NIC k); empty on
    /// shared memory.
    pub paths: Vec<PathCounters>,
}

/// What one path of a TCP link carried, and how fast it delivers.
#[derive(Debug, Default)]
pub struct PathCounters {
    pub bytes_sent: Counter,
    pub bytes_recv: Counter,
    /// Delivery rate, bytes per second, as the sender measures it (the sum
    /// over the path's streams; 0 until measured).
    pub rate_bps: Counter,
    /// 1 while the path is down (failed over), 0 while it carries chunks.
    pub down: Counter,
    /// Times the path went down, and payload bytes written again on other
    /// paths because it did.
    pub downs: Counter,
    pub resent_bytes: Counter,
}

impl LinkCounters {
    pub fn new(peer: usize, transport: &'static str) -> Arc<LinkCounters> {
        Self::with_paths(peer, transport, 0)
    }

    pub fn with_paths(peer: usize, transport: &'static str, paths: usize) -> Arc<LinkCounters> {
        Arc::new(LinkCounters {
            peer,
            transport,
            paths: (0..paths).map(|_| PathCounters::default()).collect(),
            ..Default::default()
        })
    }

    /// The counters' values now.
    pub fn snapshot(&self) -> LinkStats {
        LinkStats {
            peer: self.peer,
            transport: self.transport,
            bytes_sent: self.bytes_sent.get(),
            bytes_recv: self.bytes_recv.get(),
            msgs_sent: self.msgs_sent.get(),
            msgs_recv: self.msgs_recv.get(),
            busy_ns: self.busy_ns.get(),
            single_copy_sent: self.single_copy_sent.get(),
            single_copy_helped: self.single_copy_helped.get(),
            doorbells_rung: self.doorbells_rung.get(),
            paths: self
                .paths
                .iter()
                .map(|p| PathStats {
                    bytes_sent: p.bytes_sent.get(),
                    bytes_recv: p.bytes_recv.get(),
                    rate_bps: p.rate_bps.get(),
                    up: p.down.get() == 0,
                    downs: p.downs.get(),
                    resent_bytes: p.resent_bytes.get(),
                })
                .collect(),
        }
    }
}

/// A path's counters at one moment.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PathStats {
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub rate_bps: u64,
    /// Whether the path carries chunks now (false: down, failed over).
    pub up: bool,
    pub downs: u64,
    pub resent_bytes: u64,
}

/// A link's counters at one moment ([`LinkCounters::snapshot`]).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LinkStats {
    pub peer: usize,
    pub transport: &'static str,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub msgs_sent: u64,
    pub msgs_recv: u64,
    /// Nanoseconds during which this link had a transfer pending.
    pub busy_ns: u64,
    /// Messages sent by single copy (shared memory: read by the receiver
    /// straight from this rank's buffer).
    pub single_copy_sent: u64,
    /// Bytes of those this rank wrote into the receiver's destination
    /// itself (shared memory: the sender helps a large read).
    pub single_copy_helped: u64,
    /// Shared memory: futex wake-ups sent to the peer (0 on TCP).
    pub doorbells_rung: u64,
    /// TCP: per path (local NIC k to the peer's NIC k).
    pub paths: Vec<PathStats>,
}

/// What an idle engine waits on for one transfer that cannot move now
/// ([`Link::wait_on`]). The engine gathers these over its transfers and
/// blocks once: in poll(2) on every socket, on its shared-memory doorbell,
/// or in short turns of each.
pub enum WaitOn<P> {
    /// The kernel says when: `poll(2)` these entries.
    Poll(P),
    /// The peer rings this rank's doorbell (the futex word in its
    /// [`shm::Inbox`]) when it publishes; after raising the sleep flag the
    /// engine asks [`Link::ready`] once more, for a publish that came first.
    Doorbell,
}

/// Blocks in poll(2) on `fds` for at most `timeout` (sleeps when empty).
pub use tcp::poll_fds;

/// A connection to one peer, over shared memory or TCP.
pub enum Link {
    Shm(shm::ShmLink),
    Tcp(tcp::TcpLink),
}

impl Link {
    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        match self {
            Link::Shm(l) => l.send_progress(job),
            Link::Tcp(l) => l.send_progress(job),
        }
    }
    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        match self {
            Link::Shm(l) => l.recv_progress(job),
            Link::Tcp(l) => l.recv_progress(job),
        }
    }
    pub fn stats(&self) -> &Arc<LinkCounters> {
        match self {
            Link::Shm(l) => &l.stats,
            Link::Tcp(l) => &l.stats,
        }
    }
    pub fn is_tcp(&self) -> bool {
        matches!(self, Link::Tcp(_))
    }
    /// Whether this link has several paths, and so background work
    /// ([`Link::maintain`]).
    pub fn multipath(&self) -> bool {
        match self {
            Link::Tcp(l) => l.multipath(),
            Link::Shm(_) => false,
        }
    }
    /// What to wait on while a send (`send = true`) or receive to this peer
    /// cannot move; `started`: the job's `started` (the link has begun it).
    pub fn wait_on(
        &self,
        send: bool,
        started: bool,
    ) -> WaitOn<impl Iterator<Item = libc::pollfd> + '_> {
        match self {
            Link::Tcp(l) => {
                let events = if send { libc::POLLOUT } else { libc::POLLIN };
                WaitOn::Poll(l.waiting_fds(send, started).map(move |fd| libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                }))
            }
            Link::Shm(_) => WaitOn::Doorbell,
        }
    }
    /// What else to poll while this link writes chunks on its own (sent
    /// again after a path failed, or the rest of a completed send), with no
    /// send of the engine's to this peer pending.
    pub fn background_wait(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        let fds = match self {
            Link::Tcp(l) => Some(l.background_fds()),
            Link::Shm(_) => None,
        };
        fds.into_iter().flatten().map(|fd| libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        })
    }
    /// Whether a send (`send = true`) or receive that waits on the doorbell
    /// ([`WaitOn::Doorbell`]) could move now. Links waited on by poll(2)
    /// answer `false` (the kernel tells for them).
    pub fn ready(&self, send: bool) -> bool {
        match self {
            Link::Shm(l) if send => l.tx_ready(),
            Link::Shm(l) => l.rx_ready(),
            Link::Tcp(_) => false,
        }
    }
    /// Where the peer says it stands in its collectives, against operation
    /// `seq`, for a timeout's text (`None` where the link cannot tell).
    pub fn describe_peer_progress(&self, peer: usize, seq: u64) -> Option<String> {
        match self {
            Link::Shm(l) => Some(l.peer_progress().describe(peer, seq)),
            Link::Tcp(_) => None,
        }
    }
    /// Checks, cheaply, whether the peer is known to be gone.
    pub fn check_alive(&mut self) -> Result<(), ErrorKind> {
        match self {
            Link::Shm(l) => l.check_alive(),
            Link::Tcp(_) => Ok(()),
        }
    }
    /// Tells the peer whom this rank waits on (best effort, never blocks long).
    pub fn post_stall(&mut self, notice: &StallNotice) {
        match self {
            Link::Shm(l) => l.post_stall(notice),
            Link::Tcp(l) => l.post_stall(notice),
        }
    }
    /// The header of the next data frame from this peer, without taking it
    /// (control frames ahead of it are consumed: a stall notice is noted, an
    /// abort fails). `None` while none has arrived. Only valid between
    /// receives: no receive from this peer may be in progress.
    pub fn peek_header(&mut self) -> Result<Option<WireHeader>, ErrorKind> {
        match self {
            Link::Shm(l) => Ok(l.peek_header()),
            Link::Tcp(l) => l.peek_header(),
        }
    }
    /// Background work of a TCP link with several paths: path failure and
    /// recovery, and writing chunks the link owns (see
    /// [`tcp::TcpLink::maintain`]). Nothing to do on other links.
    pub fn maintain(&mut self) -> Result<bool, ErrorKind> {
        match self {
            Link::Tcp(l) => l.maintain(),
            Link::Shm(_) => Ok(false),
        }
    }
    /// Writes what is left of queued control frames (stall notices), never
    /// blocking.
    pub fn flush_control(&mut self) {
        if let Link::Tcp(l) = self {
            l.flush_control();
        }
    }
    /// The last stall notice this peer sent, if any.
    pub fn read_stall(&self) -> Option<StallNotice> {
        match self {
            Link::Shm(l) => l.read_stall(),
            Link::Tcp(l) => l.stall.clone(),
        }
    }
    /// Tells the peer this rank failed (best effort, never blocks long).
    pub fn send_abort(&mut self, notice: &AbortNotice) {
        match self {
            Link::Shm(l) => l.send_abort(notice),
            Link::Tcp(l) => l.send_abort(notice),
        }
    }
}
