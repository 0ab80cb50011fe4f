//! The engine runs schedules. One engine per communicator; it owns the links
//! to every peer and executes one operation at a time, phase by phase (see
//! `schedule::ir` for the semantics it implements).
//!
//! Waiting: a transfer that cannot move is retried in a spin loop for a few
//! tens of microseconds (a peer on another core answers in well under that;
//! no spinning at all when ranks outnumber cores), then the engine yields the
//! CPU, then sleeps or blocks in `poll(2)`. Pure spinning would starve the
//! very rank we wait for when ranks outnumber cores.
//! Every wait checks the operation's deadline, the shared-memory abort notice,
//! and (every 100 ms) whether same-host peers are still alive.

use crate::copy::copy_bytes;
use crate::error::{CommError, ErrorKind};
use crate::reduce;
use crate::schedule::lower::{InputPrep, Layout, Lowering};
use crate::schedule::{Algo, Buf, Schedule, Span, Step};
use crate::transport::shm::{Inbox, Progress};
use crate::transport::tcp::poll_fds;
use crate::transport::{
    AbortNotice, Link, OpMeta, RecvJob, SendJob, Sink, SinkMode, Source, StallNotice,
    STALL_CHAIN_MAX,
};
use crate::types::{CollKind, DType, ElemOp};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
/// allreduce.
///
/// Measured on 2 cores (2026-11-27), streamed against single copy from 256
/// KiB, alternated runs, 256 KiB–16 MiB: 2-rank reduce 1.8–3.1× faster in
/// one state of the machine (4 MiB: 214–237 against 546–744 µs), 1.0–2×
/// in a second, 1.1× slower in a third; 4-rank binomial reduce 1.05–1.9×
/// faster. 2-rank broadcast 1.1–1.8× faster in the first state, level to
/// 1.5× either way in the second: not streamed by default.
///
/// A streamed message moves only while its sender and receiver both run,
/// which ranks crowding the cores make rare: 8 ranks on 2 cores, a 4–16 MiB
/// reduce took 1.3–1.7× longer streamed (binomial tree 9.4–11.2 against
/// 6.2–7.1 ms at 4 MiB), where 4 ranks on 2 cores were mostly faster
/// streamed. Beyond `STREAM_RANKS_PER_CORE` every message goes by single copy.
pub fn prefers_stream(coll: CollKind, algo: Algo) -> bool {
    match coll {
        CollKind::Reduce => true,
        CollKind::Broadcast => algo != Algo::ScatterAllgather,
        _ => false,
    }
}

/// Ranks per core up to which messages may stream ([`prefers_stream`]).
const STREAM_RANKS_PER_CORE: usize = 2;

/// How long to spin before yielding, and how long to yield before sleeping,
/// when every rank of this host has a core of its own ...
const SPIN: Duration = Duration::from_micros(50);
const YIELD: Duration = Duration::from_millis(2);
/// ... and when ranks outnumber cores: spinning then only delays the rank we
/// wait for, so hand the core over at once, and soon sleep: a sleeping rank
/// leaves its core's run queue, so the scheduler can move the rank we wait
/// for onto it (yielding alone does not; measured on 4 ranks / 2 cores,
/// sleeping at once or after 20 µs–1 ms of yielding: 24–34 µs vs 11–16 µs).
/// Not even a short spin: every wait's 2 µs of spinning was core time the
/// awaited rank could not have, a recursive doubling allreduce's log2(n)
/// waits a call on every rank. 8 B allreduce (barrier, then 16 calls), 3
/// runs each: 4 ranks on 2 cores 12.9 → 10.2 µs, 8 ranks 42 → 26–31 µs
/// (Open MPI 10–11 and 28–37); broadcast 4.4 → 3.7 and 11.6 → 6.6–9.2.
const SPIN_OVERSUBSCRIBED: Duration = Duration::ZERO;
const YIELD_OVERSUBSCRIBED: Duration = Duration::from_micros(50);
/// ... except in small rooted collectives (broadcast, reduce, gather,
/// scatter of less than `ROOTED_SMALL` bytes), which keep yielding for as
/// long as when ranks have cores. There the root
/// does n-1 ranks' work a call and every other rank waits on it; a rank that
/// sleeps makes the root, the bottleneck, pay a futex wake for it every call,
/// and sleeping ranks came back late (the nap and the scheduler's wake-up).
/// 4 ranks on 2 cores, 8 B–4 KiB (`cadence bench --rounds 2`, twice, with
/// `CADENCE_YIELD_US`): broadcast 6–31 µs with 50 µs of yielding against
/// 5–7 with 2 ms, reduce 16–28 against 6–8; 2 ms and no sleeping at all
/// were level. Allreduce and allgather, where every rank wakes one or two
/// peers a round and a sleeping rank leaves its core to one with work,
/// were level or better with 50 µs (8 ranks: allreduce 42–56 µs against
/// 68–85), so they keep it; so do large rooted calls, whose waits are for
/// data in flight (8 ranks, 256 KiB broadcast: 440 µs with 50 µs of
/// yielding, 595 with 2 ms).
const YIELD_ROOTED_OVERSUBSCRIBED: Duration = YIELD;
const ROOTED_SMALL: u64 = 32 << 10;
/// The spin budget adapts to what the yields of past waits showed. Two ranks
/// that the scheduler put on one core (ranks equal cores, and one more task
/// somewhere: a launcher, a watchdog thread, another job) cannot spin at
/// each other: each wait burns the whole spin budget before its yield lets
/// the awaited rank run, 50 µs a wait (the issue-11 stalls at 16 ranks on
/// 16 cores fit that price per wait). Measured on 2 cores with 2 ranks and
/// a busy process beside them: 4 KiB allreduce 58–62 µs a call against
/// 5–6 µs with no spinning. So a wait that ended after a yield *handed the core over*
/// for a short while (a peer ran on our core and answered) drops the budget
/// to nothing; a wait that ends within the full budget without handing the
/// core over doubles it back (from 1 µs), as a peer on a core of its own
/// answers within it. A yield that takes at least this long (or three times
/// what a yield alone took at start-up, where that is longer: in some VMs the
/// system call alone costs microseconds) handed the core to another task
/// (alone on its core, `sched_yield` returns in 0.1–0.7 µs; handing the core
/// over and getting it back is two context switches) ...
const YIELD_HANDED_MIN: Duration = Duration::from_micros(2);
/// ... and one that takes this long lost the core for a scheduler slice to a
/// task that is not a peer (a peer on our core hands it back as soon as it
/// waits itself): spinning less would only lose the core more often.
const YIELD_LOST_MIN: Duration = Duration::from_micros(500);
/// Where a shrunk spin budget grows back from.
const SPIN_REGROW: Duration = Duration::from_micros(1);
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// How often links with several paths get their background work done.
const MAINTAIN_EVERY: Duration = Duration::from_millis(1);

/// How this engine's waits went, for `dump_records()` ("waits"): a missed
/// wake-up shows as a `late_wakeup`, a stall as a long `longest_idle_us`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct WaitStats {
    /// Sleeps on the shared-memory doorbell.
    pub naps: u64,
    /// Naps that ended by their timeout, not by a doorbell.
    pub nap_timeouts: u64,
    /// Naps that ended by their timeout although what they waited on was
    /// ready: a publish whose doorbell never rang (a missed wake-up), or a
    /// publisher descheduled between its publish and its doorbell.
    pub late_wakeups: u64,
    /// The longest stretch in which nothing moved (µs), over all operations.
    pub longest_idle_us: u64,
    /// Waits that ended after a yield handed this rank's core to another
    /// task for a moment: a peer that shares the core (see
    /// `YIELD_HANDED_MIN`). Each cut the spin budget to nothing.
    pub shared_core_waits: u64,
}

