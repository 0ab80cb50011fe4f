//! The engine runs schedules. One engine per communicator; it owns the links
//! to every peer and executes one operation at a time, phase by phase (see
//! `schedule::ir` for the semantics it implements).
//!
//! One concern per file: [`Engine::drive`], the loop every operation runs
//! in, is here; `phases.rs` runs a schedule's phases through it, with the
//! lookahead of `lookahead.rs` and the folds of `folds.rs`; `lowered.rs`
//! prepares a lowered operation's buffers (`memory.rs` resolves spans to
//! them); `wait.rs` is how an idle round waits, `diagnosis.rs` what a rank
//! past its deadline does, `evidence.rs` what is recorded of the messages;
//! `tuning.rs` holds the engine's constants.
//!
//! Every wait checks the operation's deadline, the shared-memory abort
//! notice, and (every 100 ms) whether same-host peers are still alive.

mod context;
mod diagnosis;
mod evidence;
mod folds;
mod lazy;
mod links;
mod lookahead;
mod lowered;
mod memory;
mod phases;
mod pool;
mod tuning;
mod wait;

pub use context::{Cancel, InterruptCheck, OpCtx};
pub use evidence::{Evidence, Moment};
pub use lazy::{LinkMaker, LinkUse};
pub use links::Links;
pub use memory::Buffers;
pub use pool::{Pool, View};
pub use tuning::{
    INTERRUPT_EVERY, SNAPSHOT_AFTER, SNAPSHOT_EVERY, STAMP_AFTER_IDLE, STAMP_AFTER_IDLE_SHARED,
};
pub use wait::{Wait, WaitStats};

use crate::error::{CommError, ErrorKind};
use crate::schedule::Algo;
use crate::transport::shm::Inbox;
use crate::transport::{AbortNotice, Link, LinkCounters, RecvJob, SendJob};
use crate::types::CollKind;
use evidence::{stamp_moved, Recording};
use phases::Jobs;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tuning::{LIVENESS_EVERY, MAINTAIN_EVERY, NAP, NAP_MIXED, SPIN, YIELD};

/// Whether a call's messages would rather stream through the shared-memory
/// ring than go by single copy (`process_vm_readv`: the receiver's core
/// does the one copy while the sender waits); shared memory follows it for
/// the collectives in `CADENCE_SHM_STREAM` (default: reduce). Streamed, the
/// sender's core copies into the ring while the receiver's reads (or
/// reduces) what arrived: two cores on each message. That can pay where the
/// sender would otherwise idle or the receiver reduces: reduce (a
/// single-copy reducing receive reads into scratch and reduces again;
/// streamed it reduces straight from the ring) and broadcast (the root, and
/// every forwarding rank, has sent its data). Symmetric exchanges keep
/// single copy, where every core is busy with its own receives and one copy
/// less is the saving: scatter-allgather's allgather, allgather, alltoall,
/// allreduce. Broadcast is not streamed by default: measured, it gained in
/// some states of a machine and lost in others.
///
/// A streamed message moves only while its sender and receiver both run,
/// which ranks crowding the cores make rare: beyond `STREAM_RANKS_PER_CORE`
/// every message goes by single copy.
// Decided here, not in `transport::shm`: it reads the schedule's algorithm, and the transports sit
// below the schedule layer; shared memory only honours each job's `prefer_stream`.
pub fn prefers_stream(coll: CollKind, algo: Algo) -> bool {
    match coll {
        CollKind::Reduce => true,
        CollKind::Broadcast => algo != Algo::ScatterAllgather,
        _ => false,
    }
}

/// What the driver of [`Engine::drive`] decides before each round.
pub enum Turn {
    /// Everything is done.
    Finished,
    /// The driver changed the job lists (admitted or retired work): ask
    /// again before moving anything.
    Again,
    /// Move the transfers, and wait if nothing moves.
    Move(Moving),
}

/// How to wait when a round moves nothing.
pub struct Moving {
    /// The deadline of the oldest unfinished transfer.
    pub deadline: Instant,
    /// The operation being waited on, for stall notices.
    pub sig: u64,
    pub seq: u64,
    /// Something not yet in the job lists may arrive (a receive from any
    /// source, not yet matched): wait even when no transfer is pending.
    pub outside: bool,
}

/// The bits of [`Engine`]'s per-peer marks.
struct Marks;

impl Marks {
    /// The peer has an earlier unfinished send (resp. receive) in this pass,
    /// so later messages to it wait their turn.
    const BUSY_TX: u8 = 1;
    const BUSY_RX: u8 = 2;
    /// `account_phase` charged the peer already.
    const CHARGED: u8 = 4;
}

