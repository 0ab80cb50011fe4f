//! Shared-memory transport between ranks on one host.
//!
//! Terms:
//! - **inbox**: a file in `/dev/shm` that one rank creates and maps; it holds
//!   one ring per same-host sender plus a header (pid, abort notice, ...).
//! - **ring**: a single-producer single-consumer queue of **frames** (a
//!   header and its payload) from one sender to the inbox's owner, in header
//!   slots and a payload space; a frame is published by its slot's **stamp**.
//! - **single copy**: a large message crosses as one *rendezvous* frame
//!   naming the sender's buffer, which the receiver reads with
//!   `process_vm_readv(2)`; the sender may **help** by writing chunks of it.
//! - **doorbell**: the futex in each inbox that a rank sleeps on when it has
//!   waited long, rung by whoever publishes something it waits for.
//!
//! The files follow the layers a message crosses, one concern each:
//! - `layout.rs`: where every byte of an inbox lives (the offsets are the
//!   protocol between processes, so they are in one table, checked for
//!   overlaps at compile time);
//! - `sys.rs`: the mapped file and the system calls, every `unsafe` of the
//!   transport;
//! - `inbox.rs`: creating, opening and unlinking inbox files;
//! - `ring.rs`: the ring's arithmetic and frames in and out;
//! - `single_copy.rs`: rendezvous and reads of the sender's memory;
//! - `help.rs`: the sender writing chunks of a single copy (offer, claims,
//!   revoke);
//! - `doorbell.rs`: sleeping and waking;
//! - `notice.rs`: what a rank tells its peers through the inbox header
//!   (abort, stall, progress);
//! - here: [`ShmLink`], the face the engine sees, which decides per message
//!   between the ring and single copy, and the configuration.
//!
//! `ShmLink`'s fields are declared here; its methods live with their
//! concern, in an `impl ShmLink` block of the file above that owns it, so
//! that a reader of the ring protocol, say, finds all of it in `ring.rs`.
//! What the rest of the crate uses is re-exported here, under
//! `transport::shm`.

mod doorbell;
mod help;
mod inbox;
mod layout;
mod notice;
mod ring;
mod single_copy;
mod sys;
#[cfg(test)]
mod tests;

pub use inbox::{open_peer_inbox, Inbox};
pub use notice::{post_abort, Progress};
pub use sys::{pid_alive, Region};

use super::{
    AbortNotice, LinkCounters, RecvJob, SendJob, StallNotice, WireHeader, FRAME_CMA, FRAME_DATA,
    HEADER_BYTES,
};
use crate::error::ErrorKind;
use crate::types::CollKind;
use help::HelpRx;
use inbox::{geometry, ring_count};
use layout::{ring_offset, ring_size, LINE_PAIR};
use ring::RingEnd;
use single_copy::{can_read_peer, CMA_DESC_BYTES};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Ring geometry. Larger frames mean fewer hand-offs per byte; the payload
/// space bounds the data in flight, the header slots the messages in
/// flight. 512 KiB keeps a ring's working set near L2 size; 64 header slots
/// let a sender run well ahead of its receiver on small messages (a
/// benchmark's batch of 16 calls, a training step's burst of small
/// tensors).
#[derive(Clone, Copy, Debug)]
pub struct ShmConfig {
    /// The largest payload one frame carries (a multiple of 128).
    pub frame_bytes: usize,
    /// Header slots per ring: frames in flight (a power of two).
    pub nframes: usize,
    /// Payload space per ring (a power of two, at least `frame_bytes`).
    pub ring_bytes: usize,
    /// Messages of at least this many bytes go by single copy when the
    /// receiver can read this rank's memory (0: never).
    pub cma_min: usize,
    /// The collectives whose `SendJob::prefer_stream` messages stream
    /// through the ring at any size instead of going by single copy.
    pub stream: Streamed,
}

/// Which collectives stream their large messages through the ring rather
/// than by single copy (see `engine::prefers_stream`; `CADENCE_SHM_STREAM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Streamed {
    pub reduce: bool,
    pub broadcast: bool,
}

impl Streamed {
    pub const NONE: Streamed = Streamed {
        reduce: false,
        broadcast: false,
    };

    /// Reduce streams: on 2 cores it was mostly faster than single copy
    /// from 256 KiB. Broadcast won as often as it lost, so it keeps single
    /// copy.
    pub const DEFAULT: Streamed = Streamed {
        reduce: true,
        broadcast: false,
    };

    fn takes(&self, coll: CollKind) -> bool {
        match coll {
            CollKind::Reduce => self.reduce,
            CollKind::Broadcast => self.broadcast,
            _ => false,
        }
    }
}

