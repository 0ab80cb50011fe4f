//! Shared-memory transport between ranks on one host.
//!
//! Terms:
//! - **inbox**: a file in `/dev/shm` that one rank creates and maps; it holds
//!   one ring per same-host sender plus a header (pid, abort notice). Each rank
//!   creates only its own inbox, so creation never races; peers open it, and it
//!   is unlinked once everyone has mapped it, so a crash leaves nothing behind.
//! - **ring**: a single-producer single-consumer queue of `nslots` slots. The
//!   receiver owns `tail` (on its own cache line), which the sender caches and
//!   rereads only when the ring looks full (reading a line the other core
//!   writes costs a cache miss).
//! - **stamp**: the k-th frame's slot carries stamp k+1, written last; the
//!   receiver polls the stamp of the slot it expects next, so it touches no
//!   separate counter (as NCCL's low-latency protocol puts flags with data).
//! - **slot**: a frame header ([`WireHeader`]) followed by up to `slot_bytes`
//!   of payload. Small messages are one slot: the receiver sees them by
//!   polling one counter, with no system call (flags instead of syscalls).
//!
//! Sleeping: a rank that has waited long (ranks outnumber cores) sleeps on the
//! futex **doorbell** in its own inbox after raising its `sleeping` flag and
//! re-checking its rings; whoever publishes into one of its rings, or frees a
//! slot it waits for, rings the doorbell when the flag is up.
//!
//! Ordering: the sender writes a slot, then publishes it with a release store
//! of its stamp; the receiver acquires the stamp, reads the slot, and releases
//! it with a release store of `tail`.

use super::{
    AbortNotice, LinkStats, RecvJob, SendJob, StallNotice, WireHeader, ABORT_TEXT_MAX,
    HEADER_BYTES, STALL_CHAIN_MAX,
};
use crate::error::ErrorKind;
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
const OFF_SLOT_BYTES: usize = 20;
const OFF_NSLOTS: usize = 24;
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
const HEADER_FIELDS: [(usize, usize); 15] = [
    (OFF_MAGIC, 8),
    (OFF_PID, 4),
    (OFF_NRINGS, 4),
    (OFF_SLOT_BYTES, 4),
    (OFF_NSLOTS, 4),
    (OFF_ABORT_FLAG, 4),
    (OFF_ABORT_ORIGIN, 4),
    (OFF_ABORT_LEN, 4),
    (OFF_ABORT_MISMATCH, 4),
    (OFF_ABORT_BLAMED_SIG, 8),
    (OFF_ABORT_DETECTOR_SIG, 8),
    (OFF_ABORT_DETECTOR, 4),
    (OFF_DOORBELL, 4),
    (OFF_SLEEPING, 4),
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
/// Ring control: the receiver's `tail`, alone on its cache line.
const RING_CTL: usize = 64;
/// A slot's first cache line: the frame header (48 bytes), the slot's stamp
/// (8 bytes) and up to 8 bytes of inline payload. Payloads of at most
/// `INLINE_MAX` bytes live in that line, so a small message costs the
/// receiver one cache-line transfer; larger ones start at the next line.
const SLOT_HDR: usize = 64;
const OFF_STAMP: usize = 48;
const OFF_INLINE: usize = 56;
const INLINE_MAX: usize = 8;

/// Ring geometry. Larger slots mean fewer hand-offs per byte; more slots mean
/// more data in flight. 8 × 64 KiB keeps a ring's working set near L2 size.
#[derive(Clone, Copy, Debug)]
pub struct ShmConfig {
    pub slot_bytes: usize,
    pub nslots: usize,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            slot_bytes: 64 * 1024,
            nslots: 8,
        }
    }
}

/// Where a slot's payload of `len` bytes starts: inline in the header line
/// when it fits, else on the next line.
fn payload_offset(len: usize) -> usize {
    if len <= INLINE_MAX {
        OFF_INLINE
    } else {
        SLOT_HDR
    }
}