/// How long a wait has lasted, for the backoff policy and the timeout text.
pub struct Wait {
    t0: Instant,
    idle_since: Option<Instant>,
    last_liveness: Instant,
    /// When the deadline passed; the grace period for diagnosis runs from here.
    stalled_at: Option<Instant>,
    /// The wait-for chain this rank last published.
    published: Vec<u32>,
    last_interrupt_check: Instant,
    /// In this idle stretch, a yield handed the core to another task for a
    /// moment, or lost it for a slice (see `YIELD_HANDED_MIN`).
    handed: bool,
    lost: bool,
}

impl Wait {
    /// A wait that began at `now` (a time the caller has just read: small
    /// calls read the clock as few times as they can).
    pub fn since(now: Instant) -> Wait {
        Wait {
            t0: now,
            idle_since: None,
            last_liveness: now,
            stalled_at: None,
            published: Vec::new(),
            last_interrupt_check: now,
            handed: false,
            lost: false,
        }
    }
    /// Something moved: the next idle stretch starts spinning again.
    pub fn reset(&mut self) {
        self.idle_since = None;
        self.handed = false;
        self.lost = false;
    }
}

/// What the communicator tells the engine about the caller of one
/// operation: passed to [`Engine::run`] / [`Engine::drive`], never stored.
#[derive(Clone, Copy, Default)]
pub struct OpCtx<'a> {
    /// Asked every [`INTERRUPT_EVERY`] during long waits, for a caller that
    /// can be interrupted (see `Comm::run_interruptible`).
    pub interrupt: Option<&'a InterruptCheck>,
    /// When the operation runs on the progress thread: how many threads
    /// block waiting for that thread. While none does, the caller is busy
    /// (computing the next gradients, say) and a spinning wait would steal
    /// its core, so the wait takes the patient policy and soon sleeps; the
    /// doorbell or poll(2) still wakes it the moment data arrives.
    pub watchers: Option<&'a AtomicUsize>,
    /// Where the operation's messages are recorded (see [`Evidence`]).
    pub evidence: Option<&'a dyn Evidence>,
    /// When the operation started, as its record says: its first phase's
    /// clock starts there (a clock read less per call; None: read it).
    pub started: Option<Instant>,
}

/// Receives the evidence of an operation's messages for the records: each
/// transfer with its cursor and [`JobTrace`](crate::transport::JobTrace).
/// Called once when the operation ends, and while it waits long, every
/// [`SNAPSHOT_EVERY`] or so (a snapshot, so that a dump taken meanwhile
/// shows what is pending).
///
/// Cost: transfers are stamped with the time they move (one clock read per
/// progress call that moved something, ~40 ns here) only once the
/// operation has waited [`STAMP_AFTER_IDLE`] idle rounds (a few µs); what
/// moved before then is stamped with the time stamping began (an upper
/// bound, a few µs late). An operation that finishes sooner reads no clock
/// for its messages, and its transfers carry no stamps (its record's start
/// and end bound them), so the communicator keeps only its record: a small
/// collective pays no clock read and no lock for its messages.
pub trait Evidence {
    fn transfers(&self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)], at: Moment);
}

/// When [`Evidence::transfers`] is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// The operation waits (a snapshot).
    Waiting,
    /// It finished, or failed.
    Finished,
    Failed,
}

/// How long a wait lasts before the engine publishes a snapshot of the
/// operation's messages, and how often it does while the wait goes on.
pub const SNAPSHOT_AFTER: Duration = Duration::from_millis(50);
pub const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);
/// Idle rounds between looks at the clock for snapshots (a round of the
/// spin stage costs well under a microsecond; one of the sleep stage up
/// to a few milliseconds).
const SNAPSHOT_CHECK_ROUNDS: u32 = 16;
/// Idle rounds an operation waits before its transfers are stamped with
/// times (see [`Evidence`]): a few µs of spinning when ranks have cores of
/// their own; fewer when they share cores (or nobody waits for the
/// progress thread), where rounds soon take a yield or a nap each.
pub const STAMP_AFTER_IDLE: u32 = 64;
pub const STAMP_AFTER_IDLE_SHARED: u32 = 8;

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

/// Asked while an operation waits: should it give up?
pub type InterruptCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a long wait asks its [`InterruptCheck`]: calling it costs a
/// GIL acquisition from Python, too much for every round of a short wait.
pub const INTERRUPT_EVERY: Duration = Duration::from_millis(100);

/// A request, from another thread, that the running operation give up at
/// its next wait (and every later one fail at once): Ctrl-C while a queued
/// operation waits, or `Comm::abort`. The first reason given wins.
#[derive(Default)]
pub struct Cancel {
    set: AtomicBool,
    why: Mutex<Option<ErrorKind>>,
}

impl Cancel {
    pub fn set(&self, why: ErrorKind) {
        let mut w = self.why.lock().unwrap();
        if w.is_none() {
            *w = Some(why);
        }
        self.set.store(true, Ordering::Release);
    }

    /// Why the operation must give up, if it must (one atomic load when not).
    pub fn reason(&self) -> Option<ErrorKind> {
        if !self.set.load(Ordering::Acquire) {
            return None;
        }
        self.why.lock().unwrap().clone()
    }
}

/// The memory an operation works on. Pointers come from the user's buffers
/// (kept alive by the caller until the operation completes).
#[derive(Clone, Copy)]
pub struct Buffers {
    pub input: *const u8,
    pub input_bytes: usize,
    pub output: *mut u8,
    pub output_bytes: usize,
}

impl Buffers {
    /// How input and output sit relative to each other, for [`lower`];
    /// `own_block` is the byte offset of this rank's block in an allgather's
    /// output.
    ///
    /// [`lower`]: crate::schedule::lower::lower
    pub fn layout(&self, kind: CollKind, own_block: usize, has_output: bool) -> Layout {
        let (a, b) = (self.input as usize, self.output as usize);
        Layout {
            exact_inplace: std::ptr::eq(self.input, self.output)
                && self.input_bytes == self.output_bytes
                && matches!(kind, CollKind::AllReduce | CollKind::Reduce),
            allgather_inplace: kind == CollKind::AllGather
                && std::ptr::eq(self.input, self.output.wrapping_add(own_block)),
            overlap: self.input_bytes > 0
                && self.output_bytes > 0
                && a < b + self.output_bytes
                && b < a + self.input_bytes,
            has_output,
        }
    }

    /// No buffers (barriers, or before a request gets its buffers).
    pub const NONE: Buffers = Buffers {
        input: std::ptr::null(),
        input_bytes: 0,
        output: std::ptr::null_mut(),
        output_bytes: 0,
    };
}

// SAFETY: the buffers are plain memory; whoever made the request they belong
// to guaranteed (`OpRequest`'s borrows, or `OpRequest::raw_buffers`'
// contract) that they stay valid and untouched by others until the operation
// that uses them completes, which may be on the communicator's progress
// thread.
unsafe impl Send for Buffers {}

pub struct Engine {
    pub rank: usize,
    pub nranks: usize,
    pub links: Vec<Option<Link>>,
    pub inbox: Option<Inbox>,
    scratch: Vec<u8>,
    /// `run_lowered`'s temporary output and input copy, kept for the next
    /// call (they only grow, like `scratch`).
    tmp_out: Vec<u8>,
    tmp_in: Vec<u8>,
    /// Reused per phase: which peers already have an earlier unfinished send
    /// (resp. receive), so later messages to them wait their turn.
    busy_tx: Vec<bool>,
    busy_rx: Vec<bool>,
    /// Reused by `account_phase`: peers already charged for the phase.
    charged: Vec<bool>,
    pollfds: Vec<libc::pollfd>,
    /// Reused by `idle_wait`: the shared-memory transfers it waits on
    /// (peer, is a send).
    shm_waits: Vec<(usize, bool)>,
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
    /// `spin` (see `YIELD_HANDED_MIN`; fixed when `CADENCE_SPIN_US` is set).
    spin_budget: Duration,
    /// How long a yield takes that handed the core over (`YIELD_HANDED_MIN`).
    yield_handed_min: Duration,
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
    /// Whether some TCP link has several paths (it then needs
    /// [`Link::maintain`] now and then), and when that last ran.
    multipath: bool,
    last_maintain: Instant,
    /// When the last operation's last phase retired (the clock read that
    /// timed that phase), for its record's end: None when it had no phase
    /// or failed. Taken by [`Engine::take_finished_at`].
    finished_at: Option<Instant>,
}

