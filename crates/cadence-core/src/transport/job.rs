//! One transfer as the engine hands it to a link: where a receive's bytes go
//! (`Sink`: copied or reduced), where a send's come from (`Source`), and how
//! far each has got.

use super::{tcp, OpMeta};
use crate::copy::copy_bytes;
use crate::reduce;
use crate::types::{DType, ElemOp};

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

/// Where a message stands in its chunks (TCP; see `tcp/`). A message of
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
