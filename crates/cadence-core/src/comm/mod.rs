//! The communicator: one rank's end of a group that runs collectives and
//! point-to-point operations together. This file is its public face; the
//! machinery is one concern per file:
//!
//! - `request.rs`: an operation as the user asks for it, and its buffers'
//!   lifetimes;
//! - `bootstrap.rs` (links to every peer), `gather.rs` (the peer table,
//!   completed among the ranks from O(1) store operations each),
//!   `peer_info.rs` (what a rank tells the others) and `setup.rs` (the state
//!   and the collective start-up steps);
//! - `execute.rs`: validation, algorithm choice (`crate::choice`), schedules, and
//!   running one operation through the engine; `p2p.rs` batches sends and
//!   receives;
//! - `progress.rs`: the progress thread that runs queued operations in issue
//!   order (an operation runs inline on the caller's thread when nothing is
//!   queued); `path_keeper.rs`: the links' background work between
//!   operations;
//! - `failure.rs`: a failed operation fails the communicator and tells every
//!   peer which rank is to blame;
//! - `records.rs`: the flight recorder's records and messages; `dump.rs`: the
//!   dump and metrics documents built from them;
//! - `state.rs`: the state all of these share.

mod bootstrap;
mod calibrate;
mod clock;
mod dump;
mod exchange_buf;
mod execute;
mod failure;
mod gather;
mod lazy;
pub mod limits;
mod links;
pub mod order;
mod p2p;
mod path_keeper;
mod peer_info;
mod peer_table;
pub mod profile;
mod progress;
mod records;
mod request;
mod setup;
mod shared_links;
mod split;
mod state;

pub use crate::engine::{InterruptCheck, INTERRUPT_EVERY};
pub use bootstrap::Bootstrap;
pub use clock::ClockOffset;
pub use dump::{DUMP_VERSION, METRICS_VERSION};
pub use gather::GATHER_STREAM;
pub use p2p::ANY_SOURCE;
pub use peer_info::PeerInfo;
pub use peer_table::PeerTable;
pub use progress::Completion;
pub use request::OpRequest;

use dump::Window;
pub(crate) use execute::fnv1a;
use p2p::is_any_source;
use progress::{ProgressThread, Task};
use records::{recv_record, send_record};
use state::{Inner, Shared};

use crate::config::Config;
use crate::error::{CommError, ErrorKind, Result};
use crate::schedule::{self, Algo, CollArgs, CostModel, Topology};
use crate::types::{CollKind, DType, RedOp};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One rank's end of a communicator. Operations run in the order this
/// rank issues them; every rank must issue the same collectives in the same
/// order.
pub struct Comm {
    shared: Arc<Shared>,
    /// Runs submitted operations; started by the first.
    worker: ProgressThread,
}