impl Engine {
    pub fn new(
        rank: usize,
        nranks: usize,
        links: Vec<Option<Link>>,
        inbox: Option<Inbox>,
    ) -> Engine {
        let multipath = links
            .iter()
            .flatten()
            .any(|l| matches!(l, Link::Tcp(t) if t.multipath()));
        Engine {
            rank,
            nranks,
            links,
            inbox,
            scratch: Vec::new(),
            tmp_out: Vec::new(),
            tmp_in: Vec::new(),
            busy_tx: vec![false; nranks],
            busy_rx: vec![false; nranks],
            charged: vec![false; nranks],
            pollfds: Vec::new(),
            shm_waits: Vec::new(),
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
            yield_handed_min: YIELD_HANDED_MIN,
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
    /// has not run for [`MAINTAIN_EVERY`]: failing paths are found and
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
        let mut moved = false;
        for l in self.links.iter_mut().flatten() {
            moved |= l.maintain()?;
        }
        Ok(moved)
    }

    /// Whether some TCP link has several paths (see [`Engine::maintain_links`]).
    pub fn multipath(&self) -> bool {
        self.multipath
    }

    /// Fixed spin and yield budgets instead of the policy of
    /// [`Engine::set_local_ranks`] (each `None`: the policy's).
    pub fn override_wait(&mut self, spin: Option<Duration>, yield_for: Option<Duration>) {
        self.wait_override = (spin, yield_for);
        self.spin = spin.unwrap_or(self.spin);
        self.yield_for = yield_for.unwrap_or(self.yield_for);
        self.yield_rooted = yield_for.unwrap_or(self.yield_rooted);
        self.spin_budget = self.spin;
    }

    /// Tells the engine how many ranks share this machine's cores (emulated
    /// hosts included), to pick its waiting policy: spin when each has a
    /// core, hand the core over when they do not; and whether streaming can
    /// count on a sender and its receiver running at once ([`prefers_stream`]).
    pub fn set_local_ranks(&mut self, local: usize) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.may_stream = local <= STREAM_RANKS_PER_CORE * cores;
        let (spin, yield_for, yield_rooted) = if local > cores {
            (
                SPIN_OVERSUBSCRIBED,
                YIELD_OVERSUBSCRIBED,
                YIELD_ROOTED_OVERSUBSCRIBED,
            )
        } else {
            (SPIN, YIELD, YIELD)
        };
        self.spin = self.wait_override.0.unwrap_or(spin);
        self.yield_for = self.wait_override.1.unwrap_or(yield_for);
        self.yield_rooted = self.wait_override.1.unwrap_or(yield_rooted);
        self.spin_budget = self.spin;
        self.yield_handed_min = YIELD_HANDED_MIN.max(yield_alone() * 3);
    }

    /// How long a wait of a `coll` call of `bytes` yields before it sleeps
    /// (see `YIELD_ROOTED_OVERSUBSCRIBED`).
    fn yield_budget(&self, coll: CollKind, bytes: u64) -> Duration {
        let rooted = matches!(
            coll,
            CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
        );
        if rooted && bytes < ROOTED_SMALL {
            self.yield_rooted
        } else {
            self.yield_for
        }
    }

    /// The spin budget after an idle stretch of `idle` ended (see
    /// `YIELD_HANDED_MIN`). Costs nothing on the fast path: called only
    /// when a round found nothing to move before this one.
    fn adapt_spin(&mut self, idle: Duration, wait: &Wait) {
        if self.wait_override.0.is_some() || wait.lost {
            return;
        }
        if wait.handed {
            self.spin_budget = Duration::ZERO;
            self.wait_stats.shared_core_waits += 1;
        } else if idle <= self.spin {
            self.spin_budget = (self.spin_budget * 2).max(SPIN_REGROW).min(self.spin);
        }
    }

    /// Executes one rank's schedule. `deadline` bounds every wait.
    pub fn run(
        &mut self,
        sched: &Schedule,
        meta: &OpMeta,
        elem_op: ElemOp,
        bufs: Buffers,
        deadline: Instant,
        ctx: OpCtx,
    ) -> Result<(), ErrorKind> {
        let dtype = meta.dtype;
        let esize = dtype.size();
        self.op_yield = self.yield_budget(meta.coll, meta.count * esize as u64);
        self.op_stream = self.may_stream && prefers_stream(meta.coll, sched.algo);
        let need = sched.scratch_len * esize;
        if self.scratch.len() < need {
            self.scratch.resize(need, 0);
        }
        let mem = Memory {
            bufs,
            scratch: self.scratch.as_mut_ptr(),
            scratch_bytes: need,
            esize,
        };
        let mut jobs = std::mem::take(&mut self.jobs);
        jobs.clear();
        let result = self.run_phases(&sched.phases, meta, elem_op, &mem, deadline, ctx, &mut jobs);
        if let Some(ev) = ctx.evidence {
            let at = match result {
                Ok(()) => Moment::Finished,
                Err(_) => Moment::Failed,
            };
            ev.transfers(&jobs.sends, &jobs.recvs, at);
        }
        jobs.clear();
        self.jobs = jobs;
        result
    }

    /// Runs an operation as lowered (`schedule::lower`): prepares the input
    /// (scaled, or copied away from an overlapping output), gives the
    /// schedule a temporary output if the caller passed none, runs it, and
    /// divides the output for an average.
    #[allow(clippy::too_many_arguments)]
    pub fn run_lowered(
        &mut self,
        sched: &Schedule,
        low: &Lowering,
        meta: &OpMeta,
        elem_op: ElemOp,
        mut bufs: Buffers,
        deadline: Instant,
        ctx: OpCtx,
    ) -> Result<(), ErrorKind> {
        let dtype = meta.dtype;
        // The temporaries live in the engine from call to call: a fresh one
        // each call cost the page faults of a fresh mapping (above 32 MiB
        // glibc maps every such allocation anew: a non-root `reduce` of 64
        // MiB took 44 ms on 2 ranks, against 3.2 ms at 16 MiB). Their old
        // contents do not matter: no schedule reads an output it has not
        // written (verified), and the input copy is overwritten whole. They
        // are taken out for the call (`run` borrows the engine) and put
        // back after it; moving a Vec leaves its buffer where it is.
        let mut tmp_out = std::mem::take(&mut self.tmp_out);
        let mut tmp_in = std::mem::take(&mut self.tmp_in);
        if let Some(n) = low.temp_output {
            let need = n * dtype.size();
            if tmp_out.len() < need {
                tmp_out.resize(need, 0);
            }
            bufs.output = tmp_out.as_mut_ptr();
            bufs.output_bytes = need;
        }
        match low.input {
            InputPrep::AsIs => {}
            InputPrep::ScaleInPlace(f) => {
                // SAFETY: the request's contract: the output is valid and
                // exclusively this operation's until it completes (here the
                // input is the same bytes).
                let out = unsafe { slice_mut_or_empty(bufs.output, bufs.output_bytes) };
                reduce::scale(dtype, out, f);
            }
            InputPrep::Copy | InputPrep::ScaleCopy(_) => {
                // SAFETY: the request's contract: the input is valid for
                // reads until the operation completes.
                let inp = unsafe { slice_or_empty(bufs.input, bufs.input_bytes) };
                if tmp_in.len() < inp.len() {
                    tmp_in.resize(inp.len(), 0);
                }
                let copy = &mut tmp_in[..inp.len()];
                match low.input {
                    InputPrep::ScaleCopy(f) => reduce::scale_into(dtype, copy, inp, f),
                    _ => copy_bytes(copy, inp),
                }
                bufs.input = tmp_in.as_ptr();
            }
        }
        let result = self.run(sched, meta, elem_op, bufs, deadline, ctx);
        self.tmp_out = tmp_out;
        self.tmp_in = tmp_in;
        result?;
        if let Some(n) = low.divide_by {
            // SAFETY: as above, for the output.
            let out = unsafe { slice_mut_or_empty(bufs.output, bufs.output_bytes) };
            reduce::divide(dtype, out, n);
        }
        Ok(())
    }

