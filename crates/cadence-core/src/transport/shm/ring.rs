//! The ring: a single-producer single-consumer queue of frames from one
//! same-host sender to the inbox's owner.
//!
//! - **slots and space**: `nframes` header slots (two cache lines each) and
//!   `ring_bytes` of payload space that frames take as much of as they
//!   carry. So a small message takes a header slot and a few lines, not a
//!   whole large slot, and a sender can run up to `nframes` small messages
//!   ahead of its receiver (a broadcast's root need not wait for late
//!   receivers; with 8 fixed 64 KiB slots instead, it blocked at its ninth
//!   call). The receiver owns `tail` (frames consumed, on its own cache
//!   lines), which the sender caches and rereads only when the ring looks
//!   full (reading a line the other core writes costs a cache miss).
//! - **stamp**: the k-th frame's header slot carries stamp k+1, written
//!   last; the receiver polls the stamp of the header it expects next, so it
//!   touches no separate counter (as NCCL's low-latency protocol puts flags
//!   with data). Header slots only ever hold headers, so a stale payload can
//!   never pass for a stamp.
//! - **frame**: a header ([`WireHeader`]) and up to `frame_bytes` of
//!   payload. A payload of at most 72 bytes (`INLINE_MAX`) lives in the
//!   header slot; a larger one takes the next bytes of the payload space,
//!   rounded up to a pair of cache lines, in one contiguous piece: a frame
//!   that would cross the end of the space runs on into `frame_bytes` of
//!   spill room behind it, so no frame is split and none is padded. Both
//!   sides advance the same byte position by the same rule, so the header
//!   needs no offset.
//!
//! Ordering: the sender writes a frame's payload and header, then publishes
//! it with a release store of its stamp; the receiver acquires the stamp,
//! reads the frame, and releases it with a release store of `tail`.

use super::layout::{
    ring_size, CTL_CMA_OK, CTL_TAIL, INLINE_MAX, LINE_PAIR, OFF_INLINE, OFF_STAMP, RING_CTL,
    SLOT_HDR,
};
use super::single_copy::CMA_DESC_BYTES;
use super::{Region, ShmConfig, ShmLink};
use crate::error::ErrorKind;
use crate::transport::{SendJob, WireHeader};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A sender that cannot fit the rest of a message in the payload space
/// sends a shorter frame only if it carries at least this much; smaller
/// pieces would cost a hand-off each for little data.
const MIN_PARTIAL_FRAME: usize = 4096;

/// Payload-space bytes a frame of `len` payload bytes takes: none when it
/// fits in its header slot, else whole line pairs.
pub(super) fn payload_span(len: usize) -> u64 {
    if len <= INLINE_MAX {
        0
    } else {
        len.next_multiple_of(LINE_PAIR) as u64
    }
}

/// One direction of a ring as seen by one side.
pub(super) struct RingEnd {
    pub(super) region: Arc<Region>,
    base: usize,
    pub(super) cfg: ShmConfig,
    /// Our own counter of frames (sent for the sender, consumed for the
    /// receiver; the receiver publishes it as `tail`).
    pub(super) mine: u64,
    /// Last value read of the other side's counter.
    pub(super) theirs: u64,
    /// Where in the payload space (counted from the ring's start, never
    /// wrapped) the next frame's payload goes: both sides advance it by
    /// [`payload_span`] of each frame's length.
    pub(super) pos: u64,
    /// The sender's record of where each frame in flight begins in the
    /// payload space (frame k at `k % nframes`), so that a moved `tail`
    /// says how much space came free.
    starts: Vec<u64>,
    /// How much of the ring this side has mapped ([`RingEnd::resident`]):
    /// nothing, the control and header slots, or all of it.
    resident: Resident,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Resident {
    Nothing,
    Slots,
    All,
}

impl RingEnd {
    pub(super) fn new(region: Arc<Region>, base: usize, cfg: ShmConfig) -> RingEnd {
        RingEnd {
            region,
            base,
            cfg,
            mine: 0,
            theirs: 0,
            pos: 0,
            starts: vec![0; cfg.nframes],
            resident: Resident::Nothing,
        }
    }
    /// Maps the ring's pages on this side on first use (allocating them in
    /// the inbox file if the other side has not): its control and header
    /// slots for a message that fits a slot (`INLINE_MAX`), all of it for
    /// a larger one. So a host's shared memory grows with the pairs that
    /// talk, and a pair that only ever passes small messages (a barrier's)
    /// takes a few pages. Fails when /dev/shm is full.
    pub(super) fn resident(&mut self, message_len: usize) -> std::io::Result<()> {
        let want = if message_len <= INLINE_MAX {
            Resident::Slots
        } else {
            Resident::All
        };
        if self.resident < want {
            let slots = RING_CTL + self.cfg.nframes * SLOT_HDR;
            let len = match want {
                Resident::All => ring_size(&self.cfg),
                _ => slots,
            };
            self.region.populate(self.base, len)?;
            self.resident = want;
        }
        Ok(())
    }
    /// The stamp of the header slot that holds frame `n`.
    pub(super) fn stamp(&self, n: u64) -> &AtomicU64 {
        self.region.atomic_u64(self.header(n) + OFF_STAMP)
    }
    pub(super) fn tail(&self) -> &AtomicU64 {
        self.region.atomic_u64(self.base + CTL_TAIL)
    }
    pub(super) fn ctl_u64(&self, off: usize) -> &AtomicU64 {
        self.region.atomic_u64(self.base + off)
    }