fn ring_size(cfg: &ShmConfig) -> usize {
    (RING_CTL + cfg.nslots * (SLOT_HDR + cfg.slot_bytes)).next_multiple_of(4096)
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
        // exclusive use of these bytes until it publishes them.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(off), src.len()) }
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
        let map = MmapRaw::map_raw(&file).map_err(|e| format!("mmap {}: {e}", path.display()))?;
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
            .atomic_u32(OFF_SLOT_BYTES)
            .store(cfg.slot_bytes as u32, Ordering::Relaxed);
        region
            .atomic_u32(OFF_NSLOTS)
            .store(cfg.nslots as u32, Ordering::Relaxed);
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
        let r = &self.region;
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

    /// Cheap check used in every wait loop.
    #[inline]
    pub fn aborted(&self) -> bool {
        self.region
            .atomic_u32(OFF_ABORT_FLAG)
            .load(Ordering::Relaxed)
            == 2
    }
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
    let map = MmapRaw::map_raw(file).map_err(|e| format!("mmap {}: {e}", path.display()))?;
    let region = Region {
        map,
        path: path.to_owned(),
        owner: false,
        unlinked: AtomicU32::new(1),
    };
    if region.atomic_u64(OFF_MAGIC).load(Ordering::Acquire) != INBOX_MAGIC {
        return Ok(None);
    }
    let cfg = ShmConfig {
        slot_bytes: region.atomic_u32(OFF_SLOT_BYTES).load(Ordering::Relaxed) as usize,
        nslots: region.atomic_u32(OFF_NSLOTS).load(Ordering::Relaxed) as usize,
    };
    let nrings = region.atomic_u32(OFF_NRINGS).load(Ordering::Relaxed) as usize;
    if region.map.len() < header_size(nrings) + nrings * ring_size(&cfg) {
        return Ok(None);
    }
    let pid = region.atomic_u32(OFF_PID).load(Ordering::Relaxed);
    Ok(Some((Arc::new(region), pid)))
}

/// One direction of a ring as seen by one side.
struct RingEnd {
    region: Arc<Region>,
    base: usize,
    cfg: ShmConfig,
    /// Our own counter (head for the sender, tail for the receiver).
    mine: u64,
    /// Last value read of the other side's counter.
    theirs: u64,
}