    /// The phases in order, with a one-phase lookahead: while phase p's
    /// transfers are in flight, phase p+1's (when it has no local steps)
    /// are admitted *held*, and each starts as soon as it touches no memory
    /// that an unfinished transfer of an earlier phase writes, or reads
    /// memory it would write. Messages to one peer still go in order. So a
    /// ring sliced into pieces forwards piece k as soon as piece k arrived,
    /// and the link does not idle at every phase boundary for the last
    /// byte's round trip. Phases stay the unit of the schedule's semantics
    /// (the verifier's model); lookahead only starts work earlier that the
    /// phase order already allowed to be in flight.
    #[allow(clippy::too_many_arguments)]
    fn run_phases(
        &mut self,
        phases: &[crate::schedule::Phase],
        meta: &OpMeta,
        elem_op: ElemOp,
        mem: &Memory,
        deadline: Instant,
        ctx: OpCtx,
        jobs: &mut Jobs,
    ) -> Result<(), ErrorKind> {
        let Jobs {
            sends,
            recvs,
            send_ranges,
            recv_ranges,
            first_send,
            first_recv,
            folds,
        } = jobs;
        let dtype = meta.dtype;
        let mut cur = 0; // the oldest phase with unfinished transfers
        let mut next = 0; // the next phase to admit
        let mut phase_t0 = ctx.started.unwrap_or_else(Instant::now);
        self.finished_at = None;
        // Same-host peers that time out waiting for us read where we are.
        let collective = !matches!(meta.coll, CollKind::Send | CollKind::Recv);
        let progress = |running: bool, phase: usize| Progress {
            seq: meta.seq,
            running,
            phase: phase as u32,
        };
        if let (true, Some(inbox)) = (collective, &self.inbox) {
            inbox.publish_progress(progress(true, 0));
        }
        // Held jobs of the lookahead phase (an upper bound: its step count).
        let mut held_left = 0usize;
        let stream = self.op_stream;
        let result = self.drive(sends, recvs, ctx, phase_t0, |eng, sends, recvs| {
            // Admit: the current phase always (its local steps run now, all
            // earlier phases being complete); the one after it only if it
            // has no local steps and the current one no folds (which write
            // until their phase retires, unseen by the hazard check).
            while next < phases.len()
                && (next == cur
                    || (next == cur + 1
                        && !has_local_steps(&phases[next])
                        && !has_folds(&phases[cur])))
            {
                first_send.push(sends.len());
                first_recv.push(recvs.len());
                let held = next > cur;
                if held {
                    held_left = phases[next].steps.len();
                }
                for step in &phases[next].steps {
                    match *step {
                        Step::Copy { src, dst } => mem.copy(src, dst)?,
                        Step::Reduce { src, dst } => mem.reduce(dtype, elem_op, src, dst)?,
                        Step::Send { peer, src } => {
                            let (p, n) = mem.locate(src)?;
                            // SAFETY: `locate` bounds-checked the span; the
                            // schedule rules (verified) keep it unwritten
                            // during its phase, and the hazard check keeps
                            // it held while an earlier phase writes it.
                            let source = unsafe { Source::new(p, n) };
                            let mut job = SendJob::new(*meta, source);
                            job.held = held;
                            job.prefer_stream = stream;
                            sends.push((peer, job));
                            send_ranges.push(JobRange {
                                start: p as usize,
                                len: n,
                                with: None,
                            });
                        }
                        Step::Recv {
                            peer,
                            dst,
                            reduce_with,
                        } => {
                            let (d, n) = mem.locate(dst)?;
                            let (mode, with) = match reduce_with {
                                None => (SinkMode::Copy, None),
                                Some(a) => {
                                    let (ap, an) = mem.locate(a)?;
                                    if an != n {
                                        return Err(internal(
                                            "reduce_with length differs from dst",
                                        ));
                                    }
                                    if std::ptr::eq(ap, d) {
                                        (SinkMode::ReduceInPlace, None)
                                    } else if ranges_overlap(ap, d, n) {
                                        return Err(internal("reduce_with overlaps dst"));
                                    } else {
                                        (SinkMode::ReduceWith(ap), Some(ap as usize))
                                    }
                                }
                            };
                            // SAFETY: spans bounds-checked by `locate`; within
                            // a phase no other step touches a receive's
                            // destination (verified schedule rule), earlier
                            // phases' transfers are kept off it by the hazard
                            // check, and `ReduceWith` operands are disjoint.
                            let sink = unsafe { Sink::new(d, n, mode, dtype, elem_op) };
                            let mut job = RecvJob::new(*meta, sink);
                            job.held = held;
                            recvs.push((peer, job));
                            recv_ranges.push(JobRange {
                                start: d as usize,
                                len: n,
                                with,
                            });
                        }
                        Step::Fold { .. } => {}
                    }
                }
                // A phase with folds is never held (they are local steps),
                // so they are the current phase's: its receives are in
                // place now to be found.
                for step in &phases[next].steps {
                    if let Step::Fold { src, dst } = *step {
                        let first = *first_recv.last().expect("pushed above");
                        folds.push(FoldJob::new(
                            mem,
                            src,
                            dst,
                            first,
                            recvs,
                            recv_ranges,
                            folds,
                        )?);
                    }
                }
                next += 1;
            }
            // Folds reduce what has landed since the last turn.
            let folded = advance_folds(folds, recvs, dtype, elem_op);
            // Retire finished phases; the lookahead phase, if any, becomes
            // the current one and nothing holds its jobs back any more.
            let mut retired = false;
            while cur < next
                && phase_done(cur, sends, recvs, first_send, first_recv)
                && folds.iter().all(|f| f.done == f.len)
            {
                folds.clear();
                let now = Instant::now();
                eng.account_phase(sends, recvs, first_send, first_recv, cur, now - phase_t0);
                phase_t0 = now;
                cur += 1;
                retired = true;
                held_left = 0;
                if let (true, Some(inbox)) = (collective, &eng.inbox) {
                    inbox.publish_progress(progress(true, cur));
                }
                if cur < next {
                    let (ss, rs) = job_spans(cur, sends, recvs, first_send, first_recv);
                    sends[ss].iter_mut().for_each(|(_, j)| j.held = false);
                    recvs[rs].iter_mut().for_each(|(_, j)| j.held = false);
                }
            }
            if cur == phases.len() {
                if retired {
                    eng.finished_at = Some(phase_t0);
                }
                return Ok(Turn::Finished);
            }
            if retired || folded {
                // Admit what may follow before moving anything; after a
                // fold, count it as progress (the wait starts over).
                return Ok(Turn::Again);
            }
            if next == cur + 2 && held_left > 0 {
                held_left -= release_held(
                    sends,
                    recvs,
                    send_ranges,
                    recv_ranges,
                    first_send,
                    first_recv,
                    cur,
                );
            }
            Ok(Turn::Move(Moving {
                deadline,
                sig: meta.sig,
                seq: meta.seq,
                outside: false,
            }))
        });
        if let (true, Some(inbox)) = (collective, &self.inbox) {
            inbox.publish_progress(progress(false, cur));
        }
        result.map_err(|e| match e {
            ErrorKind::Timeout { peer, secs, what } => {
                // What a same-host peer says of itself tells a rank busy
                // outside the library (it has not started this operation)
                // from one stuck in it.
                let peer_state = match self.links.get(peer) {
                    Some(Some(Link::Shm(l))) if collective => {
                        format!("; {}", l.peer_progress().describe(peer, meta.seq))
                    }
                    _ => String::new(),
                };
                ErrorKind::Timeout {
                    peer,
                    secs,
                    what: format!("{what}, in phase {cur}{peer_state}"),
                }
            }
            e => e,
        })
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
        let patient =
            self.spin < SPIN || ctx.watchers.is_some_and(|w| w.load(Ordering::Relaxed) == 0);
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

    /// Adds phase `p`'s duration to the busy time of the links it used,
    /// once per link (a phase that sends to and receives from one peer, or
    /// sends it several pieces, is one stretch of busy time for that link).
    #[allow(clippy::too_many_arguments)]
    fn account_phase(
        &mut self,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        first_send: &[usize],
        first_recv: &[usize],
        p: usize,
        took: Duration,
    ) {
        let busy = took.as_nanos() as u64;
        let (ss, rs) = job_spans(p, sends, recvs, first_send, first_recv);
        let peers = sends[ss]
            .iter()
            .map(|(q, _)| *q)
            .chain(recvs[rs].iter().map(|(q, _)| *q));
        for peer in peers.clone() {
            if self.charged[peer] {
                continue;
            }
            self.charged[peer] = true;
            if let Some(l) = self.links[peer].as_ref() {
                l.stats().busy_ns.add(busy);
            }
        }
        for peer in peers {
            self.charged[peer] = false;
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
        self.busy_tx.iter_mut().for_each(|b| *b = false);
        self.busy_rx.iter_mut().for_each(|b| *b = false);
        for (peer, job) in sends.iter_mut() {
            if job.done || self.busy_tx[*peer] {
                continue;
            }
            if job.held {
                // Later messages to this peer wait behind it (FIFO).
                self.busy_tx[*peer] = true;
                pending = true;
                continue;
            }
            let link = self.links[*peer].as_mut().ok_or_else(|| no_link(*peer))?;
            let moved = link.send_progress(job)?;
            if moved && self.stamping {
                job.trace.stamp(Instant::now());
            }
            progressed |= moved;
            if !job.done {
                self.busy_tx[*peer] = true;
                pending = true;
            }
        }
        for (peer, job) in recvs.iter_mut() {
            if job.done || self.busy_rx[*peer] {
                continue;
            }
            if job.held {
                self.busy_rx[*peer] = true;
                pending = true;
                continue;
            }
            let link = self.links[*peer].as_mut().ok_or_else(|| no_link(*peer))?;
            let moved = link.recv_progress(job)?;
            if moved && self.stamping {
                job.trace.stamp(Instant::now());
            }
            progressed |= moved;
            if !job.done {
                self.busy_rx[*peer] = true;
                pending = true;
            }
        }
        Ok((progressed, pending))
    }

    /// Called when a round moved nothing: checks what can end the wait (an
    /// abort notice, the deadline, a dead peer), then spins, yields or sleeps
    /// depending on how long the wait has lasted.
    fn backoff(
        &mut self,
        wait: &mut Wait,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        moving: &Moving,
        ctx: OpCtx,
    ) -> Result<(), ErrorKind> {
        let (deadline, my_sig, my_seq) = (moving.deadline, moving.sig, moving.seq);
        let now = Instant::now();
        let since = *wait.idle_since.get_or_insert(now);
        if let Some(inbox) = &self.inbox {
            if inbox.aborted() {
                if let Some(notice) = inbox.abort_notice() {
                    return Err(notice.into_error(my_sig));
                }
            }
        }
        if now > deadline {
            // Past the deadline: say whom we wait on, learn whom they wait on,
            // and after a short grace blame the end of the chain.
            let stalled_at = *wait.stalled_at.get_or_insert(now);
            let chain = self.wait_chain(sends, recvs, my_seq);
            if chain != wait.published {
                let notice = StallNotice {
                    seq: my_seq,
                    chain: chain.clone(),
                };
                for l in self.links.iter_mut().flatten() {
                    l.post_stall(&notice);
                }
                wait.published = chain.clone();
            } else {
                for l in self.links.iter_mut().flatten() {
                    l.flush_control();
                }
            }
            if now.duration_since(stalled_at) > self.diagnosis_grace {
                return Err(self.timeout_error(sends, recvs, wait.t0, &chain));
            }
        }
        if now.duration_since(wait.last_liveness) > LIVENESS_EVERY {
            wait.last_liveness = now;
            let waiting_on = recvs
                .iter()
                .filter(|(_, j)| j.active())
                .map(|(p, _)| *p)
                .chain(sends.iter().filter(|(_, j)| j.active()).map(|(p, _)| *p));
            for peer in waiting_on {
                if let Some(l) = self.links[peer].as_mut() {
                    l.check_alive()?;
                }
            }
        }
        let waited = now.duration_since(since);
        let unwatched = ctx.watchers.is_some_and(|w| w.load(Ordering::Relaxed) == 0);
        let (spin, yield_for) = if unwatched {
            (SPIN_OVERSUBSCRIBED, YIELD_OVERSUBSCRIBED)
        } else {
            (self.spin_budget, self.op_yield)
        };
        if waited < spin {
            std::hint::spin_loop();
        } else if waited < yield_for {
            let t = Instant::now();
            std::thread::yield_now();
            let took = t.elapsed();
            wait.handed |= took >= self.yield_handed_min;
            wait.lost |= took >= YIELD_LOST_MIN;
        } else {
            if let Some(why) = self.cancel.reason() {
                return Err(why);
            }
            if let Some(check) = ctx.interrupt {
                if now.duration_since(wait.last_interrupt_check) >= INTERRUPT_EVERY {
                    wait.last_interrupt_check = now;
                    if check() {
                        return Err(ErrorKind::Interrupted);
                    }
                }
            }
            self.idle_wait(sends, recvs);
        }
        Ok(())
    }

    /// Blocks briefly: in poll(2) when only TCP transfers can move (the
    /// kernel wakes us when data arrives), on the shared-memory doorbell when
    /// only shared-memory ones can, and in short turns of each otherwise.
    ///
    /// Only each peer's first unfinished message can move (messages to a peer
    /// go in order), and not while held: a later or held one waits on this
    /// rank's own progress, not on a peer. Counting one as waitable once made
    /// a rank whose later shared-memory sends had free slots skip every sleep
    /// and spin on poll(2) while its TCP receive was in flight, starving the
    /// ranks it shared cores with (hierarchical allgather, 4 emulated hosts x
    /// 2 on 2 cores: 4 ms instead of 0.3 ms per call).
    fn idle_wait(&mut self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)]) {
        self.pollfds.clear();
        self.shm_waits.clear();
        self.busy_tx.iter_mut().for_each(|b| *b = false);
        self.busy_rx.iter_mut().for_each(|b| *b = false);
        let heads = sends
            .iter()
            .map(|(p, j)| (*p, true, j.done, j.held, j.started))
            .chain(
                recvs
                    .iter()
                    .map(|(p, j)| (*p, false, j.done, j.held, j.started)),
            );
        for (peer, is_send, done, held, started) in heads {
            let first = if is_send {
                &mut self.busy_tx[peer]
            } else {
                &mut self.busy_rx[peer]
            };
            if done || std::mem::replace(first, true) || held {
                continue;
            }
            match &self.links[peer] {
                Some(Link::Tcp(t)) => {
                    let events = if is_send { libc::POLLOUT } else { libc::POLLIN };
                    for fd in t.waiting_fds(is_send, started) {
                        self.pollfds.push(libc::pollfd {
                            fd,
                            events,
                            revents: 0,
                        });
                    }
                }
                _ => self.shm_waits.push((peer, is_send)),
            }
        }
        if self.multipath {
            // Chunks a link writes on its own (sent again after a path
            // failed, or the rest of a completed send) wake us too.
            for (peer, l) in self.links.iter().enumerate() {
                if let (Some(Link::Tcp(t)), false) = (l, self.busy_tx[peer]) {
                    for fd in t.background_fds() {
                        self.pollfds.push(libc::pollfd {
                            fd,
                            events: libc::POLLOUT,
                            revents: 0,
                        });
                    }
                }
            }
        }
        let tcp_pending = !self.pollfds.is_empty();
        if self.shm_waits.is_empty() {
            poll_fds(&mut self.pollfds, Duration::from_millis(5));
            return;
        }
        if tcp_pending {
            poll_fds(&mut self.pollfds, Duration::ZERO);
        }
        let Some(inbox) = &self.inbox else {
            std::thread::sleep(Duration::from_micros(20));
            return;
        };
        let seen = inbox.prepare_sleep();
        // Re-check after raising the flag: a peer that published before it
        // saw the flag down and did not ring.
        let ready = self
            .shm_waits
            .iter()
            .any(|&(p, is_send)| self.links[p].as_ref().is_some_and(|l| l.shm_ready(is_send)));
        if ready || inbox.aborted() {
            inbox.cancel_sleep();
            return;
        }
        let nap = if tcp_pending {
            Duration::from_micros(200)
        } else {
            Duration::from_millis(5)
        };
        self.wait_stats.naps += 1;
        if inbox.sleep(seen, nap) {
            self.wait_stats.nap_timeouts += 1;
            let ready = self
                .shm_waits
                .iter()
                .any(|&(p, is_send)| self.links[p].as_ref().is_some_and(|l| l.shm_ready(is_send)));
            if ready {
                self.wait_stats.late_wakeups += 1;
            }
        }
    }