pub struct Engine {
    pub rank: usize,
    pub nranks: usize,
    pub links: Links,
    /// The communicator's tag on the wire (`transport::comm_tag`): its data
    /// frames and stall notices carry it.
    pub comm_tag: u32,
    /// Every link's counters, shared with the communicator's dumps and
    /// metrics (links made on first use join the list).
    pub counters: Arc<Mutex<Vec<Arc<LinkCounters>>>>,
    pub inbox: Option<Inbox>,
    scratch: Vec<u8>,
    /// `run_lowered`'s temporary output and input copy, kept for the next
    /// call (they only grow, like `scratch`).
    tmp_out: Vec<u8>,
    tmp_in: Vec<u8>,
    /// Per peer, marks a pass sets and clears again before it returns
    /// (one byte a rank of the job; clearing only what the pass set keeps
    /// a pass's cost to its own transfers): [`Marks`].
    marks: Vec<u8>,
    /// Reused by `idle_wait`: the sockets it polls, and the transfers that
    /// wait on the doorbell (peer, is a send).
    pollfds: Vec<libc::pollfd>,
    doorbell_waits: Vec<(usize, bool)>,
    /// The lists one operation's transfers live in, kept across operations
    /// so that the small-message path allocates nothing.
    jobs: Jobs,
    /// How long a rank past its deadline keeps waiting to learn whom its
    /// peers wait on, before it fails (a quarter of the timeout, 0.5–3 s).
    pub diagnosis_grace: Duration,
    /// Set by the communicator when a caller gave up on a queued operation
    /// or aborted the communicator: the wait fails with the reason given.
    pub cancel: Arc<Cancel>,
    /// Spin and yield budgets (see `SPIN`) ...
    spin: Duration,
    yield_for: Duration,
    /// ... the yield budget of rooted collectives (`YIELD_ROOTED_OVERSUBSCRIBED`)
    /// and the one in force for the operation running now ...
    yield_rooted: Duration,
    op_yield: Duration,
    /// ... and the spin budget this rank's recent waits earned, at most
    /// `spin` (see `wait.rs`; fixed when `CADENCE_SPIN_US` is set).
    spin_budget: Duration,
    /// How long one idle sleep lasts (`NAP`), and one on the doorbell while
    /// sockets are pending too (`NAP_MIXED`); longer when ranks crowd the
    /// cores (`NAP_RANKS_PER_CORE`).
    nap: Duration,
    nap_mixed: Duration,
    /// How often a long wait checks that same-host peers live
    /// (`LIVENESS_EVERY`, less often on a crowded machine).
    liveness_every: Duration,
    /// `CADENCE_SPIN_US` / `CADENCE_YIELD_US`, when set: fixed budgets that
    /// replace the policy (for measuring wait policies on a new machine).
    wait_override: (Option<Duration>, Option<Duration>),
    /// Whether this host's ranks are few enough for streaming
    /// (`STREAM_RANKS_PER_CORE`), and whether the running call's messages
    /// stream through shared memory rather than go by single copy
    /// ([`prefers_stream`]).
    may_stream: bool,
    op_stream: bool,
    pub wait_stats: WaitStats,
    /// Whether transfers may be stamped with the time they move (per-message
    /// records; see [`Evidence`]) ...
    pub stamp_messages: bool,
    /// ... and whether they are, in the operation running now.
    stamping: bool,
    /// Whether some link has several paths (it then needs
    /// [`Link::maintain`] now and then), and when that last ran.
    multipath: bool,
    last_maintain: Instant,
    /// When the last operation's last phase retired (the clock read that
    /// timed that phase), for its record's end: None when it had no phase
    /// or failed. Taken by [`Engine::take_finished_at`].
    finished_at: Option<Instant>,
}

impl Engine {
    pub fn new(rank: usize, nranks: usize, links: Links, inbox: Option<Inbox>) -> Engine {
        let multipath = links.multipath();
        let counters = links.iter().map(|(_, l)| l.stats().clone()).collect();
        Engine {
            rank,
            nranks,
            links,
            comm_tag: 0,
            counters: Arc::new(Mutex::new(counters)),
            inbox,
            scratch: Vec::new(),
            tmp_out: Vec::new(),
            tmp_in: Vec::new(),
            marks: vec![0; nranks],
            pollfds: Vec::new(),
            doorbell_waits: Vec::new(),
            jobs: Jobs::default(),
            diagnosis_grace: Duration::from_secs(3),
            cancel: Arc::default(),
            spin: SPIN,
            yield_for: YIELD,
            yield_rooted: YIELD,
            op_yield: YIELD,
            may_stream: true,
            op_stream: false,
            spin_budget: SPIN,
            nap: NAP,
            nap_mixed: NAP_MIXED,
            liveness_every: LIVENESS_EVERY,
            wait_override: (None, None),
            wait_stats: WaitStats::default(),
            stamp_messages: true,
            stamping: false,
            multipath,
            last_maintain: Instant::now(),
            finished_at: None,
        }
    }