impl Comm {
    pub fn id(&self) -> &str {
        &self.shared.id
    }
    /// The job this communicator belongs to (see `Bootstrap::job`).
    pub fn job(&self) -> &str {
        &self.shared.job
    }
    /// This rank's wall clock against rank 0's, measured at start-up.
    pub fn clock_offset(&self) -> ClockOffset {
        self.shared.clock
    }
    /// How many links this rank holds now (shared memory and TCP): with
    /// links made on first use, those its operations needed so far.
    pub fn links_open(&self) -> usize {
        let own = self.shared.links.lock().unwrap().len();
        // A split's TCP links are its root's, counted in the root's list.
        match self.shared.share.get() {
            Some(s) if !s.is_root() => own + s.links.len(),
            _ => own,
        }
    }
    pub fn rank(&self) -> usize {
        self.shared.rank
    }
    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }
    /// Rank `r`'s host identity.
    pub fn host_of(&self, r: usize) -> &str {
        self.shared.peers.host(r)
    }
    /// Every rank's host identity, by rank.
    pub fn hosts(&self) -> Vec<String> {
        (0..self.nranks())
            .map(|r| self.host_of(r).to_string())
            .collect()
    }
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }
    /// Which ranks share a host.
    pub fn topology(&self) -> &Topology {
        &self.shared.auto.topo
    }

    /// The ranks of this rank's host, ascending (the first is the host's
    /// leader): O(the host's ranks), where a dump lists every rank.
    pub fn host_ranks(&self) -> Vec<usize> {
        let t = self.topology();
        t.ranks_on(t.host_of(self.rank()))
    }

    /// Each host's lowest rank, ascending: O(hosts).
    pub fn host_leaders(&self) -> Vec<usize> {
        let t = self.topology();
        let mut v: Vec<usize> = (0..t.nhosts()).map(|h| t.leader(h)).collect();
        v.sort_unstable();
        v
    }

    /// The process id rank `r` reported at set-up.
    pub fn peer_pid(&self, r: usize) -> u32 {
        self.shared.peers.pid(r)
    }

    /// The cost model `auto` ranks algorithms by, and whether it was
    /// measured at start-up (else it is the tuning table's); `None`: the
    /// tuning table and the size table choose.
    pub fn cost_model(&self) -> Option<(CostModel, bool)> {
        let a = &self.shared.auto;
        a.model.map(|m| (m, a.measured_at_start))
    }

    /// The algorithms of `kind` that apply on this communicator's hosts.
    pub fn algorithms_for(&self, kind: CollKind) -> Vec<Algo> {
        schedule::algos_for(kind)
            .iter()
            .copied()
            .filter(|&a| {
                a != Algo::Hierarchical || self.shared.auto.topo.uniform_ranks_per_host().is_some()
            })
            .collect()
    }

    /// The algorithm a call with these arguments would run (its `algo`, or
    /// the library's choice: CADENCE_ALGO, the tuning table, the model, the
    /// size table), without running it. The fused operators ask this for
    /// their whole output and run every tile with the answer: tiles go back
    /// to back, as one transfer of the whole size would.
    pub fn choose(&self, kind: CollKind, counts: Vec<usize>, dtype: DType) -> Result<Algo> {
        let sh = &self.shared;
        let args = CollArgs {
            kind,
            root: 0,
            counts,
        };
        schedule::check_args(&args, sh.nranks)
            .map_err(|e| sh.err(ErrorKind::InvalidArgument(e.to_string()), None))?;
        let req = OpRequest::new(kind, dtype, RedOp::Sum, 0, args.counts.clone());
        sh.choose_algo(&req, &args)
    }

    /// Runs an operation to completion. When no asynchronous operation is
    /// queued it runs inline on the caller's thread: no hand-off, no wake-up.
    pub fn run(&self, req: OpRequest<'_>) -> Result<()> {
        self.run_interruptible(req, None).map(|_| ())
    }

    /// Like [`Comm::run`]; while the operation waits long (past the spin and
    /// yield stages), `interrupted` is asked every 100 ms whether the caller
    /// wants to give up (e.g. Ctrl-C in Python). Giving up fails the operation
    /// (and the communicator: the peers cannot be left half-way) with
    /// [`ErrorKind::Interrupted`]. It returns only once the operation no
    /// longer touches the caller's buffers. For a receive from
    /// [`ANY_SOURCE`], returns the rank it received from.
    pub fn run_interruptible(
        &self,
        req: OpRequest<'_>,
        interrupted: Option<InterruptCheck>,
    ) -> Result<Option<usize>> {
        // A receive from any source waits on every peer at once, which only
        // the point-to-point batch does.
        if self.shared.pending.load(Ordering::Acquire) == 0 && !is_any_source(&req) {
            // Inline: enqueued and started at once.
            let ticket = self.shared.ticket();
            return self
                .shared
                .execute(req, None, interrupted, ticket)
                .map(|_| None);
        }
        // SAFETY: this function waits below until the operation finished, on
        // every path (an interrupt cancels it and still waits), so the
        // borrowed buffers outlive its use. If `submit` fails, the request
        // was never queued.
        let done = self.submit(unsafe { req.detach() })?;
        let mut cancelled = false;
        loop {
            if let Some(r) = done.wait(Some(INTERRUPT_EVERY)) {
                return if cancelled {
                    Err(self.shared.err(ErrorKind::Interrupted, None))
                } else {
                    r.map(|_| done.source())
                };
            }
            if !cancelled && interrupted.as_ref().is_some_and(|f| f()) {
                // The progress thread gives up at its next wait; the
                // communicator fails, as for an inline interrupt.
                self.shared.cancel.set(ErrorKind::Interrupted);
                cancelled = true;
            }
        }
    }

    /// Runs `reqs` at once, like a group call (sends and receives move as
    /// soon as their peers are ready, so a ring of them cannot deadlock),
    /// and waits for them in the order given. Returns, per request, the time
    /// from the call until it was seen finished (a request later in `reqs`
    /// is seen no earlier than the ones before it), or the first error once
    /// every request has stopped.
    pub fn run_together(&self, reqs: Vec<OpRequest<'_>>) -> Result<Vec<Duration>> {
        let start = Instant::now();
        let mut queued = Vec::with_capacity(reqs.len());
        let mut first_err = None;
        for req in reqs {
            // SAFETY: every request queued here is waited for below, on
            // every path (also after an error), before this function returns,
            // so the borrowed buffers outlive its use.
            match self.submit(unsafe { req.detach() }) {
                Ok(done) => queued.push(done),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        let mut took = Vec::with_capacity(queued.len());
        for done in queued {
            let r = done.wait(None).expect("waits without a deadline");
            took.push(start.elapsed());
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(took),
        }
    }

    /// Queues an operation on the progress thread; operations complete in
    /// the order they were issued.
    pub fn submit(&self, req: OpRequest<'static>) -> Result<Arc<Completion>> {
        self.worker.submit(&self.shared, req)
    }

    /// Stops the progress thread (after queued operations finish).
    pub fn close(&self) {
        self.worker.stop();
    }

    /// The flight recorder (operations and their messages), link counters
    /// and who this rank is, as JSON (the dump format `cadence doctor`
    /// reads; see docs/diagnosis.md).
    pub fn dump_records(&self) -> String {
        self.shared.dump_json("on demand", None)
    }

    /// [`Comm::dump_records`] with the newest `last` operations only (what
    /// the live watchdog sends: cheaper than the whole ring).
    pub fn dump_recent(&self, last: usize) -> String {
        self.shared.dump_json("on demand", Some(last))
    }

    /// [`Comm::dump_recent`] as the live watchdog sends it in a round:
    /// every rank listed and the ring's host order in rank 0's only, each
    /// other rank listing itself and the peers it has links to. So a
    /// rank's part of a round does not grow with the job; the coordinator
    /// knows every rank from its own communicator.
    pub fn dump_round(&self, last: usize) -> String {
        self.shared
            .dump_json_filtered("live diagnosis", Some(last), None, self.shared.rank == 0)
            .expect("an unfiltered dump always has a body")
    }

    /// The newest `last` operations that completed successfully between
    /// `from_unix_ns` (included) and `to_unix_ns` (excluded), as a dump
    /// (what a slowness window sends); `None` when there were none. The
    /// filter runs before anything is serialized: a window costs the
    /// watchdog only the operations it sends.
    ///
    /// Of their messages only the timed receives of at least
    /// `min_recv_bytes` are kept (done, and with time between their first
    /// and last progress): the only ones the slowness classifier reads, and
    /// a fraction of the bytes to send and parse. Its `peers` are this
    /// rank and those it has links to, and it has no ring order: nothing in
    /// it grows with the job beyond the peers this rank uses.
    pub fn dump_window(
        &self,
        from_unix_ns: u64,
        to_unix_ns: u64,
        last: usize,
        min_recv_bytes: u64,
    ) -> Option<String> {
        let window = Window {
            from_unix_ns,
            to_unix_ns,
            min_recv_bytes,
        };
        self.shared
            .dump_json_filtered("slowness window", Some(last), Some(window), false)
    }

    /// Where this rank stands (operations started, the oldest still
    /// running): cheap enough to poll every second from a watchdog.
    pub fn progress(&self) -> crate::monitor::Progress {
        self.shared.recorder.lock().unwrap().progress()
    }

    /// Cumulative totals for metrics, as JSON: per collective kind,
    /// operations (ok, failed), bytes and a duration histogram since the
    /// communicator was created; every link's byte, message and busy-time
    /// counters; the oldest running operation. Cheap, and never waits for a
    /// running operation (format: docs/diagnosis.md, "Metrics").
    pub fn metrics(&self) -> String {
        self.shared.metrics_json()
    }

    /// Writes [`Comm::dump_records`] into `dir` (created if needed) as
    /// `cadence-<comm id>-rank<r>.json`, the file a failure writes under
    /// `CADENCE_DUMP_DIR`; returns its path. The file appears whole or not
    /// at all (written aside, then renamed).
    pub fn dump_to(&self, dir: &Path) -> std::io::Result<PathBuf> {
        self.shared.dump_to(dir, "on demand")
    }

    /// [`Comm::dump_to`] saying why (the dump's `reason`): the live
    /// watchdog writes one as soon as an operation is stuck.
    pub fn dump_to_because(&self, dir: &Path, reason: &str) -> std::io::Result<PathBuf> {
        self.shared.dump_to(dir, reason)
    }

    /// Test hook: writes garbage to the TCP link to `peer`.
    pub fn inject_garbage(&self, peer: usize) -> Result<()> {
        self.shared.inject_garbage(peer)
    }

    /// Fails the communicator on purpose and tells every peer why: the
    /// operation in flight (if any) gives up at its next wait, later ones
    /// fail at once, and each peer's pending or next operation fails with an
    /// error naming this rank and carrying `reason`. Returns once the peers
    /// have been told (at most the running operation's own deadline).
    pub fn abort(&self, reason: &str) {
        self.shared.abort(reason);
    }

    /// Whether the communicator failed (and why).
    pub fn failure(&self) -> Option<CommError> {
        self.shared.inner.lock().unwrap().failed.clone()
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.close();
    }
}