    /// `[self, the peer we wait on, whom that peer waits on, ...]`, from the
    /// stall notices received so far (cycles cut, bounded length).
    fn wait_chain(
        &self,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        my_seq: u64,
    ) -> Vec<u32> {
        let first = recvs
            .iter()
            .find(|(_, j)| j.active())
            .map(|(p, _)| *p)
            .or_else(|| sends.iter().find(|(_, j)| j.active()).map(|(p, _)| *p));
        let mut chain = vec![self.rank as u32];
        let mut cur = first.map(|p| p as u32);
        // Follow each hop's own notice; a notice carries its sender's whole
        // known chain, so ranks we do not read from are covered too.
        while let Some(r) = cur.take() {
            if chain.contains(&r) || chain.len() >= STALL_CHAIN_MAX {
                break;
            }
            chain.push(r);
            let notice = self
                .links
                .get(r as usize)
                .and_then(|l| l.as_ref())
                .and_then(|l| l.read_stall())
                .filter(|n| n.seq == my_seq && n.chain.first() == Some(&r));
            if let Some(n) = notice {
                for &next in &n.chain[1..] {
                    if chain.contains(&next) || chain.len() >= STALL_CHAIN_MAX {
                        break;
                    }
                    chain.push(next);
                }
                // Continue from the end of what it knew.
                if let Some(&last) = chain.last() {
                    if last != r {
                        chain.pop();
                        cur = Some(last);
                    }
                }
            }
        }
        chain
    }