impl ShmConfig {
    /// What the ring arithmetic relies on (the configuration checks it; a
    /// peer's inbox is checked again before its rings are used).
    pub fn is_valid(&self) -> bool {
        self.frame_bytes > 0
            && self.frame_bytes.is_multiple_of(LINE_PAIR)
            && self.nframes >= 2
            && self.nframes.is_power_of_two()
            && self.ring_bytes.is_power_of_two()
            && self.ring_bytes >= self.frame_bytes
    }
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            frame_bytes: 64 * 1024,
            nframes: 64,
            ring_bytes: 512 * 1024,
            cma_min: 256 * 1024,
            stream: Streamed::DEFAULT,
        }
    }
}

/// Both directions between this rank and one same-host peer.
pub struct ShmLink {
    pub peer: usize,
    my_local: usize,
    peer_local: usize,
    /// Rings (= stall slots) in each inbox.
    my_nrings: usize,
    peer_nrings: usize,
    my_inbox: Arc<Region>,
    peer_pid: u32,
    tx: RingEnd,
    rx: RingEnd,
    peer_inbox: Arc<Region>,
    pub stats: Arc<LinkCounters>,
    /// This rank's single-copy threshold (see `single_copy.rs`; 0: off).
    cma_min: usize,
    /// Whose `prefer_stream` messages stay in the ring (`ShmConfig::stream`).
    stream: Streamed,
    /// A single-copy send in flight: the `tail` that says the receiver is
    /// done with its buffer (messages to a peer go in order, so one at most).
    cma_wait: Option<u64>,
    /// Payload bytes the send in progress waits to find free (see
    /// [`ShmLink::tx_ready`]).
    tx_need: usize,
    /// A single-copy receive in flight: the job's byte count when its
    /// rendezvous slot was first read (the sender's buffer offset 0).
    cma_rx_start: Option<usize>,
    /// Scratch for reducing receives read by single copy.
    cma_scratch: Vec<u8>,
    /// A single-copy receive the sender may help with.
    help_rx: Option<HelpRx>,
    /// Whether this rank still helps its receiver (cleared after a write
    /// into the peer's memory failed).
    help_tx_ok: bool,
}

impl ShmLink {
    /// `my_inbox`: this rank's inbox; `peer_inbox`: the peer's, with its pid;
    /// `my_local`/`peer_local`: local indices (which ring is whose).
    pub fn new(
        peer: usize,
        my_inbox: &Inbox,
        peer_inbox: Arc<Region>,
        peer_pid: u32,
        my_local: usize,
        peer_local: usize,
    ) -> ShmLink {
        let peer_cfg = geometry(&peer_inbox, my_inbox.cfg.cma_min);
        let peer_nrings = ring_count(&peer_inbox);
        let tx = RingEnd::new(
            peer_inbox.clone(),
            ring_offset(peer_nrings, &peer_cfg, my_local),
            peer_cfg,
        );
        let rx = RingEnd::new(
            my_inbox.region.clone(),
            ring_offset(my_inbox.nrings, &my_inbox.cfg, peer_local),
            my_inbox.cfg,
        );
        // Tell the peer whether we can read its memory (single copy).
        if my_inbox.cfg.cma_min > 0 {
            let readable = can_read_peer(&peer_inbox, peer_pid);
            rx.cma_ok().store(readable as u32, Ordering::Release);
        }
        ShmLink {
            peer,
            my_local,
            peer_local,
            my_nrings: my_inbox.nrings,
            peer_nrings,
            my_inbox: my_inbox.region.clone(),
            peer_pid,
            tx,
            rx,
            peer_inbox,
            stats: LinkCounters::new(peer, "shm"),
            cma_min: my_inbox.cfg.cma_min,
            stream: my_inbox.cfg.stream,
            cma_wait: None,
            tx_need: 0,
            cma_rx_start: None,
            cma_scratch: Vec::new(),
            help_rx: None,
            help_tx_ok: true,
        }
    }

    /// Whether messages to this peer may go by single copy.
    pub fn single_copy(&self) -> bool {
        self.cma_min > 0 && self.tx.cma_ok().load(Ordering::Acquire) == 1
    }

