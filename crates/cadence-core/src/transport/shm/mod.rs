//! Shared-memory transport between ranks on one host.
//!
//! Terms:
//! - **inbox**: a file in `/dev/shm` that one rank creates and maps; it holds
//!   one ring per same-host sender plus a header (pid, abort notice). Each rank
//!   creates only its own inbox, so creation never races; peers open it, and it
//!   is unlinked once everyone has mapped it, so a crash leaves nothing behind.
//! - **ring**: a single-producer single-consumer queue of frames, in two
//!   parts: `nframes` header slots (two cache lines each) and `ring_bytes` of
//!   payload space that frames take as much of as they carry. So a small
//!   message takes a header slot and a few lines, not a whole large slot,
//!   and a sender can run up to `nframes` small messages ahead of its
//!   receiver (a broadcast's root need not wait for late receivers; with 8
//!   fixed 64 KiB slots it blocked at its ninth call). The receiver owns
//!   `tail` (frames consumed, on its own cache lines), which the sender
//!   caches and rereads only when the ring looks full (reading a line the
//!   other core writes costs a cache miss).
//! - **stamp**: the k-th frame's header slot carries stamp k+1, written
//!   last; the receiver polls the stamp of the header it expects next, so it
//!   touches no separate counter (as NCCL's low-latency protocol puts flags
//!   with data). Header slots only ever hold headers, so a stale payload can
//!   never pass for a stamp.
//! - **frame**: a header ([`WireHeader`]) and up to `frame_bytes` of
//!   payload. A payload of at most 72 bytes lives in the header slot; a
//!   larger one takes the next bytes of the payload space, rounded up to a
//!   pair of cache lines, in one contiguous piece: a frame that would cross the end
//!   of the space runs on into `frame_bytes` of spill room behind it, so no
//!   frame is split and none is padded. Both sides advance the same byte
//!   position by the same rule, so the header needs no offset.
//!
//! Sleeping: a rank that has waited long (ranks outnumber cores) sleeps on the
//! futex **doorbell** in its own inbox after raising its `sleeping` flag and
//! re-checking its rings; whoever publishes into one of its rings, or frees a
//! slot it waits for, rings the doorbell when the flag is up.
//!
//! Ordering: the sender writes a frame's payload and header, then publishes
//! it with a release store of its stamp; the receiver acquires the stamp,
//! reads the frame, and releases it with a release store of `tail`.
//!
//! **Single copy** (large messages): through a ring a message is copied
//! twice, into the slot by the sender and out of it by the receiver. From
//! `ShmConfig::cma_min` bytes (256 KiB) the sender instead publishes one
//! *rendezvous* slot (frame `FRAME_CMA`) that names its buffer (pid, address,
//! length), and the receiver copies straight from the sender's memory into
//! its destination with `process_vm_readv(2)` (cross-memory attach, as Open
//! MPI's shared-memory transport does), reducing on the way when the receive
//! reduces. Releasing the slot tells the sender its buffer is free again. A
//! receiver that can read its sender says so once, at set-up, in the ring's
//! control line (`cma_ok`, after a test read of the sender's inbox through
//! the sender's address space); without it (containers that forbid the
//! call, `CADENCE_SHM_CMA_MIN=0`) the ring carries everything.
//!
//! Single copy leaves the sender's core idle while the receiver's copies.
//! Where the sender has nothing else to do or the receiver reduces (reduce,
//! broadcast: `engine::prefers_stream` marks their jobs `prefer_stream`),
//! streaming through the ring puts two cores on each message instead. The
//! collectives in `ShmConfig::stream` (`CADENCE_SHM_STREAM`; default: reduce)
//! then keep such messages in the ring whatever their size.
//!
//! **Two cores on one single copy.** A message of `HELP_MIN` (2 MiB) or
//! more that goes straight into the destination is offered to the sender
//! too: the receiver writes its destination's address, the length and a
//! chunk size into the ring's control line (`CTL_HELP_*`) and both sides
//! claim chunks from one counter with a compare-and-swap; the receiver
//! reads its chunks (`process_vm_readv`), the sender, which polls its
//! rendezvous while it waits, writes its own (`process_vm_writev`) and
//! counts them done. The receiver releases the rendezvous once every chunk
//! is in, so the sender writes only while the receiver's call is running;
//! a receiver that fails takes the offer back and waits for the chunks the
//! sender has claimed before its caller gets the memory back
//! (`revoke_help`). The offer rings the sender's doorbell: a sender that
//! came early has stopped polling and sleeps (without the wake-up, a
//! receiver 20 ms late was never helped). A sender that is busy elsewhere
//! claims nothing, and the receiver reads it all, as before. Measured: a
//! 2-rank 16 MiB broadcast 1.8-2x faster than by the receiver alone
//! (docs/benchmarks.md).

use super::{
    AbortNotice, LinkCounters, RecvJob, SendJob, StallNotice, WireHeader, ABORT_TEXT_MAX,
    FRAME_CMA, FRAME_DATA, HEADER_BYTES, STALL_CHAIN_MAX,
};
use crate::copy::{copy_bytes, shifted_ahead, window_aligned_like};
use crate::error::ErrorKind;
use crate::types::CollKind;
use memmap2::MmapRaw;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INBOX_MAGIC: u64 = 0x5842_4e49_4e44_4443; // "CDNINBX" + tag
/// The smallest header (one page); a file shorter than this is not an inbox yet.
const MIN_HDR_SIZE: usize = 4096;
// The inbox header's layout. Every field is listed in `HEADER_FIELDS` below,
// and a compile-time check proves no two of them overlap (a doorbell once sat
// inside the abort text, and every wake-up wrote four bytes over the reason).
const OFF_MAGIC: usize = 0;
const OFF_PID: usize = 8;
const OFF_NRINGS: usize = 16;
// The rings' geometry ([`ShmConfig`]), which senders read from here.
const OFF_FRAME_BYTES: usize = 20;
const OFF_NFRAMES: usize = 24;
const OFF_RING_BYTES: usize = 28;
/// Where the owner mapped this inbox in its own address space: a peer reads
/// the magic there through `process_vm_readv` to learn whether it may read
/// the owner's memory (single copy).
const OFF_SELF_ADDR: usize = 32;
const OFF_ABORT_FLAG: usize = 64;
const OFF_ABORT_ORIGIN: usize = 68;
const OFF_ABORT_LEN: usize = 72;
const OFF_ABORT_MISMATCH: usize = 76; // u32: 1 when the three fields below are set
const OFF_ABORT_BLAMED_SIG: usize = 80;
const OFF_ABORT_DETECTOR_SIG: usize = 88;
const OFF_ABORT_DETECTOR: usize = 96;
/// Doorbell: a futex word peers bump (and wake) after publishing something
/// this rank may be sleeping on, and the flag saying it sleeps. On its own
/// cache line: peers read the flag after every publish, and it only changes
/// when this rank goes to sleep, so the read is a cache hit.
const OFF_DOORBELL: usize = 128;
const OFF_SLEEPING: usize = 132;
/// Where this rank stands in its collectives ([`Progress`]), on a line of
/// its own: written by the owner at each operation's start, phase and end,
/// read by a peer only when it times out waiting for the owner.
const OFF_PROGRESS: usize = 192;
/// The abort notice's text (UTF-8, `OFF_ABORT_LEN` bytes).
const OFF_ABORT_MSG: usize = 256;
const ABORT_MSG_MAX: usize = ABORT_TEXT_MAX;
/// Stall table: one slot per ring, i.e. per same-host sender by local index
/// (the header grows with the number of rings: see [`header_size`]), each
/// `[len u32 (0 = empty; written last), pad u32, seq u64, chain u32 × 6]`.
const OFF_STALL: usize = 2304;
const STALL_SLOT: usize = 48;

/// The header's size for `nrings` rings: the fixed fields, then one stall
/// slot per ring, rounded up to a page (one page up to 37 rings).
fn header_size(nrings: usize) -> usize {
    (OFF_STALL + nrings * STALL_SLOT)
        .next_multiple_of(4096)
        .max(MIN_HDR_SIZE)
}

/// (offset, bytes) of every fixed header field, in address order.
const HEADER_FIELDS: [(usize, usize); 18] = [
    (OFF_MAGIC, 8),
    (OFF_PID, 4),
    (OFF_NRINGS, 4),
    (OFF_FRAME_BYTES, 4),
    (OFF_NFRAMES, 4),
    (OFF_RING_BYTES, 4),
    (OFF_SELF_ADDR, 8),
    (OFF_ABORT_FLAG, 4),
    (OFF_ABORT_ORIGIN, 4),
    (OFF_ABORT_LEN, 4),
    (OFF_ABORT_MISMATCH, 4),
    (OFF_ABORT_BLAMED_SIG, 8),
    (OFF_ABORT_DETECTOR_SIG, 8),
    (OFF_ABORT_DETECTOR, 4),
    (OFF_DOORBELL, 4),
    (OFF_SLEEPING, 4),
    (OFF_PROGRESS, 8),
    (OFF_ABORT_MSG, ABORT_MSG_MAX),
];