    fn timeout_error(
        &self,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        t0: Instant,
        chain: &[u32],
    ) -> ErrorKind {
        let secs = t0.elapsed().as_secs_f64();
        if chain.len() > 2 {
            // We wait on a peer that itself waits: blame the end of the chain.
            let hops: Vec<String> = chain
                .windows(2)
                .map(|w| format!("rank {} waits on rank {}", w[0], w[1]))
                .collect();
            return ErrorKind::Timeout {
                peer: *chain.last().expect("non-empty") as usize,
                secs,
                what: hops.join(", "),
            };
        }
        // Blame whom we wait on for data first: a missing sender is the usual
        // culprit; a send that cannot drain means the receiver is not reading.
        if let Some((peer, j)) = recvs.iter().find(|(_, j)| j.active()) {
            return ErrorKind::Timeout {
                peer: *peer,
                secs,
                what: format!("receive of {} bytes, {} bytes arrived", j.sink.len(), j.got),
            };
        }
        if let Some((peer, j)) = sends.iter().find(|(_, j)| j.active()) {
            return ErrorKind::Timeout {
                peer: *peer,
                secs,
                what: format!("send of {} bytes, peer took {}", j.src.len(), j.sent),
            };
        }
        internal("timeout with nothing pending")
    }

    /// Tells every peer this rank failed.
    pub fn broadcast_abort(&mut self, err: &CommError) {
        let notice = AbortNotice::from_error(&err.kind, self.rank);
        for l in self.links.iter_mut().flatten() {
            l.send_abort(&notice);
        }
    }

    pub fn link_stats(&self) -> Vec<crate::transport::LinkStats> {
        self.links
            .iter()
            .flatten()
            .map(|l| l.stats().snapshot())
            .collect()
    }

    /// Every link's counters, shared: readable from any thread while the
    /// engine runs.
    pub fn link_counters(&self) -> Vec<std::sync::Arc<crate::transport::LinkCounters>> {
        self.links
            .iter()
            .flatten()
            .map(|l| l.stats().clone())
            .collect()
    }
}

/// # Safety
/// `p` must be valid for reads of `n` bytes (or `n == 0`).
unsafe fn slice_or_empty<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: per the function's contract.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// # Safety
/// `p` must be valid for reads and writes of `n` bytes (or `n == 0`), with
/// no other live reference to them.
unsafe fn slice_mut_or_empty<'a>(p: *mut u8, n: usize) -> &'a mut [u8] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: per the function's contract.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

fn internal(msg: &str) -> ErrorKind {
    ErrorKind::Internal(format!("schedule/engine invariant: {msg}"))
}

fn no_link(peer: usize) -> ErrorKind {
    internal(&format!("no link to rank {peer}"))
}

fn ranges_overlap(a: *const u8, b: *const u8, n: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    n > 0 && a < b + n && b < a + n
}

/// Resolves spans to memory.
struct Memory {
    bufs: Buffers,
    scratch: *mut u8,
    scratch_bytes: usize,
    esize: usize,
}

impl Memory {
    /// Pointer and byte length of a span, bounds-checked.
    fn locate(&self, span: Span) -> Result<(*mut u8, usize), ErrorKind> {
        let (base, cap) = match span.buf {
            Buf::Input => (self.bufs.input as *mut u8, self.bufs.input_bytes),
            Buf::Output => (self.bufs.output, self.bufs.output_bytes),
            Buf::Scratch => (self.scratch, self.scratch_bytes),
        };
        let off = span.off * self.esize;
        let len = span.len * self.esize;
        if off + len > cap {
            return Err(internal(&format!("{span:?} out of bounds ({cap} bytes)")));
        }
        if len == 0 {
            return Ok((std::ptr::NonNull::dangling().as_ptr(), 0));
        }
        // SAFETY: off + len <= cap, the size of the allocation behind `base`.
        Ok((unsafe { base.add(off) }, len))
    }