    /// Moves a send on: a single copy in flight is waited for (and helped
    /// with); a new message goes by single copy or streams through the ring.
    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        self.tx
            .resident(job.src.len())
            .map_err(|e| self.no_room(true, e))?;
        if let Some(until) = self.cma_wait {
            return self.await_rendezvous(job, until);
        }
        if !job.started && self.goes_by_single_copy(job) {
            return Ok(self.send_rendezvous(job));
        }
        Ok(self.send_frames(job))
    }

    /// Moves a receive on: takes the ring's frames in order, or reads the
    /// message a rendezvous frame names.
    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        let total = job.sink.len();
        self.rx
            .resident(total)
            .map_err(|e| self.no_room(false, e))?;
        let mut progressed = false;
        while !job.done {
            let n = self.rx.mine;
            if self.rx.stamp(n).load(Ordering::Acquire) != n + 1 {
                break;
            }
            let hdr: WireHeader =
                bytemuck::pod_read_unaligned(self.rx.region.read(self.rx.header(n), HEADER_BYTES));
            if hdr.frame == FRAME_CMA {
                return self.recv_single_copy(job, hdr).map(|p| p || progressed);
            }
            job.meta.check_frame(&hdr, self.peer, total - job.got)?;
            let len = self.frame_len(&hdr)?;
            job.sink
                .deliver(job.got, self.rx.region.read(self.rx.payload(n, len), len));
            self.release(len);
            job.got += len;
            job.started = true;
            job.done = job.got == total;
            progressed = true;
            self.stats.bytes_recv.add(len as u64);
        }
        if job.done && progressed {
            self.stats.msgs_recv.add(1);
        }
        Ok(progressed)
    }

    /// Why a ring could not get its pages on first use.
    fn no_room(&self, send: bool, e: std::io::Error) -> ErrorKind {
        let (whose, cfg) = if send {
            (format!("rank {}'s", self.peer), &self.tx.cfg)
        } else {
            ("this rank's".to_string(), &self.rx.cfg)
        };
        ErrorKind::Failed {
            detail: format!(
                "cannot map the {} KiB ring from {} in {whose} shared-memory inbox ({e}): \
                 {}",
                ring_size(cfg) >> 10,
                if send { "this rank" } else { "the peer" },
                inbox::NO_ROOM_HINT
            ),
            culprit: None,
        }
    }

    /// The header of the next frame in the ring, if one is published; the
    /// frame stays there. A rendezvous frame shows as the data frame it
    /// stands for (its length the whole message's).
    pub fn peek_header(&self) -> Option<WireHeader> {
        if !self.rx_ready() {
            return None;
        }
        let hdr: WireHeader = bytemuck::pod_read_unaligned(
            self.rx
                .region
                .read(self.rx.header(self.rx.mine), HEADER_BYTES),
        );
        if hdr.frame != FRAME_CMA || hdr.len != CMA_DESC_BYTES as u64 {
            return Some(hdr);
        }
        let desc = self.rendezvous_desc();
        Some(WireHeader {
            frame: FRAME_DATA,
            len: desc.len,
            ..hdr
        })
    }

    pub fn rx_ready(&self) -> bool {
        self.rx.stamp(self.rx.mine).load(Ordering::Acquire) == self.rx.mine + 1
    }

    /// Whether a send to this peer could move now (the ring has room for
    /// the frame the send waits to write, or the receiver finished reading
    /// a single-copy send).
    pub fn tx_ready(&self) -> bool {
        let tail = self.tx.tail().load(Ordering::Acquire);
        match self.cma_wait {
            Some(until) => tail >= until,
            None => {
                self.tx.mine - tail < self.tx.cfg.nframes as u64
                    && self.tx.free_bytes(tail) >= self.tx_need
            }
        }
    }

    /// Whether the peer process still exists (a zombie counts as dead).
    pub fn check_alive(&mut self) -> Result<(), ErrorKind> {
        if pid_alive(self.peer_pid) {
            Ok(())
        } else {
            Err(ErrorKind::PeerDied {
                peer: self.peer,
                pid: self.peer_pid,
            })
        }
    }

    /// Where the peer stands in its collectives (what it last published).
    pub fn peer_progress(&self) -> Progress {
        notice::read_progress(&self.peer_inbox)
    }

    /// Writes this rank's stall notice into the peer's stall table.
    pub fn post_stall(&mut self, n: &StallNotice) {
        if self.my_local >= self.peer_nrings {
            return; // not a sender the peer's inbox has a ring for
        }
        notice::write_stall(&self.peer_inbox, self.my_local, n);
    }

    /// The peer's stall notice, from this rank's own stall table.
    pub fn read_stall(&self) -> Option<StallNotice> {
        if self.peer_local >= self.my_nrings {
            return None;
        }
        notice::read_stall(&self.my_inbox, self.peer_local)
    }

    /// Leaves an abort notice in the peer's inbox (first notice wins). The
    /// one failure path: a receive this peer was helping with is taken back
    /// first (`revoke_help`).
    pub fn send_abort(&mut self, notice: &AbortNotice) {
        self.revoke_help();
        post_abort(&self.peer_inbox, notice);
        // A peer asleep on its doorbell learns it now, not when its nap
        // ends (naps are long when ranks crowd the cores).
        self.wake_peer();
    }
}