/// Each field ends before the next begins, and the last before the stall table.
const fn header_fields_disjoint() -> bool {
    let mut i = 1;
    while i < HEADER_FIELDS.len() {
        let (prev_off, prev_len) = HEADER_FIELDS[i - 1];
        if prev_off + prev_len > HEADER_FIELDS[i].0 {
            return false;
        }
        i += 1;
    }
    let (last_off, last_len) = HEADER_FIELDS[HEADER_FIELDS.len() - 1];
    last_off + last_len <= OFF_STALL
}
const _: () = assert!(header_fields_disjoint(), "inbox header fields overlap");
/// The unit the rings are laid out in: two cache lines, the pair that
/// x86's spatial prefetcher fetches together. Keeping what one side writes
/// and what the other side polls in different pairs keeps the prefetcher
/// from pulling a line into the reader's cache just before the writer needs
/// it back (64-byte header slots in a row made a 2-rank ping-pong 10–25 %
/// slower at 8–2048 bytes).
const LINE_PAIR: usize = 128;
/// Ring control: the receiver's `tail`, alone on its line pair, and
/// (`CTL_CMA_OK`, written once at set-up) whether the receiver can read the
/// sender's memory.
const RING_CTL: usize = LINE_PAIR;
const CTL_CMA_OK: usize = 8;
/// The ring control's second line: a single-copy receive that lets its
/// sender help (see "Two cores on one single copy" in the module notes).
/// `tag << 32 | next chunk` that either side claims with a compare-and-swap;
/// `tag << 32 | chunks` the sender has written; where the helped range
/// starts in the receiver's memory and its length; `tag << 32 | chunk + 1`
/// of a chunk the sender failed to write (the receiver reads it itself).
/// The tag is the rendezvous frame's number + 1 (low 32 bits, never 0), so
/// words left from an earlier message never match. The chunk size comes
/// last.
const CTL_HELP_CLAIM: usize = 64;
const CTL_HELP_DONE: usize = 72;
const CTL_HELP_DST: usize = 80;
const CTL_HELP_LEN: usize = 88;
const CTL_HELP_FAILED: usize = 96;
const CTL_HELP_CHUNK: usize = 104;
/// Single-copy messages from this size let the sender help.
const HELP_MIN: usize = 2 << 20;
/// The helped message goes in chunks, each read by the receiver or written
/// by the sender, whichever claims it first: an eighth of the message (the
/// slower side finishes at most a chunk after the other), from 1 MiB (a
/// system call's fixed cost) to 4 MiB (`CMA_DIRECT_CHUNK`), whole pages.
fn help_chunk(len: usize) -> usize {
    (len / 8)
        .clamp(1 << 20, CMA_DIRECT_CHUNK)
        .next_multiple_of(4096)
}
/// How long a failing receiver waits for a chunk the sender is writing
/// into its memory before it gives the memory back to its caller anyway (a
/// chunk takes about 0.1 ms).
const HELP_DRAIN: Duration = Duration::from_secs(1);
/// A rendezvous frame's payload: `[pid u32, pad u32, address u64, length u64]`.
const CMA_DESC_BYTES: usize = 24;
/// Bytes a receiver copies per call while it reads a sender's buffer
/// through its scratch buffer (reducing receives, and destinations shifted
/// within a line from the source): the scratch stays in cache, and the
/// engine moves its other transfers in between.
const CMA_CHUNK: usize = 256 * 1024;
/// Bytes a receiver reads per call straight into the destination. Each
/// `process_vm_readv` has a fixed cost (the permission check, pinning the
/// first pages): 16 MiB between two processes took 1.2-1.6x as long in 256
/// KiB reads as in 4 MiB ones on this project's 2-core host (5.5-8 against
/// 7.2-11 GB/s; `benchmarks/cma_chunks.py`), and one 16 MiB read gained
/// 5-10 % more. A 4 MiB read takes about half a millisecond, which bounds
/// how long the engine leaves its other transfers.
const CMA_DIRECT_CHUNK: usize = 4 << 20;
/// A header slot, a line pair: the frame header (48 bytes), the stamp (8
/// bytes) and up to 72 bytes of inline payload. Payloads of at most
/// `INLINE_MAX` bytes live in the slot, so small messages cost the
/// receiver the two lines the prefetcher brings together; larger ones live
/// in the payload space.
const SLOT_HDR: usize = LINE_PAIR;
const OFF_STAMP: usize = 48;
const OFF_INLINE: usize = 56;
const INLINE_MAX: usize = SLOT_HDR - OFF_INLINE;
/// A sender that cannot fit the rest of a message in the payload space
/// sends a shorter frame only if it carries at least this much; smaller
/// pieces would cost a hand-off each for little data.
const MIN_PARTIAL_FRAME: usize = 4096;

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

    /// Reduce streams: on 2 cores it was 1.5–3× faster than single copy from
    /// 256 KiB in most alternated runs, 1.1× slower in the rest. Broadcast
    /// won as often as it lost (by up to 1.9×), so it keeps single copy.
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

/// Where a rank stands in its collectives, as its inbox tells same-host
/// peers: which one (its sequence number, 0 before the first), whether it is
/// inside it, and in which phase. A peer that times out waiting for this
/// rank reads it to say whether the rank is in the same operation, still in
/// an earlier one, or has not started it (busy outside the library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub seq: u64,
    pub running: bool,
    pub phase: u32,
}

impl Progress {
    const PHASE_MAX: u32 = (1 << 23) - 1;

    /// `seq` in the top 40 bits, the phase (saturated) in the next 23,
    /// `running` in bit 0.
    fn encode(self) -> u64 {
        (self.seq << 24) | ((self.phase.min(Self::PHASE_MAX) as u64) << 1) | self.running as u64
    }

    fn decode(w: u64) -> Progress {
        Progress {
            seq: w >> 24,
            running: w & 1 == 1,
            phase: ((w >> 1) as u32) & Self::PHASE_MAX,
        }
    }

    /// How `peer` stands toward this rank's collective `seq`, as a clause
    /// for the error of a wait on it.
    pub fn describe(self, peer: usize, seq: u64) -> String {
        use std::cmp::Ordering::*;
        match (self.seq.cmp(&seq), self.running) {
            (Equal, true) => format!("rank {peer} is in it too, in its phase {}", self.phase),
            (Equal, false) => format!("rank {peer} has finished it"),
            (Less, _) if self.seq == 0 => {
                format!("rank {peer} has not started it: it has run no collective yet")
            }
            (Less, true) => format!(
                "rank {peer} is still in an earlier collective (#{}, its phase {})",
                self.seq, self.phase
            ),
            (Less, false) => format!(
                "rank {peer} has not started it: its last collective (#{}{}) is done, \
                 so it is busy outside cadence",
                self.seq,
                // Every communicator's set-up ends with a barrier, its #1.
                if self.seq == 1 {
                    ", the set-up's barrier"
                } else {
                    ""
                }
            ),
            (Greater, _) => format!("rank {peer} is past it, in collective #{}", self.seq),
        }
    }
}

/// Payload-space bytes a frame of `len` payload bytes takes: none when it
/// fits in its header slot, else whole line pairs.
fn payload_span(len: usize) -> u64 {
    if len <= INLINE_MAX {
        0
    } else {
        len.next_multiple_of(LINE_PAIR) as u64
    }
}

/// A ring's bytes: control line, header slots, payload space and the spill
/// room a frame that starts near the end runs on into.
fn ring_size(cfg: &ShmConfig) -> usize {
    let spill = cfg.frame_bytes.next_multiple_of(LINE_PAIR);
    (RING_CTL + cfg.nframes * SLOT_HDR + cfg.ring_bytes + spill).next_multiple_of(4096)
}

/// A mapped inbox file.
pub struct Region {
    map: MmapRaw,
    path: PathBuf,
    owner: bool,
    unlinked: AtomicU32,
}

impl Region {
    fn ptr(&self, off: usize) -> *mut u8 {
        assert!(off < self.map.len());
        // SAFETY: `off` is within the mapping (checked above).
        unsafe { self.map.as_mut_ptr().add(off) }
    }

    fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.map.len());
        // SAFETY: the mapping is page-aligned and lives as long as `self`; the
        // offset is 8-aligned and in bounds (checked). Every process touches
        // this word only through atomics.
        unsafe { &*(self.ptr(off) as *const AtomicU64) }
    }

    fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.map.len());
        // SAFETY: as in `atomic_u64`, for a 4-aligned word.
        unsafe { &*(self.ptr(off) as *const AtomicU32) }
    }

    /// Copies `src` into the mapping at `off`.
    fn write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.map.len());
        // SAFETY: in bounds (checked); the ring protocol gives the writer
        // exclusive use of these bytes until it publishes them, so no other
        // reference to them exists while this one lives.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr(off), src.len()) };
        copy_bytes(dst, src);
    }

    /// Views `len` bytes at `off`.
    fn read(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.map.len());
        // SAFETY: in bounds (checked); the ring protocol guarantees the writer
        // does not touch these bytes until the reader releases them, which it
        // does only after this borrow ends (callers drop it before `tail` moves).
        unsafe { std::slice::from_raw_parts(self.ptr(off), len) }
    }

    /// Removes the file name (the mapping stays valid).
    pub fn unlink(&self) {
        if self.owner && self.unlinked.swap(1, Ordering::AcqRel) == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// This rank's own inbox.
pub struct Inbox {
    pub region: Arc<Region>,
    pub cfg: ShmConfig,
    nrings: usize,
}

impl Inbox {
    /// Creates the inbox file with `nrings` rings (one per same-host rank,
    /// indexed by local rank; the own one is unused).
    pub fn create(path: &Path, nrings: usize, cfg: ShmConfig) -> Result<Inbox, String> {
        if !cfg.is_valid() {
            return Err(format!("shared-memory ring geometry {cfg:?} is not usable"));
        }
        let size = header_size(nrings) + nrings * ring_size(&cfg);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600) // the owner only: other users must not read or write ranks' data
            .open(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        file.set_len(size as u64)
            .map_err(|e| format!("cannot size {} to {size} bytes: {e}", path.display()))?;
        reserve(&file, size).map_err(|e| {
            format!(
                "cannot reserve {} MiB for {} ({e}): the shared-memory file system is too \
                 small for this many ranks on a host (each rank needs about {} KiB per \
                 local peer; give /dev/shm more room, e.g. docker run --shm-size, or \
                 shrink the rings with CADENCE_SHM_RING_BYTES)",
                size.div_ceil(1 << 20),
                path.display(),
                ring_size(&cfg) >> 10
            )
        })?;
        let map = map_populated(&file).map_err(|e| format!("mmap {}: {e}", path.display()))?;
        let region = Region {
            map,
            path: path.to_owned(),
            owner: true,
            unlinked: AtomicU32::new(0),
        };
        region
            .atomic_u32(OFF_PID)
            .store(std::process::id(), Ordering::Relaxed);
        region
            .atomic_u32(OFF_NRINGS)
            .store(nrings as u32, Ordering::Relaxed);
        region
            .atomic_u32(OFF_FRAME_BYTES)
            .store(cfg.frame_bytes as u32, Ordering::Relaxed);
        region
            .atomic_u32(OFF_NFRAMES)
            .store(cfg.nframes as u32, Ordering::Relaxed);
        region
            .atomic_u32(OFF_RING_BYTES)
            .store(cfg.ring_bytes as u32, Ordering::Relaxed);
        region
            .atomic_u64(OFF_SELF_ADDR)
            .store(region.map.as_ptr() as u64, Ordering::Relaxed);
        if cfg.cma_min > 0 {
            allow_peer_reads();
        }
        region
            .atomic_u64(OFF_MAGIC)
            .store(INBOX_MAGIC, Ordering::Release);
        Ok(Inbox {
            region: Arc::new(region),
            cfg,
            nrings,
        })
    }

    /// The abort notice another rank left here, if any.
    pub fn abort_notice(&self) -> Option<AbortNotice> {
        read_abort(&self.region)
    }

    /// Prepares to sleep: returns the doorbell value to wait on. The caller
    /// must re-check its rings after this and before [`Inbox::sleep`].
    pub fn prepare_sleep(&self) -> u32 {
        let bell = self.region.atomic_u32(OFF_DOORBELL).load(Ordering::Acquire);
        self.region
            .atomic_u32(OFF_SLEEPING)
            .store(1, Ordering::SeqCst);
        // The flag store must be ordered before the caller's re-check of its
        // rings (a store then a load: only a full fence orders them), pairing
        // with the fence in `ring_doorbell` between a publish and the flag
        // read: then either the waker sees the flag or we see its publish.
        std::sync::atomic::fence(Ordering::SeqCst);
        bell
    }

    /// Sleeps until the doorbell moves past `seen` or `timeout` passes;
    /// true when the timeout ended the sleep (no doorbell rang).
    pub fn sleep(&self, seen: u32, timeout: Duration) -> bool {
        let timed_out = futex_wait(self.region.atomic_u32(OFF_DOORBELL), seen, timeout);
        self.region
            .atomic_u32(OFF_SLEEPING)
            .store(0, Ordering::Relaxed);
        timed_out
    }

    /// Cancels a [`Inbox::prepare_sleep`] (something was ready after all).
    pub fn cancel_sleep(&self) {
        self.region
            .atomic_u32(OFF_SLEEPING)
            .store(0, Ordering::Relaxed);
    }

    /// Says where this rank stands in its collectives, for peers that time
    /// out waiting for it (one relaxed store to a line only this rank
    /// writes: nobody reads it while things go well).
    #[inline]
    pub fn publish_progress(&self, p: Progress) {
        self.region
            .atomic_u64(OFF_PROGRESS)
            .store(p.encode(), Ordering::Relaxed);
    }

    /// Cheap check used in every wait loop.
    #[inline]
    pub fn aborted(&self) -> bool {
        self.region
            .atomic_u32(OFF_ABORT_FLAG)
            .load(Ordering::Relaxed)
            == 2
    }
}

/// The abort notice left in an inbox, if any.
fn read_abort(r: &Region) -> Option<AbortNotice> {
    if r.atomic_u32(OFF_ABORT_FLAG).load(Ordering::Acquire) != 2 {
        return None;
    }
    let origin = r.atomic_u32(OFF_ABORT_ORIGIN).load(Ordering::Relaxed) as usize;
    let len = (r.atomic_u32(OFF_ABORT_LEN).load(Ordering::Relaxed) as usize).min(ABORT_MSG_MAX);
    let detail = String::from_utf8_lossy(r.read(OFF_ABORT_MSG, len)).into_owned();
    let mismatch = (r.atomic_u32(OFF_ABORT_MISMATCH).load(Ordering::Relaxed) == 1).then(|| {
        (
            r.atomic_u64(OFF_ABORT_BLAMED_SIG).load(Ordering::Relaxed),
            r.atomic_u32(OFF_ABORT_DETECTOR).load(Ordering::Relaxed) as usize,
            r.atomic_u64(OFF_ABORT_DETECTOR_SIG).load(Ordering::Relaxed),
        )
    });
    Some(AbortNotice {
        origin,
        detail,
        mismatch,
    })
}

/// Allocates the inbox's pages now. Left to the first write, each page of a
/// ring cost a page fault on its first pass, for the sender that wrote it and
/// for the receiver that read it: with 2 KiB messages a fault every second
/// call, which took a 2-rank allgather's first 512 KiB of traffic from 2.9 to
/// 7-8 µs a call (and a full shared-memory file system shows here, as an
/// error, not as SIGBUS in the middle of a collective).
fn reserve(file: &File, size: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on an open descriptor; no memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
    match rc {
        0 => Ok(()),
        // File systems without fallocate: the pages come on first touch.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Maps an inbox with its page tables filled in (`MAP_POPULATE`), so that no
/// message takes a page fault on this side either (see `reserve`).
fn map_populated(file: &File) -> std::io::Result<MmapRaw> {
    memmap2::MmapOptions::new().populate().map_raw(file)
}

/// Opens a peer's inbox, waiting until its owner has initialised it.
pub fn open_peer_inbox(path: &Path, deadline: Instant) -> Result<(Arc<Region>, u32), String> {
    loop {
        if let Ok(file) = File::options().read(true).write(true).open(path) {
            if let Some(found) = try_map_initialised(&file, path)? {
                return Ok(found);
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "shared-memory inbox {} did not appear in time",
                path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn try_map_initialised(file: &File, path: &Path) -> Result<Option<(Arc<Region>, u32)>, String> {
    let len = file.metadata().map(|m| m.len() as usize).unwrap_or(0);
    if len < MIN_HDR_SIZE {
        return Ok(None);
    }
    let map = map_populated(file).map_err(|e| format!("mmap {}: {e}", path.display()))?;
    let region = Region {
        map,
        path: path.to_owned(),
        owner: false,
        unlinked: AtomicU32::new(1),
    };
    if region.atomic_u64(OFF_MAGIC).load(Ordering::Acquire) != INBOX_MAGIC {
        return Ok(None);
    }
    let cfg = geometry(&region, 0); // the sender's own cma_min decides
    if !cfg.is_valid() {
        return Err(format!(
            "shared-memory inbox {} has a ring geometry no rank writes ({cfg:?})",
            path.display()
        ));
    }
    let nrings = region.atomic_u32(OFF_NRINGS).load(Ordering::Relaxed) as usize;
    if region.map.len() < header_size(nrings) + nrings * ring_size(&cfg) {
        return Ok(None);
    }
    let pid = region.atomic_u32(OFF_PID).load(Ordering::Relaxed);
    Ok(Some((Arc::new(region), pid)))
}

/// The ring geometry an inbox's owner chose, as its header says, with
/// `cma_min` (not part of the geometry) filled in by the caller; the
/// sender's own `stream` decides, as its `cma_min` does.
fn geometry(inbox: &Region, cma_min: usize) -> ShmConfig {
    let field = |off| inbox.atomic_u32(off).load(Ordering::Relaxed) as usize;
    ShmConfig {
        frame_bytes: field(OFF_FRAME_BYTES),
        nframes: field(OFF_NFRAMES),
        ring_bytes: field(OFF_RING_BYTES),
        cma_min,
        stream: Streamed::NONE,
    }
}

/// One direction of a ring as seen by one side.
struct RingEnd {
    region: Arc<Region>,
    base: usize,
    cfg: ShmConfig,
    /// Our own counter of frames (sent for the sender, consumed for the
    /// receiver; the receiver publishes it as `tail`).
    mine: u64,
    /// Last value read of the other side's counter.
    theirs: u64,
    /// Where in the payload space (counted from the ring's start, never
    /// wrapped) the next frame's payload goes: both sides advance it by
    /// [`payload_span`] of each frame's length.
    pos: u64,
    /// The sender's record of where each frame in flight begins in the
    /// payload space (frame k at `k % nframes`), so that a moved `tail`
    /// says how much space came free.
    starts: Vec<u64>,
}

impl RingEnd {
    fn new(region: Arc<Region>, base: usize, cfg: ShmConfig) -> RingEnd {
        RingEnd {
            region,
            base,
            cfg,
            mine: 0,
            theirs: 0,
            pos: 0,
            starts: vec![0; cfg.nframes],
        }
    }
    /// The stamp of the header slot that holds frame `n`.
    fn stamp(&self, n: u64) -> &AtomicU64 {
        self.region.atomic_u64(self.header(n) + OFF_STAMP)
    }
    fn tail(&self) -> &AtomicU64 {
        self.region.atomic_u64(self.base)
    }
    fn ctl_u64(&self, off: usize) -> &AtomicU64 {
        self.region.atomic_u64(self.base + off)
    }

    fn cma_ok(&self) -> &AtomicU32 {
        self.region.atomic_u32(self.base + CTL_CMA_OK)
    }
    /// The header slot of frame `n`.
    fn header(&self, n: u64) -> usize {
        self.base + RING_CTL + self.frame_index(n) * SLOT_HDR
    }
    /// `n % nframes`; both are powers of two (a mask, not a division: the
    /// small-message path computes this several times a frame).
    fn frame_index(&self, n: u64) -> usize {
        (n & (self.cfg.nframes as u64 - 1)) as usize
    }
    /// Where the payload of `len` bytes of the frame at `self.pos` lives.
    fn payload(&self, n: u64, len: usize) -> usize {
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
    fn free_bytes(&self, tail: u64) -> usize {
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
    fn room(&mut self, left: usize) -> Result<usize, usize> {
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
    /// This rank's single-copy threshold (see the module notes; 0: off).
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

/// The receiver's side of a helped single copy (see `CTL_HELP_CLAIM`).
#[derive(Clone, Copy, Debug)]
struct HelpRx {
    tag: u32,
    chunk: usize,
    chunks: u64,
    /// Chunks this rank read itself, ...
    mine: u64,
    /// ... of which it claimed these, and read these after the sender
    /// failed to write them.
    claimed: u64,
    redone: u64,
}

fn help_word(tag: u32, n: u64) -> u64 {
    (tag as u64) << 32 | n
}

fn help_count(word: u64, tag: u32) -> Option<u64> {
    (word >> 32 == tag as u64).then_some(word & 0xffff_ffff)
}

/// Claims the next chunk of the helped range `tag` (of `chunks`), if one is left.
fn claim_chunk(claim: &AtomicU64, tag: u32, chunks: u64) -> Option<u64> {
    let mut w = claim.load(Ordering::Acquire);
    loop {
        let k = help_count(w, tag)?;
        if k >= chunks {
            return None;
        }
        match claim.compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(k),
            Err(now) => w = now,
        }
    }
}

/// A rendezvous slot's description of the sender's buffer.
#[derive(Clone, Copy)]
struct CmaDesc {
    pid: u32,
    addr: u64,
    len: u64,
}

impl CmaDesc {
    fn encode(&self) -> [u8; CMA_DESC_BYTES] {
        let mut b = [0u8; CMA_DESC_BYTES];
        b[0..4].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> CmaDesc {
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        CmaDesc {
            pid: word(0..4) as u32,
            addr: word(8..16),
            len: word(16..24),
        }
    }
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
        let peer_nrings = peer_inbox.atomic_u32(OFF_NRINGS).load(Ordering::Relaxed) as usize;
        let tx = RingEnd::new(
            peer_inbox.clone(),
            header_size(peer_nrings) + my_local * ring_size(&peer_cfg),
            peer_cfg,
        );
        let rx = RingEnd::new(
            my_inbox.region.clone(),
            header_size(my_inbox.nrings) + peer_local * ring_size(&my_inbox.cfg),
            my_inbox.cfg,
        );
        // Tell the peer whether we can read its memory (single copy): try to
        // read its inbox's magic through its own address space.
        if my_inbox.cfg.cma_min > 0 {
            let addr = peer_inbox.atomic_u64(OFF_SELF_ADDR).load(Ordering::Relaxed);
            let mut magic = [0u8; 8];
            let readable = cma_read(peer_pid, addr, &mut magic).is_ok()
                && u64::from_ne_bytes(magic) == INBOX_MAGIC;
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

    /// Starts a single-copy send: publishes a rendezvous frame naming the
    /// job's buffer. False when the ring has no room for it yet.
    fn send_rendezvous(&mut self, job: &mut SendJob) -> bool {
        if let Err(need) = self.tx.room(CMA_DESC_BYTES) {
            self.tx_need = need;
            return false;
        }
        let total = job.src.len();
        let desc = CmaDesc {
            pid: std::process::id(),
            addr: job.src.bytes(0, total).as_ptr() as u64,
            len: total as u64,
        };
        let mut hdr = job.meta.header(CMA_DESC_BYTES);
        hdr.frame = FRAME_CMA;
        self.publish(&hdr, &desc.encode());
        self.cma_wait = Some(self.tx.mine);
        job.sent = total;
        job.started = true;
        self.stats.bytes_sent.add(total as u64);
        true
    }

    /// Writes a frame (payload, then header, then the stamp that publishes
    /// both) at the sender's next position, for which `room` said yes.
    fn publish(&mut self, hdr: &WireHeader, payload: &[u8]) {
        let n = self.tx.mine;
        self.tx
            .region
            .write(self.tx.payload(n, payload.len()), payload);
        self.tx
            .region
            .write(self.tx.header(n), bytemuck::bytes_of(hdr));
        self.tx.stamp(n).store(n + 1, Ordering::Release);
        self.tx.sent(payload.len());
        if ring_doorbell(&self.peer_inbox) {
            self.stats.doorbells_rung.add(1);
        }
    }

    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        if let Some(until) = self.cma_wait {
            // A single-copy send is done when the receiver released its
            // rendezvous frame: it has read the whole buffer.
            self.tx.theirs = self.tx.tail().load(Ordering::Acquire);
            if self.tx.theirs < until {
                return self.help_receiver(job, until);
            }
            self.cma_wait = None;
            job.done = true;
            self.stats.msgs_sent.add(1);
            self.stats.single_copy_sent.add(1);
            return Ok(true);
        }
        let total = job.src.len();
        if !job.started
            && self.cma_min > 0
            && total >= self.cma_min
            && !(job.prefer_stream && self.stream.takes(job.meta.coll))
            && self.single_copy()
        {
            return Ok(self.send_rendezvous(job));
        }
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
        Ok(progressed)
    }

    /// Writes one chunk of the single-copy message the receiver is reading
    /// (frame `until - 1`) straight into its destination, if the receiver
    /// offered the range (`CTL_HELP_CLAIM`) and a chunk is left: the two
    /// cores then copy the message between them, where the sender's would
    /// otherwise wait idle.
    fn help_receiver(&mut self, job: &SendJob, until: u64) -> Result<bool, ErrorKind> {
        let tag = until as u32;
        if !self.help_tx_ok || tag == 0 || self.rx.cma_ok().load(Ordering::Relaxed) != 1 {
            return Ok(false);
        }
        let claim = self.tx.ctl_u64(CTL_HELP_CLAIM);
        if help_count(claim.load(Ordering::Acquire), tag).is_none() {
            return Ok(false);
        }
        // Written before the claim word that the acquire above saw.
        let dst = self.tx.ctl_u64(CTL_HELP_DST).load(Ordering::Relaxed);
        let len = self.tx.ctl_u64(CTL_HELP_LEN).load(Ordering::Relaxed) as usize;
        let chunk = self.tx.ctl_u64(CTL_HELP_CHUNK).load(Ordering::Relaxed) as usize;
        if len != job.src.len() || chunk == 0 {
            return Ok(false); // only whole messages are offered
        }
        let Some(k) = claim_chunk(claim, tag, len.div_ceil(chunk) as u64) else {
            return Ok(false);
        };
        let off = k as usize * chunk;
        let n = chunk.min(len - off);
        match cma_write(self.peer_pid, dst + off as u64, job.src.bytes(off, n)) {
            Ok(()) => {
                self.tx
                    .ctl_u64(CTL_HELP_DONE)
                    .fetch_add(1, Ordering::Release);
                self.stats.single_copy_helped.add(n as u64);
            }
            Err(_) => {
                // The receiver reads this chunk itself; we stop helping.
                self.help_tx_ok = false;
                self.tx
                    .ctl_u64(CTL_HELP_FAILED)
                    .store(help_word(tag, k + 1), Ordering::Release);
            }
        }
        // The receiver may sleep waiting for the chunk.
        if ring_doorbell(&self.peer_inbox) {
            self.stats.doorbells_rung.add(1);
        }
        Ok(true)
    }

    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        let total = job.sink.len();
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

    /// A received frame's payload length, refused when it could not have
    /// come from a sender of this ring (it would reach past the spill room).
    fn frame_len(&self, hdr: &WireHeader) -> Result<usize, ErrorKind> {
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
    fn release(&mut self, len: usize) {
        self.rx.mine += 1;
        self.rx.pos += payload_span(len);
        self.rx.tail().store(self.rx.mine, Ordering::Release);
        // The sender may sleep waiting for room.
        if ring_doorbell(&self.peer_inbox) {
            self.stats.doorbells_rung.add(1);
        }
    }

    /// The description in the receiver's next frame, a rendezvous frame.
    fn rendezvous_desc(&self) -> CmaDesc {
        CmaDesc::decode(self.rx.region.read(
            self.rx.payload(self.rx.mine, CMA_DESC_BYTES),
            CMA_DESC_BYTES,
        ))
    }

    /// Reads (a chunk of) a single-copy message from the sender's memory
    /// into the job's sink; releases the rendezvous slot once all is read.
    fn recv_single_copy(&mut self, job: &mut RecvJob, hdr: WireHeader) -> Result<bool, ErrorKind> {
        let total = job.sink.len();
        if hdr.len != CMA_DESC_BYTES as u64 {
            return Err(ErrorKind::Garbage {
                peer: self.peer,
                detail: format!("a {}-byte single-copy frame", hdr.len),
            });
        }
        let desc = self.rendezvous_desc();
        let start = match self.cma_rx_start {
            Some(s) => s,
            None => {
                // Checked like a data frame that carries the whole rest.
                let whole = WireHeader {
                    frame: FRAME_DATA,
                    len: desc.len,
                    ..hdr
                };
                job.meta.check(&whole, self.peer, total - job.got)?;
                if desc.pid != self.peer_pid {
                    return Err(ErrorKind::Garbage {
                        peer: self.peer,
                        detail: format!(
                            "single-copy frame names pid {}, the peer is pid {}",
                            desc.pid, self.peer_pid
                        ),
                    });
                }
                self.cma_rx_start = Some(job.got);
                job.got
            }
        };
        let rest = total - job.got;
        let from = desc.addr + (job.got - start) as u64;
        let peer = self.peer;
        let failed = |e: std::io::Error, n: usize| match e.raw_os_error() {
            Some(libc::ESRCH) => ErrorKind::PeerDied {
                peer,
                pid: desc.pid,
            },
            _ => ErrorKind::Io {
                peer,
                detail: format!("single-copy read of {n} bytes at {from:#x}: {e}"),
            },
        };
        if self.help_rx.is_none() && job.got == start && rest >= HELP_MIN {
            self.offer_help(job, &desc, rest);
        }
        // Straight into the destination, unless it sits 1-31 bytes past the
        // sender's buffer within a line, where the kernel's copy is slow (see
        // `crate::copy`): then, as for reducing receives, through a scratch
        // chunk (kept in cache) lined up with the sender's buffer. A large
        // message read straight goes in chunks that the sender may take
        // too (`offer_help`).
        let big = CMA_DIRECT_CHUNK.min(rest);
        let read = if self.help_rx.is_some() {
            match self.read_helped(job, &desc, start, rest) {
                // A chunk read (the bytes are counted when all are in).
                Ok(Some(_)) => {
                    job.started = true;
                    return Ok(true);
                }
                // Waiting for the chunks the sender is writing.
                Ok(None) if self.help_rx.is_some() => return Ok(false),
                // Every chunk is in (the bytes counted as a whole below).
                Ok(None) => Ok(rest),
                Err(x) => Err(x),
            }
        } else {
            match job.sink.direct(job.got, big) {
                Some(dst) if !shifted_ahead(dst.as_ptr() as usize, from as usize) => {
                    cma_read(desc.pid, from, dst)
                        .map(|_| big)
                        .map_err(|e| (e, big))
                }
                _ => {
                    let n = CMA_CHUNK.min(rest);
                    let buf = window_aligned_like(&mut self.cma_scratch, n, from as usize);
                    match cma_read(desc.pid, from, buf) {
                        Ok(()) => {
                            job.sink.deliver(job.got, buf);
                            Ok(n)
                        }
                        Err(e) => Err((e, n)),
                    }
                }
            }
        };
        let n = match read {
            Ok(n) => n,
            Err((e, n)) => {
                self.revoke_help();
                // A sender that failed leaves its abort notice before it
                // hands its buffer back, so a read that found the buffer
                // gone (EFAULT) is that failure's consequence: report the
                // failure, which names its origin, not this peer's vanished
                // memory.
                if let Some(notice) = read_abort(&self.my_inbox) {
                    return Err(notice.into_error(job.meta.sig));
                }
                return Err(failed(e, n));
            }
        };
        job.got += n;
        job.started = true;
        self.stats.bytes_recv.add(n as u64);
        if job.got < total {
            return Ok(true);
        }
        // A sender that failed may have handed its buffer back to its
        // caller while we read; it leaves its abort notice here before it
        // returns, so none here means what we read was the message.
        if let Some(notice) = read_abort(&self.my_inbox) {
            return Err(notice.into_error(job.meta.sig));
        }
        self.cma_rx_start = None;
        self.release(CMA_DESC_BYTES);
        job.done = true;
        self.stats.msgs_recv.add(1);
        Ok(true)
    }

    /// Offers the sender the message whose rendezvous frame this rank is
    /// reading, to copy it with us in chunks (`help_chunk`, `CTL_HELP_CLAIM`):
    /// when the whole message goes straight into the destination (not
    /// reduced, not shifted within a line from the source).
    fn offer_help(&mut self, job: &mut RecvJob, desc: &CmaDesc, rest: usize) {
        let tag = (self.rx.mine + 1) as u32;
        if tag == 0 || desc.len != rest as u64 {
            return;
        }
        let Some(dst) = job.sink.direct(job.got, rest) else {
            return;
        };
        if shifted_ahead(dst.as_ptr() as usize, desc.addr as usize) {
            return;
        }
        let at = dst.as_ptr() as u64;
        let chunk = help_chunk(rest);
        let ctl = |off| self.rx.ctl_u64(off);
        ctl(CTL_HELP_DST).store(at, Ordering::Relaxed);
        ctl(CTL_HELP_LEN).store(rest as u64, Ordering::Relaxed);
        ctl(CTL_HELP_CHUNK).store(chunk as u64, Ordering::Relaxed);
        ctl(CTL_HELP_DONE).store(help_word(tag, 0), Ordering::Relaxed);
        ctl(CTL_HELP_FAILED).store(0, Ordering::Relaxed);
        // Publishes the words above to the sender.
        ctl(CTL_HELP_CLAIM).store(help_word(tag, 0), Ordering::Release);
        // A sender that came early has spun, yielded and gone to sleep on
        // its rendezvous: wake it to help (a load when it is awake).
        if ring_doorbell(&self.peer_inbox) {
            self.stats.doorbells_rung.add(1);
        }
        self.help_rx = Some(HelpRx {
            tag,
            chunk,
            chunks: rest.div_ceil(chunk) as u64,
            mine: 0,
            claimed: 0,
            redone: 0,
        });
    }

    /// Reads the next unclaimed chunk of a helped message (or one the sender
    /// failed to write): `Some(bytes)`. `None` when none is left: then
    /// `help_rx` is cleared once the sender's chunks are all in too.
    fn read_helped(
        &mut self,
        job: &mut RecvJob,
        desc: &CmaDesc,
        start: usize,
        rest: usize,
    ) -> Result<Option<usize>, (std::io::Error, usize)> {
        let Some(mut h) = self.help_rx else {
            return Ok(None);
        };
        let k = match claim_chunk(self.rx.ctl_u64(CTL_HELP_CLAIM), h.tag, h.chunks) {
            Some(k) => {
                h.claimed += 1;
                Some(k)
            }
            None => {
                let failed = self.rx.ctl_u64(CTL_HELP_FAILED);
                match help_count(failed.load(Ordering::Acquire), h.tag) {
                    Some(k1) if k1 > 0 => {
                        failed.store(0, Ordering::Relaxed);
                        h.redone += 1;
                        Some(k1 - 1)
                    }
                    _ => None,
                }
            }
        };
        self.help_rx = Some(h);
        if let Some(k) = k {
            let off = k as usize * h.chunk;
            let n = h.chunk.min(rest - off);
            let dst = job
                .sink
                .direct(start + off, n)
                .expect("a helped receive goes straight into a copy sink");
            cma_read(desc.pid, desc.addr + off as u64, dst).map_err(|e| (e, n))?;
            h.mine += 1;
            self.help_rx = Some(h);
            return Ok(Some(n));
        }
        let done = self.rx.ctl_u64(CTL_HELP_DONE).load(Ordering::Acquire);
        if h.mine + help_count(done, h.tag).unwrap_or(0) >= h.chunks {
            self.help_rx = None;
        }
        Ok(None)
    }

    /// Takes back the range this rank offered its sender, on the way out of
    /// a failed receive (the caller gets its memory back): no chunk can be
    /// claimed any more, and the ones the sender claimed are waited for, up
    /// to `HELP_DRAIN`, so that it writes nothing there afterwards.
    fn revoke_help(&mut self) {
        let Some(h) = self.help_rx.take() else {
            return;
        };
        let prev = self
            .rx
            .ctl_u64(CTL_HELP_CLAIM)
            .swap(help_word(h.tag, h.chunks), Ordering::AcqRel);
        let theirs = help_count(prev, h.tag)
            .unwrap_or(0)
            .min(h.chunks)
            .saturating_sub(h.claimed);
        let deadline = Instant::now() + HELP_DRAIN;
        loop {
            let done = help_count(
                self.rx.ctl_u64(CTL_HELP_DONE).load(Ordering::Acquire),
                h.tag,
            );
            let failed = help_count(
                self.rx.ctl_u64(CTL_HELP_FAILED).load(Ordering::Acquire),
                h.tag,
            )
            .is_some_and(|k| k > 0);
            let settled = done.unwrap_or(0) + h.redone + u64::from(failed);
            if settled >= theirs || Instant::now() >= deadline {
                return;
            }
            std::thread::yield_now();
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
        Progress::decode(
            self.peer_inbox
                .atomic_u64(OFF_PROGRESS)
                .load(Ordering::Relaxed),
        )
    }

    /// Writes this rank's stall notice into the peer's stall table.
    pub fn post_stall(&mut self, n: &StallNotice) {
        if self.my_local >= self.peer_nrings {
            return; // not a sender the peer's inbox has a ring for
        }
        let base = OFF_STALL + self.my_local * STALL_SLOT;
        let r = &self.peer_inbox;
        let len = n.chain.len().min(STALL_CHAIN_MAX);
        // Seqlock-style: readers ignore the slot while `len` is 0.
        r.atomic_u32(base).store(0, Ordering::Release);
        r.atomic_u64(base + 8).store(n.seq, Ordering::Relaxed);
        for (i, v) in n.chain.iter().take(len).enumerate() {
            r.atomic_u32(base + 16 + 4 * i).store(*v, Ordering::Relaxed);
        }
        r.atomic_u32(base).store(len as u32, Ordering::Release);
    }

    /// The peer's stall notice, from this rank's own stall table.
    pub fn read_stall(&self) -> Option<StallNotice> {
        if self.peer_local >= self.my_nrings {
            return None;
        }
        let base = OFF_STALL + self.peer_local * STALL_SLOT;
        let r = &self.my_inbox;
        let len = (r.atomic_u32(base).load(Ordering::Acquire) as usize).min(STALL_CHAIN_MAX);
        if len == 0 {
            return None;
        }
        let seq = r.atomic_u64(base + 8).load(Ordering::Relaxed);
        let chain = (0..len)
            .map(|i| r.atomic_u32(base + 16 + 4 * i).load(Ordering::Relaxed))
            .collect();
        Some(StallNotice { seq, chain })
    }

    /// Leaves an abort notice in the peer's inbox (first notice wins). The
    /// one failure path: a receive this peer was helping with is taken back
    /// first (`revoke_help`).
    pub fn send_abort(&mut self, notice: &AbortNotice) {
        self.revoke_help();
        post_abort(&self.peer_inbox, notice);
    }
}

/// Writes an abort notice into an inbox unless one is already there.
pub fn post_abort(inbox: &Region, n: &AbortNotice) {
    let flag = inbox.atomic_u32(OFF_ABORT_FLAG);
    if flag
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        let text = n.wire_text();
        let bytes = text.as_bytes();
        inbox.write(OFF_ABORT_MSG, bytes);
        inbox
            .atomic_u32(OFF_ABORT_ORIGIN)
            .store(n.origin as u32, Ordering::Relaxed);
        inbox
            .atomic_u32(OFF_ABORT_LEN)
            .store(bytes.len() as u32, Ordering::Relaxed);
        if let Some((blamed_sig, detector, detector_sig)) = n.mismatch {
            inbox
                .atomic_u64(OFF_ABORT_BLAMED_SIG)
                .store(blamed_sig, Ordering::Relaxed);
            inbox
                .atomic_u64(OFF_ABORT_DETECTOR_SIG)
                .store(detector_sig, Ordering::Relaxed);
            inbox
                .atomic_u32(OFF_ABORT_DETECTOR)
                .store(detector as u32, Ordering::Relaxed);
            inbox
                .atomic_u32(OFF_ABORT_MISMATCH)
                .store(1, Ordering::Relaxed);
        }
        flag.store(2, Ordering::Release);
    }
}

/// Wakes the owner of `inbox` if it sleeps; true when it did (a system
/// call). The fence orders our preceding publish before the flag read,
/// pairing with the sleeper's flag store before its re-check: one of the
/// two always sees the other.
fn ring_doorbell(inbox: &Region) -> bool {
    std::sync::atomic::fence(Ordering::SeqCst);
    let sleeping = inbox.atomic_u32(OFF_SLEEPING);
    // The waker lowers the flag, so that only one publish per sleep pays
    // for the system call: a sleeper woken but not yet run (ranks that
    // outnumber cores) used to take a futex wake from every publish meant
    // for it until it ran, e.g. each of a broadcast root's calls run ahead.
    // The plain load first keeps the usual case (awake) a read of a line
    // that does not change. Lowering it early is safe: the doorbell moves
    // before the wake, and a sleeper that has not yet called futex_wait
    // sees it moved and does not sleep.
    if sleeping.load(Ordering::Relaxed) != 0 && sleeping.swap(0, Ordering::Relaxed) != 0 {
        inbox
            .atomic_u32(OFF_DOORBELL)
            .fetch_add(1, Ordering::Release);
        futex_wake(inbox.atomic_u32(OFF_DOORBELL));
        return true;
    }
    false
}

/// True when the wait ended by its timeout (not by a wake-up, a changed
/// value or a signal).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 in a shared mapping that outlives
    // the call; FUTEX_WAIT (shared, not PRIVATE, since other processes wake
    // it) only reads it and sleeps while it equals `expected`, up to `ts`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE wakes at most one sleeper on the
    // word (only its owner ever sleeps there) and touches no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

/// Copies `dst.len()` bytes from address `addr` of process `pid` into `dst`
/// (`process_vm_readv(2)`, looping over partial reads).
fn cma_read(pid: u32, addr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    let len = dst.len();
    cma_loop(len, "the peer's buffer ended early", |done| {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local` describes `dst[done..]`, memory we own and may
        // write, for exactly its length; the kernel writes nothing else in
        // this process. `remote` is only read, in the other process, and the
        // kernel checks it there (EFAULT when it is not mapped).
        unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) }
    })
}

/// Writes `src` into process `pid`'s memory at `addr`
/// (`process_vm_writev(2)`, looping over partial writes): a sender helping
/// its receiver's single-copy read. The receiver offered that range of its
/// destination for this message and does not give it back to its caller
/// until every chunk it let us claim is written (`CTL_HELP_DONE`).
fn cma_write(pid: u32, addr: u64, src: &[u8]) -> std::io::Result<()> {
    let len = src.len();
    cma_loop(len, "the receiver's range ended early", |done| {
        let local = libc::iovec {
            iov_base: src[done..].as_ptr().cast_mut().cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local` describes `src[done..]`, memory we own, which the
        // kernel only reads. `remote` is written in the other process only,
        // within the range it offered us (see above); the kernel checks it
        // there (EFAULT when it is not mapped).
        unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) }
    })
}

/// Calls `one(done)` (one `process_vm_readv`/`writev` of the bytes from
/// `done` on, returning its result) until `len` bytes have moved: the
/// kernel may move fewer than asked.
fn cma_loop(
    len: usize,
    short: &str,
    mut one: impl FnMut(usize) -> libc::ssize_t,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = one(done);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                short,
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Lets same-user peers read this process's memory (single copy) where the
/// Yama security module restricts it to ancestors (`ptrace_scope` 1, the
/// default on Ubuntu), as Open MPI does; scopes 2 and 3 stay closed and the
/// rings carry everything. Nothing to do without Yama.
fn allow_peer_reads() {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope");
    if scope.is_ok_and(|s| s.trim() == "1") {
        // SAFETY: prctl with PR_SET_PTRACER only changes this process's
        // Yama exception list; it touches no memory of ours.
        unsafe {
            libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
        }
    }
}

/// `kill(pid, 0)` says whether a process exists; a zombie (exited, not yet
/// reaped by its parent) still exists, so /proc tells those apart.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks existence.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Format: "pid (comm) S ..."; comm may contain spaces or ')'.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => rc == 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{OpMeta, Sink, SinkMode, Source};
    use crate::types::{CollKind, DType, ElemOp};

    #[test]
    fn progress_round_trips_and_says_where_the_peer_stands() {
        for p in [
            Progress {
                seq: 0,
                running: false,
                phase: 0,
            },
            Progress {
                seq: 7,
                running: true,
                phase: 3,
            },
            Progress {
                seq: (1 << 40) - 1,
                running: false,
                phase: Progress::PHASE_MAX,
            },
        ] {
            assert_eq!(Progress::decode(p.encode()), p);
        }
        let big = Progress {
            seq: 2,
            running: true,
            phase: u32::MAX,
        };
        assert_eq!(Progress::decode(big.encode()).phase, Progress::PHASE_MAX);
        let at = |seq, running, phase| {
            Progress {
                seq,
                running,
                phase,
            }
            .describe(1, 5)
        };
        assert_eq!(at(5, true, 2), "rank 1 is in it too, in its phase 2");
        assert_eq!(at(5, false, 0), "rank 1 has finished it");
        assert!(at(0, false, 0).contains("has run no collective yet"));
        assert!(at(4, true, 1).contains("still in an earlier collective (#4, its phase 1)"));
        assert!(at(4, false, 0).contains("has not started it"));
        assert!(at(6, true, 0).contains("past it, in collective #6"));
    }

    #[test]
    fn a_peer_reads_the_progress_its_owner_publishes() {
        let dir = std::env::temp_dir().join(format!("cadence-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // `a` is rank 0's link to rank 1, whose inbox is `ib`.
        let (a, _b, _ia, ib) = pair(&dir, 2, 0, 1);
        assert_eq!(
            a.peer_progress(),
            Progress {
                seq: 0,
                running: false,
                phase: 0
            }
        );
        let p = Progress {
            seq: 9,
            running: true,
            phase: 4,
        };
        ib.publish_progress(p);
        assert_eq!(a.peer_progress(), p);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two inboxes of `nrings` rings in a private directory, linked as local
    /// ranks `a` and `b`: (a's link to b, b's link to a).
    fn pair(dir: &Path, nrings: usize, a: usize, b: usize) -> (ShmLink, ShmLink, Inbox, Inbox) {
        pair_with(dir, nrings, a, b, 0)
    }

    fn pair_with(
        dir: &Path,
        nrings: usize,
        a: usize,
        b: usize,
        cma_min: usize,
    ) -> (ShmLink, ShmLink, Inbox, Inbox) {
        let cfg = ShmConfig {
            frame_bytes: 4096,
            nframes: 4,
            ring_bytes: 16 * 1024,
            cma_min,
            stream: Streamed::NONE,
        };
        pair_of(dir, nrings, a, b, cfg)
    }

    fn pair_of(
        dir: &Path,
        nrings: usize,
        a: usize,
        b: usize,
        cfg: ShmConfig,
    ) -> (ShmLink, ShmLink, Inbox, Inbox) {
        let ia = Inbox::create(&dir.join("a"), nrings, cfg).unwrap();
        let ib = Inbox::create(&dir.join("b"), nrings, cfg).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let (rb, pid_b) = open_peer_inbox(&dir.join("b"), deadline).unwrap();
        let (ra, pid_a) = open_peer_inbox(&dir.join("a"), deadline).unwrap();
        let la = ShmLink::new(b, &ia, rb, pid_b, a, b);
        let lb = ShmLink::new(a, &ib, ra, pid_a, b, a);
        (la, lb, ia, ib)
    }

    fn meta(count: u64) -> OpMeta {
        OpMeta {
            coll: CollKind::AllGather,
            dtype: DType::U8,
            redop: 0,
            root: 0,
            seq: 7,
            sig: 42,
            count,
        }
    }

    #[test]
    fn the_header_grows_with_the_rings() {
        assert_eq!(header_size(1), 4096);
        assert_eq!(header_size(37), 4096); // 2304 + 37 * 48 = 4080
        assert_eq!(header_size(38), 8192);
        assert_eq!(header_size(128), 12288); // 2304 + 128 * 48 = 8448
        for n in 1..300 {
            assert!(OFF_STALL + n * STALL_SLOT <= header_size(n));
        }
    }

    /// Local ranks past the old one-page stall table (37 slots) post and read
    /// stall notices, and their rings start past the grown header: a message
    /// from local rank 63 to local rank 1 arrives intact.
    #[test]
    fn many_local_ranks_post_stalls_and_move_data() {
        let dir = std::env::temp_dir().join(format!("cadence-shm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut la, mut lb, _ia, _ib) = pair(&dir, 64, 63, 1);
        let notice = StallNotice {
            seq: 99,
            chain: vec![63, 1, 5],
        };
        la.post_stall(&notice);
        let got = lb
            .read_stall()
            .expect("the notice of local rank 63 arrives");
        assert_eq!((got.seq, got.chain), (99, vec![63, 1, 5]));
        assert!(la.read_stall().is_none());

        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut out = vec![0u8; data.len()];
        transfer(&mut la, &mut lb, &data, &mut out, SinkMode::Copy);
        assert_eq!(out, data);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Moves `data` from `la` to `lb` into a sink of `mode` over `out`.
    fn transfer(la: &mut ShmLink, lb: &mut ShmLink, data: &[u8], out: &mut [u8], mode: SinkMode) {
        // SAFETY: `data` and `out` outlive the jobs and nothing else touches them.
        let src = unsafe { Source::new(data.as_ptr(), data.len()) };
        // SAFETY: as for `src`: `out` outlives the job, nobody else touches it.
        let sink = unsafe { Sink::new(out.as_mut_ptr(), out.len(), mode, DType::U8, ElemOp::Sum) };
        let mut send = SendJob::new(meta(data.len() as u64), src);
        let mut recv = RecvJob::new(meta(data.len() as u64), sink);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(send.done && recv.done) {
            la.send_progress(&mut send).unwrap();
            lb.recv_progress(&mut recv).unwrap();
            assert!(Instant::now() < deadline, "transfer did not finish");
        }
    }

    /// One wake-up per sleep: the first publish that finds the receiver
    /// asleep rings (and lowers its flag), the ones after it until the
    /// receiver runs again do not (each used to be a futex system call), and
    /// the receiver's sleep then returns at once, not by its timeout.
    #[test]
    fn a_sleeping_receiver_is_woken_once_per_sleep() {
        let (dir, mut la, mut lb, _ia, ib) = pair_in("bell", 4096, 8, 16 * 1024);
        let rung = |l: &ShmLink| l.stats.doorbells_rung.get();
        let mut out = [0u8; 8];
        transfer(&mut la, &mut lb, b"awake", &mut out[..5], SinkMode::Copy);
        assert_eq!(rung(&la), 0, "the receiver was awake");
        for round in 1..=2 {
            let seen = ib.prepare_sleep();
            for _ in 0..3 {
                // Sends only: the receiver has not run since it went to sleep.
                // SAFETY: the static bytes outlive the job.
                let src = unsafe { Source::new(b"ping".as_ptr(), 4) };
                let mut send = SendJob::new(meta(4), src);
                while !send.done {
                    la.send_progress(&mut send).unwrap();
                }
            }
            assert_eq!(rung(&la), round, "one wake-up for three publishes");
            let t = Instant::now();
            assert!(
                !ib.sleep(seen, Duration::from_secs(5)),
                "the doorbell moved"
            );
            assert!(t.elapsed() < Duration::from_secs(1));
            for _ in 0..3 {
                // SAFETY: `out` outlives the job and nothing else touches it.
                let sink = unsafe {
                    Sink::new(out.as_mut_ptr(), 4, SinkMode::Copy, DType::U8, ElemOp::Sum)
                };
                let mut recv = RecvJob::new(meta(4), sink);
                while !recv.done {
                    lb.recv_progress(&mut recv).unwrap();
                }
                assert_eq!(&out[..4], b"ping");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Messages `0..n` of the lengths `sizes` (in turn), each a pattern of
    /// its own, and a send job for each.
    fn messages(n: usize, sizes: &[usize]) -> (Vec<Vec<u8>>, Vec<SendJob>) {
        let msgs: Vec<Vec<u8>> = (0..n)
            .map(|k| {
                let len = sizes[k % sizes.len()];
                (0..len).map(|i| ((i * 31 + k * 7) % 251) as u8).collect()
            })
            .collect();
        let sends = msgs
            .iter()
            // SAFETY: the vectors' buffers outlive the jobs (the callers keep
            // `msgs` to the end) and nothing writes them.
            .map(|m| {
                SendJob::new(meta(m.len() as u64), unsafe {
                    Source::new(m.as_ptr(), m.len())
                })
            })
            .collect();
        (msgs, sends)
    }

    /// A pair linked through rings of this geometry (no single copy), in a
    /// private directory named after `tag`.
    fn pair_in(
        tag: &str,
        frame_bytes: usize,
        nframes: usize,
        ring_bytes: usize,
    ) -> (PathBuf, ShmLink, ShmLink, Inbox, Inbox) {
        let dir = std::env::temp_dir().join(format!("cadence-shm-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = ShmConfig {
            frame_bytes,
            nframes,
            ring_bytes,
            cma_min: 0,
            stream: Streamed::NONE,
        };
        let (la, lb, ia, ib) = pair_of(&dir, 2, 0, 1, cfg);
        (dir, la, lb, ia, ib)
    }

    /// [`pair_with`] in a directory of its own (`tag`): a pair whose
    /// messages from `cma_min` bytes go by single copy.
    fn cma_pair_in(tag: &str, cma_min: usize) -> (PathBuf, ShmLink, ShmLink, Inbox, Inbox) {
        let dir = std::env::temp_dir().join(format!("cadence-cma-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (la, lb, ia, ib) = pair_with(&dir, 2, 0, 1, cma_min);
        (dir, la, lb, ia, ib)
    }

    /// A receive job that copies into `out`.
    fn copy_into(out: &mut [u8]) -> RecvJob {
        // SAFETY: the callers keep `out` to the job's end and touch it only
        // after the job is done.
        let sink = unsafe {
            Sink::new(
                out.as_mut_ptr(),
                out.len(),
                SinkMode::Copy,
                DType::U8,
                ElemOp::Sum,
            )
        };
        RecvJob::new(meta(out.len() as u64), sink)
    }

    /// Small messages take a header slot and a line or two, not a whole
    /// frame's room: a sender runs as many of them ahead of its receiver as
    /// there are header slots (a broadcast's root is not held up by a late
    /// receiver), then waits; the receiver gets every one intact, in order.
    /// The inbox's pages are allocated and mapped when the link is made:
    /// the first pass over a ring (here 600 KiB of 2 KiB messages through
    /// its 512 KiB) takes no page fault on either side (it took one per
    /// page on each: about 260 in this test without).
    #[test]
    fn a_new_ring_takes_no_page_faults() {
        fn minor_faults() -> i64 {
            let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
            // SAFETY: getrusage fills the struct it is given; RUSAGE_THREAD
            // counts this thread's faults only (other tests run beside it).
            let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) };
            assert_eq!(rc, 0);
            // SAFETY: initialised by the successful call above.
            unsafe { u.assume_init() }.ru_minflt
        }
        // In /dev/shm, as the communicator's inboxes are: on a disk file
        // system a populated shared mapping still faults on its first write.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("cadence-faults-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut la, mut lb, _ia, _ib) = pair_of(&dir, 2, 0, 1, ShmConfig::default());
        let data: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
        let mut out = vec![0u8; data.len()];
        let before = minor_faults();
        for _ in 0..300 {
            transfer(&mut la, &mut lb, &data, &mut out, SinkMode::Copy);
        }
        let faults = minor_faults() - before;
        assert_eq!(out, data);
        assert!(
            faults < 16,
            "{faults} page faults on a new ring's first pass"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An inbox that does not fit the file system is refused when it is
    /// made, with what to do about it (it used to fail later, as a SIGBUS
    /// on the first write past the room). Needs root to mount a small tmpfs;
    /// skipped (with a line saying so) elsewhere.
    #[test]
    fn an_inbox_too_big_for_its_file_system_is_an_error_at_creation() {
        let dir = std::env::temp_dir().join(format!("cadence-small-shm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: mounting a 1 MiB tmpfs needs root");
            let _ = std::fs::remove_dir(&dir);
            return;
        }
        let got = Inbox::create(&dir.join("inbox"), 4, ShmConfig::default());
        let _ = std::process::Command::new("umount").arg(&dir).status();
        let _ = std::fs::remove_dir(&dir);
        let err = got
            .err()
            .expect("a 2 MiB inbox in a 1 MiB file system is refused");
        assert!(err.contains("cannot reserve"), "{err}");
        assert!(err.contains("CADENCE_SHM_RING_BYTES"), "{err}");
    }

    #[test]
    fn a_sender_runs_small_messages_ahead_of_its_receiver() {
        let (dir, mut la, mut lb, _ia, _ib) = pair_in("ahead", 64 * 1024, 64, 512 * 1024);
        let (msgs, mut sends) = messages(65, &[0, 8, 9, 64, 100, 1000, 4096]);
        for (k, job) in sends.iter_mut().enumerate().take(64) {
            la.send_progress(job).unwrap();
            assert!(job.done, "message {k} waited for the receiver");
        }
        assert!(!la.send_progress(&mut sends[64]).unwrap() && !la.tx_ready());
        for (k, m) in msgs.iter().enumerate().take(64) {
            let mut out = vec![0u8; m.len()];
            let mut recv = copy_into(&mut out);
            lb.recv_progress(&mut recv).unwrap();
            assert!(recv.done && out == *m, "message {k}");
        }
        assert!(la.tx_ready());
        assert!(la.send_progress(&mut sends[64]).unwrap() && sends[64].done);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Through a ring smaller than a few frames, messages of every awkward
    /// length: frames shortened to the room there is, frames that run past
    /// the end of the payload space into the spill room, inline ones in
    /// between; the sender fills what it can before the receiver drains.
    #[test]
    fn frames_fit_the_room_and_run_past_the_end_whole() {
        let (dir, mut la, mut lb, _ia, _ib) = pair_in("wrap", 16 * 1024, 8, 32 * 1024);
        let cfg = la.tx.cfg;
        let sizes = [16384, 10_000, 3, 40_000, 4160, 0, 17, 20_480, 65, 6000];
        let (msgs, mut sends) = messages(40, &sizes);
        let mut outs: Vec<Vec<u8>> = msgs.iter().map(|m| vec![0u8; m.len()]).collect();
        let mut recvs: Vec<RecvJob> = outs.iter_mut().map(|o| copy_into(o)).collect();
        let (mut s, mut r) = (0, 0);
        let mut partial = false;
        let deadline = Instant::now() + Duration::from_secs(5);
        while r < msgs.len() {
            while s < msgs.len() {
                let before = sends[s].sent;
                la.send_progress(&mut sends[s]).unwrap();
                let last = (sends[s].sent - before) % cfg.frame_bytes;
                partial |= !sends[s].done && last != 0;
                if !sends[s].done {
                    break;
                }
                s += 1;
            }
            while r < s || (r == s && r < msgs.len() && recvs[r].got < sends[r].sent) {
                lb.recv_progress(&mut recvs[r]).unwrap();
                if !recvs[r].done {
                    break;
                }
                r += 1;
            }
            assert!(Instant::now() < deadline, "stuck at send {s}, receive {r}");
        }
        assert!(partial, "no frame was shortened to the room left");
        assert!(la.tx.pos > 4 * cfg.ring_bytes as u64, "the ring went round");
        assert_eq!(la.tx.pos, lb.rx.pos);
        for (k, (o, m)) in outs.iter().zip(&msgs).enumerate() {
            assert!(o == m, "message {k} ({} bytes) arrived changed", m.len());
        }
        drop(recvs);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An inbox whose header names a geometry the ring arithmetic cannot
    /// use (here: frames in flight not a power of two) is refused with the
    /// file's name, by its owner and by a peer that opens it.
    #[test]
    fn a_bad_ring_geometry_is_refused() {
        let dir = std::env::temp_dir().join(format!("cadence-shm-geom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = ShmConfig {
            nframes: 3,
            ..Default::default()
        };
        assert!(Inbox::create(&dir.join("x"), 2, cfg).is_err());
        let ok = Inbox::create(&dir.join("a"), 2, ShmConfig::default()).unwrap();
        ok.region
            .atomic_u32(OFF_NFRAMES)
            .store(3, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = open_peer_inbox(&dir.join("a"), deadline).err().unwrap();
        assert!(
            e.contains("ring geometry") && e.contains("nframes: 3"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A frame the receiver's ring could not hold (longer than its largest
    /// frame) is refused as garbage before anything is read; one longer
    /// than the rest of the message is a mismatch.
    #[test]
    fn frame_lengths_are_checked() {
        let dir = std::env::temp_dir().join(format!("cadence-shm-len-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut la, mut lb, _ia, _ib) = pair(&dir, 2, 0, 1);
        let mut out = vec![0u8; 100_000];
        // SAFETY: `out` outlives the jobs and nothing else touches it.
        let sink = |out: &mut Vec<u8>, len: usize| unsafe {
            Sink::new(
                out.as_mut_ptr(),
                len,
                SinkMode::Copy,
                DType::U8,
                ElemOp::Sum,
            )
        };
        la.publish(&meta(100_000).header(50_000), &[0u8; 8]);
        let mut recv = RecvJob::new(meta(100_000), sink(&mut out, 100_000));
        let e = lb.recv_progress(&mut recv).unwrap_err();
        assert!(
            matches!(&e, ErrorKind::Garbage { detail, .. } if detail.contains("50000-byte")),
            "{e}"
        );
        let (mut la, mut lb, _ia, _ib) = {
            std::fs::remove_dir_all(&dir).unwrap();
            std::fs::create_dir_all(&dir).unwrap();
            pair(&dir, 2, 0, 1)
        };
        let (data, _) = messages(1, &[3000]);
        let data = &data[0];
        // SAFETY: `data` outlives the job.
        let mut send = SendJob::new(meta(3000), unsafe { Source::new(data.as_ptr(), 3000) });
        la.send_progress(&mut send).unwrap();
        let mut recv = RecvJob::new(meta(3000), sink(&mut out, 2000));
        let e = lb.recv_progress(&mut recv).unwrap_err();
        assert!(
            matches!(&e, ErrorKind::Mismatch { theirs, .. } if theirs.contains("3000-byte frame where 1 to 2000")),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// From the threshold on, a message crosses as one rendezvous slot and a
    /// read of the sender's memory, whole (copy) or reduced on the way;
    /// below it, through the ring. The sender's job ends only once the
    /// receiver has read everything.
    #[test]
    fn large_messages_go_by_single_copy() {
        let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("test", 64 * 1024);
        assert!(
            la.single_copy() && lb.single_copy(),
            "this process can read itself"
        );
        let data: Vec<u8> = (0..600_000u32).map(|i| (i * 13 % 101) as u8).collect();
        // A destination at the source's offset within a line, or 48 bytes
        // past it, is read into straight; one 16 bytes past it through a
        // lined-up scratch chunk (the kernel's copy is slow there; `crate::copy`).
        let mut room = vec![0u8; data.len() + 128];
        let lined_up = (data.as_ptr() as usize).wrapping_sub(room.as_ptr() as usize) % 64;
        for (shift, via_scratch) in [(0, false), (48, false), (16, true)] {
            room.fill(0);
            let at = lined_up + shift;
            transfer(
                &mut la,
                &mut lb,
                &data,
                &mut room[at..at + data.len()],
                SinkMode::Copy,
            );
            assert!(room[at..at + data.len()] == data[..], "shift {shift}");
            assert_eq!(!lb.cma_scratch.is_empty(), via_scratch, "shift {shift}");
        }
        assert_eq!(
            la.tx.mine, 3,
            "one rendezvous slot a message, not {} data slots",
            la.tx.mine
        );
        // A reducing receive: out = out + data, chunk by chunk.
        let mut acc: Vec<u8> = (0..data.len()).map(|i| (i % 7) as u8).collect();
        let want: Vec<u8> = acc
            .iter()
            .zip(&data)
            .map(|(a, d)| a.wrapping_add(*d))
            .collect();
        transfer(&mut la, &mut lb, &data, &mut acc, SinkMode::ReduceInPlace);
        assert_eq!(acc, want);
        assert_eq!(la.tx.mine, 4);
        // Below the threshold: the ring (4 KiB frames).
        let small = &data[..10_000];
        let mut out = vec![0u8; small.len()];
        transfer(&mut la, &mut lb, small, &mut out, SinkMode::Copy);
        assert_eq!(out, small);
        assert_eq!(la.tx.mine, 4 + 3);
        // Any-source matching sees the message the rendezvous stands for.
        // SAFETY: as above.
        let src = unsafe { Source::new(data.as_ptr(), data.len()) };
        let mut send = SendJob::new(meta(data.len() as u64), src);
        assert!(la.send_progress(&mut send).unwrap());
        let h = lb.peek_header().unwrap();
        assert_eq!((h.frame, h.len), (FRAME_DATA, data.len() as u64));
        assert!(
            !la.send_progress(&mut send).unwrap() && !send.done,
            "done before the read"
        );
        let mut out = vec![0u8; data.len()];
        let mut recv = copy_into(&mut out);
        while !recv.done {
            lb.recv_progress(&mut recv).unwrap();
        }
        assert!(la.tx_ready());
        assert!(la.send_progress(&mut send).unwrap() && send.done);
        assert_eq!(out, data);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A message its call would rather stream (broadcast, reduce: see
    /// `engine::prefers_stream`) stays in the ring above the single-copy
    /// threshold when its collective is in `ShmConfig::stream`, reduced on
    /// arrival; otherwise, and for a message that does not prefer it, single
    /// copy.
    #[test]
    fn messages_that_prefer_streaming_stay_in_the_ring_when_asked() {
        let dir = std::env::temp_dir().join(format!("cadence-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let cases = [
            (Streamed::DEFAULT, CollKind::Reduce, true, true),
            (Streamed::DEFAULT, CollKind::Reduce, false, false),
            (Streamed::DEFAULT, CollKind::Broadcast, true, false),
            (Streamed::NONE, CollKind::Reduce, true, false),
            (
                Streamed {
                    reduce: false,
                    broadcast: true,
                },
                CollKind::Broadcast,
                true,
                true,
            ),
        ];
        for (k, (stream, coll, prefer, ring)) in cases.into_iter().enumerate() {
            let cfg = ShmConfig {
                frame_bytes: 4096,
                nframes: 4,
                ring_bytes: 16 * 1024,
                cma_min: 64 * 1024,
                stream,
            };
            let sub = dir.join(format!("case{k}"));
            std::fs::create_dir_all(&sub).unwrap();
            let (mut la, mut lb, _ia, _ib) = pair_of(&sub, 2, 0, 1, cfg);
            let mut acc: Vec<u8> = (0..data.len()).map(|i| (i % 5) as u8).collect();
            let want: Vec<u8> = acc
                .iter()
                .zip(&data)
                .map(|(a, d)| a.wrapping_add(*d))
                .collect();
            let mut m = meta(data.len() as u64);
            m.coll = coll;
            // SAFETY: `data` and `acc` outlive the jobs; nothing else touches them.
            let src = unsafe { Source::new(data.as_ptr(), data.len()) };
            // SAFETY: as for `src`.
            let sink = unsafe {
                Sink::new(
                    acc.as_mut_ptr(),
                    acc.len(),
                    SinkMode::ReduceInPlace,
                    DType::U8,
                    ElemOp::Sum,
                )
            };
            let mut send = SendJob::new(m, src);
            send.prefer_stream = prefer;
            let mut recv = RecvJob::new(m, sink);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !(send.done && recv.done) {
                la.send_progress(&mut send).unwrap();
                lb.recv_progress(&mut recv).unwrap();
                assert!(Instant::now() < deadline, "transfer did not finish");
            }
            assert_eq!(acc, want, "case {k}");
            let (frames, single) = (la.tx.mine, la.stats.single_copy_sent.get());
            let want_frames = if ring { (74, 0) } else { (1, 1) };
            assert_eq!(
                (frames, single),
                want_frames,
                "case {k}: 4 KiB frames or one rendezvous"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A read straight into the destination takes the message in one call
    /// below `HELP_MIN`; from there in `help_chunk`s that the receiver reads
    /// or the sender writes, whichever claims each first (when the sender
    /// does not help, the receiver reads them all). A read through the
    /// scratch (a reducing receive) takes `CMA_CHUNK` a call. Every byte
    /// arrives, the last chunk partial.
    #[test]
    fn single_copy_reads_in_chunks_that_the_sender_may_share() {
        let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("chunks", 64 * 1024);
        let big = 9 * (1 << 20) + 100_003;
        let data: Vec<u8> = (0..big as u32).map(|i| (i * 29 % 251) as u8).collect();
        // One message of `len` bytes; the sender polls (and helps) after
        // every `sender_every`-th receiver poll (0: never). Returns the
        // receiver's polls that moved it on.
        let run =
            |la: &mut ShmLink, lb: &mut ShmLink, out: &mut [u8], mode, sender_every: usize| {
                let len = out.len();
                // SAFETY: `data` and `out` outlive the jobs; nothing else touches them.
                let src = unsafe { Source::new(data.as_ptr(), len) };
                // SAFETY: as for `src`.
                let sink =
                    unsafe { Sink::new(out.as_mut_ptr(), len, mode, DType::U8, ElemOp::Sum) };
                let mut send = SendJob::new(meta(len as u64), src);
                let mut recv = RecvJob::new(meta(len as u64), sink);
                assert!(la.send_progress(&mut send).unwrap());
                let (mut reads, mut polls) = (0, 0);
                let deadline = Instant::now() + Duration::from_secs(10);
                while !recv.done {
                    reads += usize::from(lb.recv_progress(&mut recv).unwrap());
                    polls += 1;
                    if sender_every > 0 && polls % sender_every == 0 {
                        la.send_progress(&mut send).unwrap();
                    }
                    assert!(Instant::now() < deadline, "the message did not arrive");
                }
                while !send.done {
                    la.send_progress(&mut send).unwrap();
                }
                reads
            };
        let mut room = vec![0u8; big + 64];
        let at = (data.as_ptr() as usize).wrapping_sub(room.as_ptr() as usize) % 64;
        // Below HELP_MIN: one read (it took 8 of 256 KiB).
        let len = HELP_MIN - 1;
        assert_eq!(
            run(&mut la, &mut lb, &mut room[at..at + len], SinkMode::Copy, 0),
            1
        );
        assert!(room[at..at + len] == data[..len]);
        assert!(lb.cma_scratch.is_empty(), "no scratch for straight reads");
        // From HELP_MIN, a sender that does not poll: the receiver reads
        // every chunk itself (and a last poll finds them all in).
        let chunks = big.div_ceil(help_chunk(big));
        assert!(chunks >= 8 && help_chunk(big) >= 1 << 20, "{chunks}");
        room.fill(0);
        assert_eq!(
            run(&mut la, &mut lb, &mut room[at..at + big], SinkMode::Copy, 0),
            chunks + 1
        );
        assert!(room[at..at + big] == data[..]);
        assert_eq!(la.stats.single_copy_helped.get(), 0);
        assert!(la.help_tx_ok && lb.help_rx.is_none());
        // A sender that polls as often as the receiver takes chunks too.
        room.fill(0);
        let reads = run(&mut la, &mut lb, &mut room[at..at + big], SinkMode::Copy, 1);
        assert!(room[at..at + big] == data[..]);
        let helped = la.stats.single_copy_helped.get() as usize;
        assert!(
            helped > 0 && helped < big,
            "the sender wrote {helped} of {big} bytes"
        );
        assert!(
            reads <= chunks,
            "the receiver read {} of {chunks} chunks",
            reads - 1
        );
        assert_eq!(lb.stats.bytes_recv.get() as usize, HELP_MIN - 1 + 2 * big);
        // Reducing: through the scratch, CMA_CHUNK a call, never helped.
        let mut acc = vec![1u8; big];
        let reads = run(&mut la, &mut lb, &mut acc, SinkMode::ReduceInPlace, 1);
        assert_eq!(reads, big.div_ceil(CMA_CHUNK));
        assert!(acc.iter().zip(&data).all(|(a, d)| *a == d.wrapping_add(1)));
        assert_eq!(la.stats.single_copy_helped.get() as usize, helped);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A chunk the sender fails to write (here: the offered address made
    /// invalid after the offer) is read by the receiver, and the sender
    /// stops helping; a revoked offer lets the sender claim nothing more.
    #[test]
    fn a_failed_or_revoked_help_leaves_the_receiver_to_read() {
        let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("help", 64 * 1024);
        let len = 6 << 20;
        let data: Vec<u8> = (0..len as u32).map(|i| (i * 7 % 253) as u8).collect();
        // Lined up with `data` within a line: a destination shifted from the
        // source is never offered.
        let mut room = vec![0u8; len + 64];
        let at = (data.as_ptr() as usize).wrapping_sub(room.as_ptr() as usize) % 64;
        let out = &mut room[at..at + len];
        let start = |la: &mut ShmLink, lb: &mut ShmLink, out: &mut [u8]| {
            // SAFETY: `data` and `out` outlive the jobs; nothing else touches them.
            let src = unsafe { Source::new(data.as_ptr(), len) };
            let mut send = SendJob::new(meta(len as u64), src);
            let mut recv = copy_into(out);
            assert!(la.send_progress(&mut send).unwrap());
            // The offer, and the receiver's first chunk.
            assert!(lb.recv_progress(&mut recv).unwrap() && lb.help_rx.is_some());
            (send, recv)
        };
        let (mut send, mut recv) = start(&mut la, &mut lb, out);
        lb.rx.ctl_u64(CTL_HELP_DST).store(64, Ordering::Relaxed);
        assert!(la.send_progress(&mut send).unwrap(), "claimed a chunk");
        assert!(!la.help_tx_ok && la.stats.single_copy_helped.get() == 0);
        while !recv.done {
            lb.recv_progress(&mut recv).unwrap();
        }
        assert!(la.send_progress(&mut send).unwrap() && send.done);
        assert!(
            *out == data[..],
            "the failed chunk was read by the receiver"
        );
        // Revoked: the sender (helping again) finds nothing to claim.
        la.help_tx_ok = true;
        out.fill(0);
        let (mut send, recv) = start(&mut la, &mut lb, out);
        lb.revoke_help();
        assert!(lb.help_rx.is_none());
        assert!(!la.send_progress(&mut send).unwrap());
        assert_eq!(la.stats.single_copy_helped.get(), 0);
        drop(recv);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A receiver that expects another length gets a mismatch error naming
    /// both calls, as for a data frame.
    #[test]
    fn single_copy_checks_the_length() {
        let (dir, mut la, mut lb, _ia, _ib) = cma_pair_in("len", 4096);
        let data = vec![1u8; 100_000];
        let mut out = vec![0u8; 50_000];
        // SAFETY: both outlive the jobs.
        let src = unsafe { Source::new(data.as_ptr(), data.len()) };
        // SAFETY: `out` outlives the job and nothing else touches it.
        let sink = unsafe {
            Sink::new(
                out.as_mut_ptr(),
                out.len(),
                SinkMode::Copy,
                DType::U8,
                ElemOp::Sum,
            )
        };
        let mut send = SendJob::new(meta(data.len() as u64), src);
        let mut recv = RecvJob::new(meta(data.len() as u64), sink);
        la.send_progress(&mut send).unwrap();
        let e = lb.recv_progress(&mut recv).unwrap_err();
        assert!(matches!(e, ErrorKind::Mismatch { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