    fn copy(&self, src: Span, dst: Span) -> Result<(), ErrorKind> {
        let (s, n) = self.locate(src)?;
        let (d, m) = self.locate(dst)?;
        if n != m {
            return Err(internal("copy lengths differ"));
        }
        if s == d || n == 0 {
            return Ok(());
        }
        if ranges_overlap(s, d, n) {
            // SAFETY: both ranges are in bounds (`locate`); `copy` tolerates
            // overlap (the in-place case maps Input and Output to one buffer).
            unsafe { std::ptr::copy(s, d, n) };
            return Ok(());
        }
        // SAFETY: in bounds (`locate`), disjoint (checked above), and no
        // other reference to these bytes exists during the call.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(s as *const u8, n),
                std::slice::from_raw_parts_mut(d, n),
            )
        };
        copy_bytes(dst, src);
        Ok(())
    }

    fn reduce(&self, dtype: DType, op: ElemOp, src: Span, dst: Span) -> Result<(), ErrorKind> {
        let (s, n) = self.locate(src)?;
        let (d, m) = self.locate(dst)?;
        if n != m {
            return Err(internal("reduce lengths differ"));
        }
        if n == 0 {
            return Ok(());
        }
        if ranges_overlap(s, d, n) {
            return Err(internal("reduce operands overlap"));
        }
        // SAFETY: in bounds (`locate`), disjoint (checked above), and no other
        // reference to these bytes exists during the call.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(s as *const u8, n),
                std::slice::from_raw_parts_mut(d, n),
            )
        };
        reduce::reduce_inplace(dtype, op, dst, src);
        Ok(())
    }
}

