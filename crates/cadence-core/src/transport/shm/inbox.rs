//! The inbox: a file in `/dev/shm` that one rank creates and maps; it holds
//! one ring per same-host sender plus a header (pid, ring geometry, abort
//! notice, doorbell, progress, stall table: `layout.rs`). Each rank creates
//! only its own inbox, so creation never races; peers open it once its
//! owner has written the magic last, and it is unlinked once everyone has
//! mapped it, so a crash leaves nothing behind.

use super::layout::{
    header_size, inbox_size, INBOX_MAGIC, MIN_HDR_SIZE, OFF_FRAME_BYTES, OFF_MAGIC, OFF_NFRAMES,
    OFF_NRINGS, OFF_PID, OFF_RING_BYTES, OFF_SELF_ADDR,
};
use super::sys::{allow_peer_reads, populate_supported, reserve, Region};
use super::{ShmConfig, Streamed};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to do when /dev/shm has no room for a ring.
pub(super) const NO_ROOM_HINT: &str = "the shared-memory file system is too small for this \
     many ranks on a host (each pair of ranks that talk needs a ring each way, \
     CADENCE_SHM_RING_BYTES plus about 72 KiB); give /dev/shm more room, e.g. docker run \
     --shm-size, or shrink the rings with CADENCE_SHM_RING_BYTES";

/// This rank's own inbox.
pub struct Inbox {
    pub region: Arc<Region>,
    pub cfg: ShmConfig,
    pub(super) nrings: usize,
}

impl Inbox {
    /// Creates the inbox file with `nrings` rings (one per same-host rank,
    /// indexed by local rank; the own one is unused).
    pub fn create(path: &Path, nrings: usize, cfg: ShmConfig) -> Result<Inbox, String> {
        if !cfg.is_valid() {
            return Err(format!("shared-memory ring geometry {cfg:?} is not usable"));
        }
        let size = inbox_size(nrings, &cfg);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600) // the owner only: other users must not read or write ranks' data
            .open(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        file.set_len(size as u64)
            .map_err(|e| format!("cannot size {} to {size} bytes: {e}", path.display()))?;
        // The header now; each ring on its first use (`RingEnd::resident`),
        // or every ring now where the kernel cannot do that.
        let now = if populate_supported() {
            header_size(nrings)
        } else {
            size
        };
        reserve(&file, now).map_err(|e| {
            format!(
                "cannot reserve {} MiB for {} ({e}): {NO_ROOM_HINT}",
                now.div_ceil(1 << 20),
                path.display(),
            )
        })?;
        let region =
            Region::map(&file, path, true).map_err(|e| format!("mmap {}: {e}", path.display()))?;
        region
            .populate(0, now)
            .map_err(|e| format!("cannot map {}: {e}", path.display()))?;
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
            .store(region.address(), Ordering::Relaxed);
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
}

/// The shortest and the longest pause between looks for a peer's inbox;
/// between them a pause lasts a quarter of the wait so far. So a peer that
/// is late costs a few dozen looks however late (thousands of ranks starting
/// on a few cores would otherwise spend them on failed opens), and a rank
/// sees the inbox at most a quarter later than it appeared (doubling the
/// pause, as before, made it up to twice as late: 16 ms for one 8 ms late).
const LOOK_FIRST: Duration = Duration::from_micros(500);
const LOOK_MAX: Duration = Duration::from_millis(100);

/// Opens a peer's inbox, waiting until its owner has initialised it.
pub fn open_peer_inbox(path: &Path, deadline: Instant) -> Result<(Arc<Region>, u32), String> {
    let started = Instant::now();
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
        let pause = (started.elapsed() / 4).clamp(LOOK_FIRST, LOOK_MAX);
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
    }
}

fn try_map_initialised(file: &File, path: &Path) -> Result<Option<(Arc<Region>, u32)>, String> {
    let len = file.metadata().map(|m| m.len() as usize).unwrap_or(0);
    if len < MIN_HDR_SIZE {
        return Ok(None);
    }
    let region =
        Region::map(file, path, false).map_err(|e| format!("mmap {}: {e}", path.display()))?;
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
    let nrings = ring_count(&region);
    if region.len() < inbox_size(nrings, &cfg) {
        return Ok(None);
    }
    let pid = region.atomic_u32(OFF_PID).load(Ordering::Relaxed);
    Ok(Some((Arc::new(region), pid)))
}

/// How many rings (and stall slots) an inbox holds.
pub(super) fn ring_count(inbox: &Region) -> usize {
    inbox.atomic_u32(OFF_NRINGS).load(Ordering::Relaxed) as usize
}

/// The ring geometry an inbox's owner chose, as its header says, with
/// `cma_min` (not part of the geometry) filled in by the caller; the
/// sender's own `stream` decides, as its `cma_min` does.
pub(super) fn geometry(inbox: &Region, cma_min: usize) -> ShmConfig {
    let field = |off| inbox.atomic_u32(off).load(Ordering::Relaxed) as usize;
    ShmConfig {
        frame_bytes: field(OFF_FRAME_BYTES),
        nframes: field(OFF_NFRAMES),
        ring_bytes: field(OFF_RING_BYTES),
        cma_min,
        stream: Streamed::NONE,
    }
}
