//! Helpers the tests share: for the wire tests (`fuzz_wire.rs`,
//! `failover.rs`) loopback socket pairs, a frame's operation metadata,
//! waiting for a receiving link and proptest's case budget; for the
//! communicator tests (`in_process.rs`, `scale.rs`, `split_links.rs`) a
//! configuration that measures nothing at start-up and a job of threads;
//! for the measurements (`scale.rs`, `choice_scale.rs`) a heap counter.
#![allow(dead_code)] // each test crate uses its own subset

use cadence_core::transport::tcp::{poll_fds, TcpLink};
use cadence_core::transport::{OpMeta, RecvJob, Sink, SinkMode};
use cadence_core::types::ElemOp;
use cadence_core::{CollKind, DType, ErrorKind, RedOp};
use proptest::test_runner::Config as PtConfig;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, counting the heap bytes in use and their peak: a
/// test crate that measures memory installs it,
/// `#[global_allocator] static ALLOC: common::CountingAlloc = common::CountingAlloc;`,
/// to tell what it holds from what the allocator keeps (RSS holds both).
pub struct CountingAlloc;

static HEAP_LIVE: AtomicUsize = AtomicUsize::new(0);
static HEAP_PEAK: AtomicUsize = AtomicUsize::new(0);

impl CountingAlloc {
    fn grew(by: usize) {
        let now = HEAP_LIVE.fetch_add(by, Ordering::Relaxed) + by;
        // A read first: the write (a contended one across thousands of rank
        // threads in scale.rs) only when the peak moves.
        if now > HEAP_PEAK.load(Ordering::Relaxed) {
            HEAP_PEAK.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Heap bytes in use now.
    pub fn live() -> usize {
        HEAP_LIVE.load(Ordering::Relaxed)
    }

    /// Starts a new peak from what is in use now; returns that.
    pub fn reset_peak() -> usize {
        let now = Self::live();
        HEAP_PEAK.store(now, Ordering::Relaxed);
        now
    }

    /// The most heap bytes in use since the last `reset_peak`.
    pub fn peak() -> usize {
        HEAP_PEAK.load(Ordering::Relaxed)
    }
}

// SAFETY: every call goes to the system allocator unchanged; the counters
// only observe sizes.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc(l) };
        if !p.is_null() {
            Self::grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(p, l) };
        HEAP_LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let q = unsafe { std::alloc::System.realloc(p, l, new) };
        if !q.is_null() {
            HEAP_LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            Self::grew(new);
        }
        q
    }
}

/// A configuration whose set-up measures nothing (no calibration, no
/// topology profile): tests of what set-up links and when.
pub fn measuring_nothing(timeout: Duration) -> cadence_core::Config {
    cadence_core::Config {
        timeout,
        calibrate: false,
        topo: cadence_core::config::TopoSource::Off,
        ..cadence_core::Config::default()
    }
}

/// What a rank of [`world`] gets besides its communicator: the job's
/// secret and id, to make splits with.
pub struct Job {
    pub secret: cadence_core::JobSecret,
    pub id: String,
}