    /// When the last operation run finished its last phase (see
    /// `finished_at`), once.
    pub fn take_finished_at(&mut self) -> Option<Instant> {
        self.finished_at.take()
    }

    /// Runs the links' background work (see [`Link::maintain`]) when it
    /// has not run for `MAINTAIN_EVERY`: failing paths are found and
    /// their chunks sent again even while the operation moves on other
    /// links, or on none. Returns whether any byte moved.
    pub fn maintain_links(&mut self) -> Result<bool, ErrorKind> {
        if !self.multipath {
            return Ok(false);
        }
        let now = Instant::now();
        if now.duration_since(self.last_maintain) < MAINTAIN_EVERY {
            return Ok(false);
        }
        self.last_maintain = now;
        self.links.upkeep(Link::maintain)
    }

    /// The link to `peer` for a transfer that is about to move on it: with
    /// several paths, it joins the links upkeep walks.
    fn link_for_work(&mut self, peer: usize) -> Option<&mut Link> {
        if self.multipath {
            self.links.stir(peer)
        } else {
            self.links.get_mut(peer)
        }
    }

    /// Whether some link has several paths (see [`Engine::maintain_links`]).
    pub fn multipath(&self) -> bool {
        self.multipath
    }

    /// The engine's one loop, for schedules (`run`) and point-to-point
    /// batches alike: before each round `turn` admits and retires work and
    /// says how to go on; then every transfer moves as far as it can, and
    /// when none moved the wait backs off (spin, yield, sleep), checking the
    /// deadline, abort notices, dead peers and interrupts.
    pub fn drive<F>(
        &mut self,
        sends: &mut Vec<(usize, SendJob)>,
        recvs: &mut Vec<(usize, RecvJob)>,
        ctx: OpCtx,
        started: Instant,
        mut turn: F,
    ) -> Result<(), ErrorKind>
    where
        F: FnMut(
            &mut Engine,
            &mut Vec<(usize, SendJob)>,
            &mut Vec<(usize, RecvJob)>,
        ) -> Result<Turn, ErrorKind>,
    {
        let mut wait = Wait::since(started);
        let mut rec = Recording::default();
        self.stamping = false;
        let patient = self.spin < SPIN || ctx.unwatched();
        let stamp_after = if patient {
            STAMP_AFTER_IDLE_SHARED
        } else {
            STAMP_AFTER_IDLE
        };
        loop {
            let moving = match turn(self, sends, recvs)? {
                Turn::Finished => return Ok(()),
                Turn::Again => {
                    wait.reset();
                    rec.moved();
                    continue;
                }
                Turn::Move(m) => m,
            };
            let (mut progressed, pending) = self.progress_round(sends, recvs)?;
            progressed |= self.maintain_links()?;
            if progressed {
                if let Some(since) = wait.idle_since {
                    let idle = since.elapsed();
                    let longest = &mut self.wait_stats.longest_idle_us;
                    *longest = (*longest).max(idle.as_micros() as u64);
                    self.adapt_spin(idle, &wait);
                }
                wait.reset();
                rec.moved();
                continue;
            }
            if !pending && !moving.outside {
                continue;
            }
            if let Some(ev) = ctx.evidence {
                if rec.idle() == stamp_after && self.stamp_messages {
                    self.stamping = true;
                    stamp_moved(sends, recvs, Instant::now());
                }
                // Only an operation that waits long publishes snapshots; the
                // clock is not read for one that is about to finish.
                if self.stamping && rec.snapshot_due() {
                    ev.transfers(sends, recvs, Moment::Waiting);
                }
            }
            self.backoff(&mut wait, sends, recvs, &moving, ctx)?;
        }
    }

    /// One pass over the transfers: each peer's first unfinished send and
    /// first unfinished receive move as far as they can without blocking
    /// (messages to one peer go in order). Returns (progressed, pending).
    pub fn progress_round(
        &mut self,
        sends: &mut [(usize, SendJob)],
        recvs: &mut [(usize, RecvJob)],
    ) -> Result<(bool, bool), ErrorKind> {
        let mut progressed = false;
        let mut pending = false;
        self.install_ready_links()?;
        let made = self.progress_marked(sends, recvs, &mut progressed, &mut pending);
        self.unmark(sends, recvs, Marks::BUSY_TX | Marks::BUSY_RX);
        made?;
        Ok((progressed, pending))
    }