/// How long `sched_yield` takes here with nobody else wanting the core: the
/// least of a few (~10 µs in all, once per communicator).
fn yield_alone() -> Duration {
    (0..16)
        .map(|_| {
            let t = Instant::now();
            std::thread::yield_now();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// What [`Engine::drive`] counts for the records: idle rounds (when to
/// start stamping transfers, see [`Evidence`]) and when to publish
/// snapshots of a waiting operation's messages (the clock is read only
/// every few idle rounds).
#[derive(Default)]
struct Recording {
    /// Idle rounds of the whole operation.
    idle_total: u32,
    /// Idle rounds since something last moved.
    idle_rounds: u32,
    idle_since: Option<Instant>,
    last: Option<Instant>,
}

impl Recording {
    /// Something moved: the next idle stretch starts over.
    fn moved(&mut self) {
        self.idle_rounds = 0;
        self.idle_since = None;
    }

    /// Counts an idle round; returns the operation's idle rounds so far.
    fn idle(&mut self) -> u32 {
        self.idle_rounds = self.idle_rounds.saturating_add(1);
        self.idle_total = self.idle_total.saturating_add(1);
        self.idle_total
    }

    /// Whether to publish a snapshot now.
    fn snapshot_due(&mut self) -> bool {
        if self.idle_rounds % SNAPSHOT_CHECK_ROUNDS != 1 {
            return false;
        }
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if now.duration_since(since) < SNAPSHOT_AFTER
            || self
                .last
                .is_some_and(|t| now.duration_since(t) < SNAPSHOT_EVERY)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// Stamping begins: transfers that already moved get `now` as an upper
/// bound of their first and last progress.
fn stamp_moved(sends: &mut [(usize, SendJob)], recvs: &mut [(usize, RecvJob)], now: Instant) {
    let sent = sends
        .iter_mut()
        .filter(|(_, j)| j.done || j.moved() > 0)
        .map(|(_, j)| &mut j.trace);
    let received = recvs
        .iter_mut()
        .filter(|(_, j)| j.done || j.moved() > 0)
        .map(|(_, j)| &mut j.trace);
    for t in sent.chain(received) {
        if t.first.is_none() {
            t.stamp(now);
        }
    }
}

/// Elapsed time helper for records.
pub fn nanos_since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

fn has_local_steps(p: &crate::schedule::Phase) -> bool {
    p.steps.iter().any(|s| !s.is_transfer())
}

/// One operation's transfers: the jobs, the memory each touches, and where
/// each admitted phase's jobs start (see [`Engine::run_phases`]).
#[derive(Default)]
struct Jobs {
    sends: Vec<(usize, SendJob)>,
    recvs: Vec<(usize, RecvJob)>,
    send_ranges: Vec<JobRange>,
    recv_ranges: Vec<JobRange>,
    first_send: Vec<usize>,
    first_recv: Vec<usize>,
    /// The current phase's folds.
    folds: Vec<FoldJob>,
}

impl Jobs {
    fn clear(&mut self) {
        self.sends.clear();
        self.recvs.clear();
        self.send_ranges.clear();
        self.recv_ranges.clear();
        self.first_send.clear();
        self.first_recv.clear();
        self.folds.clear();
    }
}

fn has_folds(p: &crate::schedule::Phase) -> bool {
    p.steps.iter().any(|s| matches!(s, Step::Fold { .. }))
}

/// What a fold's next element waits for besides its own receive: the
/// fold before it into the same destination, or the phase's reducing
/// receive into it.
#[derive(Clone, Copy, Debug)]
enum FoldAfter {
    Nothing,
    Fold(usize),
    Recv(usize),
}

/// A `Step::Fold` of the current phase: `dst ⊕= src` over the bytes
/// `done..` as they land (addresses and byte counts).
#[derive(Clone, Copy, Debug)]
struct FoldJob {
    src: usize,
    dst: usize,
    len: usize,
    done: usize,
    /// The receive landing `src`, an index into the receive list.
    recv: usize,
    after: FoldAfter,
}

impl FoldJob {
    /// Finds the fold's receive (and its chain predecessor) among the
    /// receives of the phase starting at `first`, and the folds before it.
    fn new(
        mem: &Memory,
        src: Span,
        dst: Span,
        first: usize,
        recvs: &[(usize, RecvJob)],
        recv_ranges: &[JobRange],
        folds: &[FoldJob],
    ) -> Result<FoldJob, ErrorKind> {
        let (s, n) = mem.locate(src)?;
        let (d, m) = mem.locate(dst)?;
        if n != m || ranges_overlap(s, d, n) {
            return Err(internal("fold operands differ in length or overlap"));
        }
        let (s, d) = (s as usize, d as usize);
        let recv = (first..recvs.len())
            .find(|&i| {
                let r = &recv_ranges[i];
                r.start == s && r.len == n && recvs[i].1.sink.copies()
            })
            .ok_or_else(|| internal("a fold without its phase's receive"))?;
        let after = if let Some(j) = folds.iter().rposition(|f| f.dst == d) {
            FoldAfter::Fold(j)
        } else if let Some(i) =
            (first..recvs.len()).find(|&i| recv_ranges[i].start == d && !recvs[i].1.sink.copies())
        {
            FoldAfter::Recv(i)
        } else {
            FoldAfter::Nothing
        };
        Ok(FoldJob {
            src: s,
            dst: d,
            len: n,
            done: 0,
            recv,
            after,
        })
    }
}

/// Runs every fold of the phase over the whole elements that have landed
/// and that its chain predecessor has finished. Returns whether any moved.
fn advance_folds(
    folds: &mut [FoldJob],
    recvs: &[(usize, RecvJob)],
    dtype: DType,
    op: ElemOp,
) -> bool {
    let esize = dtype.size();
    let mut moved = false;
    for k in 0..folds.len() {
        let f = folds[k];
        if f.done == f.len {
            continue;
        }
        let mut limit = recvs[f.recv].1.landed();
        match f.after {
            FoldAfter::Nothing => {}
            FoldAfter::Fold(j) => limit = limit.min(folds[j].done),
            FoldAfter::Recv(i) => limit = limit.min(recvs[i].1.landed()),
        }
        limit -= limit % esize;
        if limit <= f.done {
            continue;
        }
        // SAFETY: both spans were bounds-checked by `locate` and do not
        // overlap (`FoldJob::new`). `src[done..limit]` has landed: its
        // receive writes it no more. `dst` is written during the phase only
        // by the folds of its chain and the one reducing receive into it
        // (verified schedule rule), and the chain order keeps this fold
        // behind both over `done..limit`; the engine's one thread runs them.
        let (from, into) = unsafe {
            (
                std::slice::from_raw_parts((f.src + f.done) as *const u8, limit - f.done),
                std::slice::from_raw_parts_mut((f.dst + f.done) as *mut u8, limit - f.done),
            )
        };
        reduce::reduce_inplace(dtype, op, into, from);
        folds[k].done = limit;
        moved = true;
    }
    moved
}

/// The memory one transfer touches, for the lookahead's hazard check: a
/// send's source or a receive's destination, and a reducing receive's other
/// operand (which it reads), as addresses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JobRange {
    start: usize,
    len: usize,
    with: Option<usize>,
}

/// The index ranges of phase `p`'s jobs in the send and receive lists
/// (`first_*[p]` is where they start; the last admitted phase runs to the end).
fn job_spans(
    p: usize,
    sends: &[(usize, SendJob)],
    recvs: &[(usize, RecvJob)],
    first_send: &[usize],
    first_recv: &[usize],
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let end = |firsts: &[usize], len: usize| firsts.get(p + 1).copied().unwrap_or(len);
    (
        first_send[p]..end(first_send, sends.len()),
        first_recv[p]..end(first_recv, recvs.len()),
    )
}

fn phase_done(
    p: usize,
    sends: &[(usize, SendJob)],
    recvs: &[(usize, RecvJob)],
    first_send: &[usize],
    first_recv: &[usize],
) -> bool {
    let (ss, rs) = job_spans(p, sends, recvs, first_send, first_recv);
    sends[ss].iter().all(|(_, j)| j.done) && recvs[rs].iter().all(|(_, j)| j.done)
}

/// Releases the held jobs of phase `cur`+1 that conflict with no unfinished
/// job of phase `cur`, by the rule the verifier checks within a phase
/// (`schedule::hazard`). Returns how many it released.
fn release_held(
    sends: &mut [(usize, SendJob)],
    recvs: &mut [(usize, RecvJob)],
    send_ranges: &[JobRange],
    recv_ranges: &[JobRange],
    first_send: &[usize],
    first_recv: &[usize],
    cur: usize,
) -> usize {
    use crate::schedule::hazard::{may_start_ahead, Access, Region};
    let (cs, cr) = job_spans(cur, sends, recvs, first_send, first_recv);
    let (hs, hr) = job_spans(cur + 1, sends, recvs, first_send, first_recv);
    // Addresses: one memory, in bytes.
    let region = |start: usize, len: usize| Region::new(0, start, len);
    let send_access = |i: usize| {
        let r = &send_ranges[i];
        Access::Send {
            src: region(r.start, r.len),
        }
    };
    let recv_access = |i: usize| {
        let r = &recv_ranges[i];
        Access::Recv {
            dst: region(r.start, r.len),
            with: r.with.map(|w| region(w, r.len)),
        }
    };
    let may_start = |held: Access, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)]| {
        // Two reads never conflict: a held send skips the current sends.
        let cs = if held.writes() {
            cs.clone()
        } else {
            cs.end..cs.end
        };
        let unfinished_sends = cs.filter(|&j| !sends[j].1.done).map(send_access);
        let unfinished_recvs = cr.clone().filter(|&j| !recvs[j].1.done).map(recv_access);
        may_start_ahead(&held, unfinished_sends.chain(unfinished_recvs))
    };
    let mut released = 0;
    for i in hs {
        if sends[i].1.held && may_start(send_access(i), sends, recvs) {
            sends[i].1.held = false;
            released += 1;
        }
    }
    for i in hr {
        if recvs[i].1.held && may_start(recv_access(i), sends, recvs) {
            recvs[i].1.held = false;
            released += 1;
        }
    }
    released
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(engine: &mut Engine, idle_us: u64, handed: bool, lost: bool) -> Duration {
        let mut wait = Wait::since(Instant::now());
        wait.handed = handed;
        wait.lost = lost;
        engine.adapt_spin(Duration::from_micros(idle_us), &wait);
        engine.spin_budget
    }

    #[test]
    fn the_spin_budget_follows_what_the_yields_showed() {
        let mut e = Engine::new(0, 1, vec![None], None);
        e.set_local_ranks(1);
        assert_eq!(e.spin_budget, SPIN);
        // A peer on our core answered after a yield handed it the core.
        assert_eq!(ended(&mut e, 80, true, false), Duration::ZERO);
        assert_eq!(e.wait_stats.shared_core_waits, 1);
        // Waits answered within the full budget, nothing handed: it grows back.
        let grown: Vec<u64> = (0..8)
            .map(|_| ended(&mut e, 3, false, false).as_micros() as u64)
            .collect();
        assert_eq!(grown, [1, 2, 4, 8, 16, 32, 50, 50]);
        // Longer than the full budget, alone on the core: spinning would not
        // have helped, nor hurt; unchanged.
        assert_eq!(ended(&mut e, 400, false, false), SPIN);
        // The core lost to a foreign task for a slice: unchanged, even with a
        // short hand-over in the same wait.
        assert_eq!(ended(&mut e, 4000, true, true), SPIN);
        assert_eq!(e.wait_stats.shared_core_waits, 1);
    }

    #[test]
    fn a_fixed_spin_budget_does_not_adapt() {
        let mut e = Engine::new(0, 1, vec![None], None);
        e.override_wait(Some(Duration::from_micros(50)), None);
        e.set_local_ranks(1);
        assert_eq!(ended(&mut e, 80, true, false), Duration::from_micros(50));
        assert_eq!(e.wait_stats.shared_core_waits, 0);
    }

    #[test]
    fn with_more_ranks_than_cores_nothing_spins() {
        let mut e = Engine::new(0, 1, vec![None], None);
        e.set_local_ranks(100_000);
        assert_eq!(e.spin_budget, Duration::ZERO);
        assert_eq!(ended(&mut e, 0, false, false), Duration::ZERO);
        assert_eq!(ended(&mut e, 3, false, false), Duration::ZERO);
    }

    #[test]
    fn with_more_ranks_than_cores_small_rooted_calls_yield_longer() {
        use CollKind::*;
        let mut e = Engine::new(0, 1, vec![None], None);
        e.set_local_ranks(100_000);
        for coll in [Broadcast, Reduce, Gather, Scatter] {
            assert_eq!(e.yield_budget(coll, 64), YIELD, "{coll}");
            assert_eq!(
                e.yield_budget(coll, 1 << 20),
                YIELD_OVERSUBSCRIBED,
                "{coll}"
            );
        }
        for coll in [
            AllReduce,
            AllGather,
            ReduceScatter,
            AllToAll,
            Barrier,
            Send,
            Recv,
        ] {
            assert_eq!(e.yield_budget(coll, 64), YIELD_OVERSUBSCRIBED, "{coll}");
        }
        // A core per rank: every call yields as long.
        e.set_local_ranks(1);
        assert_eq!(e.yield_budget(AllReduce, 64), YIELD);
        assert_eq!(e.yield_budget(Broadcast, 64), YIELD);
        // CADENCE_YIELD_US fixes it for every call.
        let us = Duration::from_micros(7);
        e.override_wait(None, Some(us));
        e.set_local_ranks(100_000);
        assert_eq!(e.yield_budget(Broadcast, 64), us);
        assert_eq!(e.yield_budget(AllReduce, 64), us);
    }
}