/// Starts `n` ranks, one thread each, meeting through an in-memory store
/// as processes do (each may make at most two store operations); rank r's
/// host is `host(r)`. Returns each rank's result of `body`.
pub fn world<T: Send + 'static>(
    n: usize,
    host: fn(usize) -> String,
    cfg: cadence_core::Config,
    body: impl Fn(&cadence_core::Comm, &Job) -> T + Send + Sync + 'static,
) -> Vec<T> {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let id = format!("t{}x{nanos}", std::process::id());
    let secret = cadence_core::JobSecret::random().unwrap();
    let store = std::sync::Arc::new(cadence_core::rendezvous::MemoryStore::new());
    let body = std::sync::Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (store, body, cfg) = (store.clone(), body.clone(), cfg.clone());
            let job = Job {
                secret: secret.clone(),
                id: id.clone(),
            };
            std::thread::spawn(move || {
                let ip = "127.0.0.1".parse().unwrap();
                let b = cadence_core::Bootstrap::new(
                    &job.id,
                    r,
                    n,
                    &host(r),
                    ip,
                    cfg,
                    job.secret.clone(),
                )
                .unwrap();
                let mine = store.handle();
                let comm = b.join(&mine, "world").unwrap();
                assert!(
                    mine.ops() <= 2,
                    "rank {r} made {} store operations",
                    mine.ops()
                );
                body(&comm, &job)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Ends a split as Python's `split` does: every rank of `comm` (members
/// with their `boot`, the others with None) passes its listening port and
/// clock offset round by an allgather over `comm`, and the members connect
/// the split of `members` (in its rank order). None off the split.
pub fn split_by_allgather(
    comm: &cadence_core::Comm,
    boot: Option<cadence_core::Bootstrap>,
    members: &[usize],
) -> Option<cadence_core::Comm> {
    let n = comm.nranks();
    let c = comm.clock_offset();
    let port = boot.as_ref().map_or(0, |b| b.ports()[0] as i64);
    let row = [port, c.offset_ns, c.error_ns as i64];
    let mut rows = vec![0i64; 3 * n];
    comm.run(
        cadence_core::OpRequest::new(CollKind::AllGather, DType::I64, RedOp::Sum, 0, vec![3; n])
            .input(bytemuck::cast_slice(&row))
            .output(bytemuck::cast_slice_mut(&mut rows)),
    )
    .unwrap();
    let ports: Vec<Vec<u16>> = members.iter().map(|&q| vec![rows[3 * q] as u16]).collect();
    let clocks: Vec<(i64, u64)> = members
        .iter()
        .map(|&q| (rows[3 * q + 1], rows[3 * q + 2] as u64))
        .collect();
    boot.map(|b| b.connect_split(comm, members, &ports, &clocks).unwrap())
}

pub const SEQ: u64 = 5;
pub const SIG: u64 = 0x5151_abcd_0000_1234;

/// Cases per property: `PROPTEST_CASES`, else `default` (the `cargo test`
/// budget).
pub fn cases(default: u32) -> PtConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    PtConfig {
        cases: n,
        failure_persistence: None,
        ..PtConfig::default()
    }
}

/// An allreduce (sum) of `count` elements of `dtype`, call SEQ, signature SIG.
pub fn meta(dtype: DType, count: usize) -> OpMeta {
    OpMeta {
        coll: CollKind::AllReduce,
        dtype,
        redop: RedOp::Sum.code(),
        root: 0,
        seq: SEQ,
        sig: SIG,
        count: count as u64,
        comm: 1,
    }
}

/// `n` connected loopback pairs: (sending ends, receiving ends).
pub fn socket_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut tx = Vec::new();
    let mut rx = Vec::new();
    for _ in 0..n {
        tx.push(TcpStream::connect(addr).unwrap());
        rx.push(l.accept().unwrap().0);
    }
    (tx, rx)
}

/// Waits (at most 10 ms) until a stream a receive waits on has bytes.
pub fn wait_readable(link: &TcpLink) {
    let mut fds: Vec<libc::pollfd> = link
        .waiting_fds(false, true)
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    poll_fds(&mut fds, Duration::from_millis(10));
}

/// Receives the next message, `len` bytes of i32 (summed onto zeros, or
/// copied), on `link`; panics on a hang (no outcome within 10 s).
pub fn receive_i32(link: &mut TcpLink, len: usize, reduce: bool) -> Result<Vec<u8>, ErrorKind> {
    let mut mem = vec![0u8; len];
    let mode = if reduce {
        SinkMode::ReduceInPlace
    } else {
        SinkMode::Copy
    };
    // SAFETY: `mem` is valid for `len` bytes and outlives the job, dropped
    // before `mem` is returned; nothing else touches it meanwhile.
    let sink = unsafe { Sink::new(mem.as_mut_ptr(), len, mode, DType::I32, ElemOp::Sum) };
    let mut job = RecvJob::new(meta(DType::I32, len / 4), sink);
    let limit = Instant::now() + Duration::from_secs(10);
    while !job.done {
        if !link.recv_progress(&mut job)? {
            assert!(Instant::now() < limit, "hang: no outcome within 10 s");
            wait_readable(link);
        }
    }
    drop(job);
    Ok(mem)
}