    /// [`Engine::progress_round`]'s pass, marking each peer whose first
    /// transfer it met (the caller clears the marks, error or not).
    fn progress_marked(
        &mut self,
        sends: &mut [(usize, SendJob)],
        recvs: &mut [(usize, RecvJob)],
        progressed: &mut bool,
        pending: &mut bool,
    ) -> Result<(), ErrorKind> {
        for (peer, job) in sends.iter_mut() {
            if job.done || self.marked(*peer, Marks::BUSY_TX) {
                continue;
            }
            if job.held {
                // Later messages to this peer wait behind it (FIFO).
                self.mark(*peer, Marks::BUSY_TX);
                *pending = true;
                continue;
            }
            let Some(link) = self.link_for_work(*peer) else {
                // The call's size, not the message's: a ring's first slice
                // is small, its link carries the whole buffer.
                let call = job.meta.count as usize * job.meta.dtype.size();
                self.want_link(*peer, call.max(job.src.len()))?;
                self.mark(*peer, Marks::BUSY_TX);
                *pending = true;
                continue;
            };
            let moved = match link.send_progress(job) {
                Ok(m) => m,
                Err(e) => return Err(self.links.own_error(*peer, e)),
            };
            if moved && self.stamping {
                job.trace.stamp(Instant::now());
            }
            *progressed |= moved;
            if !job.done {
                self.mark(*peer, Marks::BUSY_TX);
                *pending = true;
            }
        }
        for (peer, job) in recvs.iter_mut() {
            if job.done || self.marked(*peer, Marks::BUSY_RX) {
                continue;
            }
            if job.held {
                self.mark(*peer, Marks::BUSY_RX);
                *pending = true;
                continue;
            }
            let Some(link) = self.link_for_work(*peer) else {
                self.await_link(*peer)?;
                self.mark(*peer, Marks::BUSY_RX);
                *pending = true;
                continue;
            };
            let moved = match link.recv_progress(job) {
                Ok(m) => m,
                Err(e) => return Err(self.links.own_error(*peer, e)),
            };
            if moved && self.stamping {
                job.trace.stamp(Instant::now());
            }
            *progressed |= moved;
            if !job.done {
                self.mark(*peer, Marks::BUSY_RX);
                *pending = true;
            }
        }
        Ok(())
    }

    fn marked(&self, peer: usize, bit: u8) -> bool {
        self.marks[peer] & bit != 0
    }

    /// Sets `bit` of `peer`; whether it was set.
    fn mark(&mut self, peer: usize, bit: u8) -> bool {
        let was = self.marked(peer, bit);
        self.marks[peer] |= bit;
        was
    }

    /// Clears `bits` of every peer of `sends` and `recvs`.
    fn unmark(&mut self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)], bits: u8) {
        for p in sends.iter().map(|j| j.0).chain(recvs.iter().map(|j| j.0)) {
            self.marks[p] &= !bits;
        }
    }

    /// Tells every peer this rank failed.
    pub fn broadcast_abort(&mut self, err: &CommError) {
        // Links that came up and wait to be installed carry it too (a peer
        // that made one is about to use it).
        let _ = self.install_ready_links();
        let notice = AbortNotice::from_error(&err.kind, self.rank);
        self.links.send_abort(&notice);
    }

    /// Lends the root's shared links to this engine for one operation
    /// (`pool.rs`).
    pub fn lend(&mut self, pool: Box<Pool>, view: Arc<View>) {
        self.links.lend(pool, view);
        self.multipath = self.links.multipath();
    }

    /// The shared links lent, back.
    pub fn take_lent(&mut self) -> Option<Box<Pool>> {
        let pool = self.links.take_lent();
        self.multipath = self.links.multipath();
        pool
    }

    /// This engine's TCP links and their maker, taken out to be shared
    /// with the communicators split from this one.
    pub fn take_pool(&mut self) -> Pool {
        let pool = self.links.take_pool(self.counters.clone());
        self.multipath = self.links.multipath();
        pool
    }

    /// Every link's counters, shared: readable from any thread while the
    /// engine runs (links made later join the list).
    pub fn link_counters(&self) -> Arc<Mutex<Vec<Arc<LinkCounters>>>> {
        self.counters.clone()
    }
}

fn internal(msg: &str) -> ErrorKind {
    ErrorKind::Internal(format!("schedule/engine invariant: {msg}"))
}