    pub(super) fn cma_ok(&self) -> &AtomicU32 {
        self.region.atomic_u32(self.base + CTL_CMA_OK)
    }
    /// The header slot of frame `n`.
    pub(super) fn header(&self, n: u64) -> usize {
        self.base + RING_CTL + self.frame_index(n) * SLOT_HDR
    }
    /// `n % nframes`; both are powers of two (a mask, not a division: the
    /// small-message path computes this several times a frame).
    fn frame_index(&self, n: u64) -> usize {
        (n & (self.cfg.nframes as u64 - 1)) as usize
    }
    /// Where the payload of `len` bytes of the frame at `self.pos` lives.
    pub(super) fn payload(&self, n: u64, len: usize) -> usize {
        if len <= INLINE_MAX {
            self.header(n) + OFF_INLINE
        } else {
            self.base
                + RING_CTL
                + self.cfg.nframes * SLOT_HDR
                + (self.pos & (self.cfg.ring_bytes as u64 - 1)) as usize
        }
    }
    /// The sender's free payload space if the receiver has consumed
    /// `tail` frames.
    pub(super) fn free_bytes(&self, tail: u64) -> usize {
        let consumed = if tail >= self.mine {
            self.pos
        } else {
            self.starts[self.frame_index(tail)]
        };
        self.cfg.ring_bytes - (self.pos - consumed) as usize
    }
    /// The sender's length for the next frame of a message with `left`
    /// bytes to go, if the ring has room for it now (rereading `tail` only
    /// when the cached value says it is full): the rest, or as much of it
    /// as fits and at least `MIN_PARTIAL_FRAME`; the bytes it would need
    /// when there is no room.
    pub(super) fn room(&mut self, left: usize) -> Result<usize, usize> {
        let want = left.min(self.cfg.frame_bytes);
        let need = if want <= INLINE_MAX {
            0
        } else {
            want.min(MIN_PARTIAL_FRAME).next_multiple_of(LINE_PAIR)
        };
        for reread in [false, true] {
            if reread {
                self.theirs = self.tail().load(Ordering::Acquire);
            }
            if self.mine - self.theirs >= self.cfg.nframes as u64 {
                continue;
            }
            let free = self.free_bytes(self.theirs);
            if payload_span(want) as usize <= free {
                return Ok(want);
            }
            if free >= need {
                return Ok(free / LINE_PAIR * LINE_PAIR);
            }
        }
        Err(need)
    }
    /// The sender's bookkeeping once frame `mine` with `len` payload bytes
    /// is published.
    fn sent(&mut self, len: usize) {
        let i = self.frame_index(self.mine);
        self.starts[i] = self.pos;
        self.pos += payload_span(len);
        self.mine += 1;
    }
}

impl ShmLink {
    /// Writes a frame (payload, then header, then the stamp that publishes
    /// both) at the sender's next position, for which `room` said yes.
    pub(super) fn publish(&mut self, hdr: &WireHeader, payload: &[u8]) {
        let n = self.tx.mine;
        self.tx
            .region
            .write(self.tx.payload(n, payload.len()), payload);
        self.tx
            .region
            .write(self.tx.header(n), bytemuck::bytes_of(hdr));
        self.tx.stamp(n).store(n + 1, Ordering::Release);
        self.tx.sent(payload.len());
        self.wake_peer();
    }

    /// Streams a message through the ring: as many frames as there is room
    /// for now. True when any moved.
    pub(super) fn send_frames(&mut self, job: &mut SendJob) -> bool {
        let total = job.src.len();
        let mut progressed = false;
        while !job.done {
            let n = match self.tx.room(total - job.sent) {
                Ok(n) => n,
                Err(need) => {
                    self.tx_need = need;
                    break;
                }
            };
            let hdr = job.meta.header(n);
            self.publish(&hdr, job.src.bytes(job.sent, n));
            job.sent += n;
            job.started = true;
            job.done = job.sent == total;
            progressed = true;
            self.stats.bytes_sent.add(n as u64);
        }
        if job.done && progressed {
            self.stats.msgs_sent.add(1);
        }
        progressed
    }

    /// A received frame's payload length, refused when it could not have
    /// come from a sender of this ring (it would reach past the spill room).
    pub(super) fn frame_len(&self, hdr: &WireHeader) -> Result<usize, ErrorKind> {
        let max = self.rx.cfg.frame_bytes.max(CMA_DESC_BYTES) as u64;
        if hdr.len > max {
            return Err(ErrorKind::Garbage {
                peer: self.peer,
                detail: format!(
                    "a {}-byte shared-memory frame (frames carry at most {max})",
                    hdr.len
                ),
            });
        }
        Ok(hdr.len as usize)
    }

    /// Releases the receiver's next frame (of `len` payload bytes) to the
    /// sender.
    pub(super) fn release(&mut self, len: usize) {
        self.rx.mine += 1;
        self.rx.pos += payload_span(len);
        self.rx.tail().store(self.rx.mine, Ordering::Release);
        // The sender may sleep waiting for room.
        self.wake_peer();
    }
}