impl RingEnd {
    /// The stamp of the slot that holds frame `n`.
    fn stamp(&self, n: u64) -> &AtomicU64 {
        self.region.atomic_u64(self.slot(n) + OFF_STAMP)
    }
    fn tail(&self) -> &AtomicU64 {
        self.region.atomic_u64(self.base)
    }
    fn slot(&self, n: u64) -> usize {
        self.base
            + RING_CTL
            + (n % self.cfg.nslots as u64) as usize * (SLOT_HDR + self.cfg.slot_bytes)
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
    pub stats: LinkStats,
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
        let peer_cfg = ShmConfig {
            slot_bytes: peer_inbox
                .atomic_u32(OFF_SLOT_BYTES)
                .load(Ordering::Relaxed) as usize,
            nslots: peer_inbox.atomic_u32(OFF_NSLOTS).load(Ordering::Relaxed) as usize,
        };
        let peer_nrings = peer_inbox.atomic_u32(OFF_NRINGS).load(Ordering::Relaxed) as usize;
        let tx = RingEnd {
            region: peer_inbox.clone(),
            base: header_size(peer_nrings) + my_local * ring_size(&peer_cfg),
            cfg: peer_cfg,
            mine: 0,
            theirs: 0,
        };
        let rx = RingEnd {
            region: my_inbox.region.clone(),
            base: header_size(my_inbox.nrings) + peer_local * ring_size(&my_inbox.cfg),
            cfg: my_inbox.cfg,
            mine: 0,
            theirs: 0,
        };
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
            stats: LinkStats {
                peer,
                transport: "shm",
                ..Default::default()
            },
        }
    }

    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        let total = job.src.len();
        let slot_bytes = self.tx.cfg.slot_bytes;
        let nslots = self.tx.cfg.nslots as u64;
        let mut progressed = false;
        while !job.done {
            if self.tx.mine - self.tx.theirs >= nslots {
                self.tx.theirs = self.tx.tail().load(Ordering::Acquire);
                if self.tx.mine - self.tx.theirs >= nslots {
                    break;
                }
            }
            let n = slot_bytes.min(total - job.sent);
            let slot = self.tx.slot(self.tx.mine);
            let hdr = job.meta.header(n);
            self.tx.region.write(slot, bytemuck::bytes_of(&hdr));
            let data = payload_offset(n);
            self.tx
                .region
                .write(slot + data, job.src.bytes(job.sent, n));
            self.tx
                .stamp(self.tx.mine)
                .store(self.tx.mine + 1, Ordering::Release);
            self.tx.mine += 1;
            ring_doorbell(&self.peer_inbox);
            job.sent += n;
            job.started = true;
            job.done = job.sent == total;
            progressed = true;
            self.stats.bytes_sent += n as u64;
        }
        if job.done && progressed {
            self.stats.msgs_sent += 1;
        }
        Ok(progressed)
    }

    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        let total = job.sink.len();
        let slot_bytes = self.rx.cfg.slot_bytes;
        let mut progressed = false;
        while !job.done {
            if self.rx.stamp(self.rx.mine).load(Ordering::Acquire) != self.rx.mine + 1 {
                break;
            }
            let want = slot_bytes.min(total - job.got);
            let slot = self.rx.slot(self.rx.mine);
            let hdr: WireHeader =
                bytemuck::pod_read_unaligned(self.rx.region.read(slot, HEADER_BYTES));
            job.meta.check(&hdr, self.peer, want)?;
            let data = payload_offset(want);
            job.sink
                .deliver(job.got, self.rx.region.read(slot + data, want));
            self.rx.mine += 1;
            self.rx.tail().store(self.rx.mine, Ordering::Release);
            // The sender may sleep waiting for a free slot.
            ring_doorbell(&self.peer_inbox);
            job.got += want;
            job.started = true;
            job.done = job.got == total;
            progressed = true;
            self.stats.bytes_recv += want as u64;
        }
        if job.done && progressed {
            self.stats.msgs_recv += 1;
        }
        Ok(progressed)
    }

    /// Whether a receive from this peer could move now (a frame is published).
    /// The header of the next frame in the ring, if one is published; the
    /// frame stays there.
    pub fn peek_header(&self) -> Option<WireHeader> {
        if !self.rx_ready() {
            return None;
        }
        let slot = self.rx.slot(self.rx.mine);
        Some(bytemuck::pod_read_unaligned(
            self.rx.region.read(slot, HEADER_BYTES),
        ))
    }

    pub fn rx_ready(&self) -> bool {
        self.rx.stamp(self.rx.mine).load(Ordering::Acquire) == self.rx.mine + 1
    }

    /// Whether a send to this peer could move now (a slot is free).
    pub fn tx_ready(&self) -> bool {
        self.tx.mine - self.tx.tail().load(Ordering::Acquire) < self.tx.cfg.nslots as u64
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

    /// Leaves an abort notice in the peer's inbox (first notice wins).
    pub fn send_abort(&mut self, notice: &AbortNotice) {
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

/// Wakes the owner of `inbox` if it sleeps. The fence orders our preceding
/// publish before the flag read, pairing with the sleeper's flag store before
/// its re-check: one of the two always sees the other.
fn ring_doorbell(inbox: &Region) {
    std::sync::atomic::fence(Ordering::SeqCst);
    if inbox.atomic_u32(OFF_SLEEPING).load(Ordering::Relaxed) != 0 {
        inbox
            .atomic_u32(OFF_DOORBELL)
            .fetch_add(1, Ordering::Release);
        futex_wake(inbox.atomic_u32(OFF_DOORBELL));
    }
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

    /// Two inboxes of `nrings` rings in a private directory, linked as local
    /// ranks `a` and `b`: (a's link to b, b's link to a).
    fn pair(dir: &Path, nrings: usize, a: usize, b: usize) -> (ShmLink, ShmLink, Inbox, Inbox) {
        let cfg = ShmConfig {
            slot_bytes: 4096,
            nslots: 4,
        };
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
        // SAFETY: `data` and `out` outlive the jobs and nothing else touches them.
        let src = unsafe { Source::new(data.as_ptr(), data.len()) };
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
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(send.done && recv.done) {
            la.send_progress(&mut send).unwrap();
            lb.recv_progress(&mut recv).unwrap();
            assert!(Instant::now() < deadline, "transfer did not finish");
        }
        assert_eq!(out, data);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
