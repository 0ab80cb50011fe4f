//! Per-link counters: written by the engine, read by metrics and dumps on
//! any thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
