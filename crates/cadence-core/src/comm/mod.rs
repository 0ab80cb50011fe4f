//! The communicator: bootstrap (links to every peer), operation validation,
//! algorithm choice, execution in issue order (inline on the caller's thread
//! when nothing is queued, otherwise on a progress thread), records, and
//! failure handling (a failed operation fails the communicator and tells every
//! peer which rank is to blame). Setup is in `bootstrap.rs`, point-to-point
//! batching in `p2p.rs`.

mod bootstrap;
mod calibrate;
mod clock;
pub mod order;
mod p2p;
pub mod profile;
pub mod select;

pub use bootstrap::{Bootstrap, PeerInfo};
pub use clock::ClockOffset;
pub use p2p::ANY_SOURCE;
use p2p::{is_any_source, is_p2p, P2pSeqs};

use crate::config::{Config, DebugLevel};
use crate::engine::{Buffers, Cancel, Engine, Evidence, Moment, OpCtx};
use crate::error::{CommError, ErrorKind, Result};
use crate::monitor::{Dir, Messages, MsgRecord, MsgState, OpRecord, Recorder};
use crate::schedule::{self, lower::Lowering, Algo, CollArgs, CostModel, Schedule, Topology};
use crate::transport::{JobTrace, Link, LinkCounters, OpMeta, RecvJob, SendJob};
use crate::types::{CollKind, DType, RedOp};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One operation as the user asked for it, with the memory it works on.
///
/// The lifetime `'a` is that of the borrowed buffers: a request made with
/// [`OpRequest::input`], [`OpRequest::output`] or [`OpRequest::inout`] can
/// only run synchronously ([`Comm::run`]) while those borrows last. An
/// asynchronous operation ([`Comm::submit`]) needs an `OpRequest<'static>`:
/// no buffers, or raw ones given through the `unsafe`
/// [`OpRequest::raw_buffers`] together with an owner that keeps them alive,
/// which the communicator drops only once the operation has finished.
pub struct OpRequest<'a> {
    pub kind: CollKind,
    pub dtype: DType,
    pub op: RedOp,
    pub root: usize,
    pub counts: Vec<usize>,
    /// Algorithm forced by the caller (beats `CADENCE_ALGO`).
    pub algo: Option<Algo>,
    bufs: Buffers,
    /// Whether the caller passed an input / an output buffer at all.
    has_input: bool,
    has_output: bool,
    /// Dropped after the operation finished (see [`OpRequest::raw_buffers`]).
    keep_alive: Option<Box<dyn std::any::Any + Send>>,
    _borrow: std::marker::PhantomData<&'a mut [u8]>,
}

impl OpRequest<'static> {
    /// A request with no buffers yet.
    pub fn new(kind: CollKind, dtype: DType, op: RedOp, root: usize, counts: Vec<usize>) -> Self {
        OpRequest {
            kind,
            dtype,
            op,
            root,
            counts,
            algo: None,
            bufs: Buffers::NONE,
            has_input: false,
            has_output: false,
            keep_alive: None,
            _borrow: std::marker::PhantomData,
        }
    }

    pub fn barrier() -> Self {
        OpRequest::new(CollKind::Barrier, DType::U8, RedOp::Sum, 0, vec![])
    }
}

impl<'a> OpRequest<'a> {
    /// Forces an algorithm (`None`: the communicator chooses).
    pub fn with_algo(mut self, algo: Option<Algo>) -> Self {
        self.algo = algo;
        self
    }

    /// Reads the input from `data` (borrowed while the request lives).
    pub fn input<'b>(mut self, data: &'b [u8]) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.bufs.input = data.as_ptr();
        self.bufs.input_bytes = data.len();
        self.has_input = true;
        self.reborrow()
    }

    /// Writes the result into `data`.
    pub fn output<'b>(mut self, data: &'b mut [u8]) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.bufs.output = data.as_mut_ptr();
        self.bufs.output_bytes = data.len();
        self.has_output = true;
        self.reborrow()
    }

    /// Reads the input from `data` and writes the result over it (in place).
    pub fn inout<'b>(mut self, data: &'b mut [u8]) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.bufs.input = data.as_ptr();
        self.bufs.input_bytes = data.len();
        self.bufs.output = data.as_mut_ptr();
        self.bufs.output_bytes = data.len();
        self.has_input = true;
        self.has_output = true;
        self.reborrow()
    }

    /// Gives the operation raw buffers (`None`: that buffer is not passed;
    /// the communicator allocates an output it needs) and an owner,
    /// `keep_alive`, that the communicator drops only after the operation
    /// finished, on whichever thread ran it.
    ///
    /// # Safety
    /// Until the operation has finished (its [`Comm::run`] returned, or its
    /// [`Completion`] reports done; or, when `keep_alive` is given, until that
    /// owner is dropped), the input must be valid for reads of its length
    /// and not written by anyone, and the output valid for reads and writes
    /// of its length and not accessed by anyone else. The output may be the
    /// input (in place) or overlap it.
    pub unsafe fn raw_buffers(
        self,
        input: Option<(*const u8, usize)>,
        output: Option<(*mut u8, usize)>,
        keep_alive: Option<Box<dyn std::any::Any + Send>>,
    ) -> OpRequest<'static> {
        let (ip, ib) = input.unwrap_or((std::ptr::null(), 0));
        let (op, ob) = output.unwrap_or((std::ptr::null_mut(), 0));
        OpRequest {
            kind: self.kind,
            dtype: self.dtype,
            op: self.op,
            root: self.root,
            counts: self.counts,
            algo: self.algo,
            bufs: Buffers {
                input: ip,
                input_bytes: ib,
                output: op,
                output_bytes: ob,
            },
            has_input: input.is_some(),
            has_output: output.is_some(),
            keep_alive,
            _borrow: std::marker::PhantomData,
        }
    }

    /// The same request with its borrows' lifetime forgotten, to queue a
    /// synchronous operation behind asynchronous ones.
    ///
    /// # Safety
    /// The caller must not return (nor drop the borrowed buffers) before the
    /// operation has finished.
    unsafe fn detach(self) -> OpRequest<'static> {
        self.reborrow_unchecked()
    }

    fn reborrow<'b>(self) -> OpRequest<'b>
    where
        'a: 'b,
    {
        self.reborrow_unchecked()
    }

    fn reborrow_unchecked<'b>(self) -> OpRequest<'b> {
        OpRequest {
            kind: self.kind,
            dtype: self.dtype,
            op: self.op,
            root: self.root,
            counts: self.counts,
            algo: self.algo,
            bufs: self.bufs,
            has_input: self.has_input,
            has_output: self.has_output,
            keep_alive: self.keep_alive,
            _borrow: std::marker::PhantomData,
        }
    }
}

/// Completion of an asynchronous operation.
pub struct Completion {
    state: Mutex<Option<Result<()>>>,
    cv: Condvar,
    /// For a receive from any source: the sender, once matched.
    source: AtomicUsize,
    /// The communicator's count of threads blocked in `wait` (see
    /// `Engine::watchers`).
    watchers: Arc<AtomicUsize>,
}

/// Counts a thread as waiting on the progress thread while it lives.
struct Watching<'a>(&'a AtomicUsize);
impl<'a> Watching<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Watching(n)
    }
}
impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Completion {
    fn new(watchers: Arc<AtomicUsize>) -> Completion {
        Completion {
            state: Mutex::new(None),
            cv: Condvar::new(),
            source: AtomicUsize::new(ANY_SOURCE),
            watchers,
        }
    }
    fn set_source(&self, peer: usize) {
        self.source.store(peer, Ordering::Release);
    }
    /// For a receive from any source: the rank it received from, once known.
    pub fn source(&self) -> Option<usize> {
        Some(self.source.load(Ordering::Acquire)).filter(|&s| s != ANY_SOURCE)
    }
    fn finish(&self, r: Result<()>) {
        *self.state.lock().unwrap() = Some(r);
        self.cv.notify_all();
    }
    pub fn is_done(&self) -> bool {
        self.state.lock().unwrap().is_some()
    }
    /// Waits up to `timeout` (forever if `None`); `None` if still running.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        let mut st = self.state.lock().unwrap();
        let deadline = timeout.map(|t| Instant::now() + t);
        let _watching = st.is_none().then(|| Watching::new(&self.watchers));
        while st.is_none() {
            match deadline {
                None => st = self.cv.wait(st).unwrap(),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    st = self.cv.wait_timeout(st, left).unwrap().0;
                }
            }
        }
        st.clone()
    }
}

struct Task {
    req: OpRequest<'static>,
    done: Arc<Completion>,
    enqueue_ns: u64,
}

struct Inner {
    engine: Engine,
    /// The last collective's sequence number (what the wire and the records
    /// match across ranks; sends and receives do not count).
    coll_seq: u64,
    /// Operations of every kind so far (the records' `id`).
    op_seq: u64,
    p2p: P2pSeqs,
    failed: Option<CommError>,
    /// Built schedules by (arguments, algorithm); looked up by reference so a
    /// repeated call allocates nothing.
    schedules: HashMap<CollArgs, Vec<(Algo, Arc<Schedule>)>>,
    last_schedule: Option<(CollArgs, Algo, Arc<Schedule>)>,
}

impl Inner {
    /// Drops every built schedule (the ring order changed under them).
    fn forget_schedules(&mut self) {
        self.schedules.clear();
        self.last_schedule = None;
    }
}

/// Wall-clock bounds of a slowness window (Unix ns, end excluded).
#[derive(Clone, Copy)]
struct Window {
    from_unix_ns: u64,
    to_unix_ns: u64,
    /// Messages kept: timed receives of at least this many bytes.
    min_recv_bytes: u64,
}

impl Window {
    fn keeps(&self, m: &MsgRecord) -> bool {
        m.dir == Dir::Recv
            && m.state == MsgState::Done
            && m.bytes >= self.min_recv_bytes
            && matches!((m.first_ns, m.last_ns), (Some(a), Some(b)) if b > a)
    }
}

struct Shared {
    id: String,
    /// The job this communicator belongs to (its sub-communicators share
    /// it), for dumps: `cadence doctor` refuses to mix jobs.
    job: String,
    rank: usize,
    nranks: usize,
    /// Every rank's host identity and process id, from bootstrap.
    hosts: Vec<String>,
    pids: Vec<u32>,
    /// This rank's wall clock against rank 0's (`clock.rs`).
    clock: ClockOffset,
    cfg: Config,
    inner: Mutex<Inner>,
    recorder: Mutex<Recorder>,
    /// Every link's counters (shared with the engine's links), readable
    /// while an operation runs.
    links: Vec<Arc<LinkCounters>>,
    /// Submitted asynchronous operations not yet finished.
    pending: AtomicUsize,
    /// Threads blocked until the progress thread finishes something.
    watchers: Arc<AtomicUsize>,
    /// Set when a caller gave up on a queued operation or aborted the
    /// communicator: the engine fails the operation at its next wait, and
    /// the communicator with it.
    cancel: Arc<Cancel>,
    /// Which ranks share a host (from their host names), and how to choose
    /// algorithms on it.
    auto: select::Auto,
    /// Choices made so far, by (call, element size, the caller's algorithm):
    /// the cost model builds every rank's schedule to compare algorithms.
    chosen: Mutex<HashMap<CollArgs, Vec<(ChoiceKey, Choice)>>>,
    /// Algorithm choices already announced (`CADENCE_DEBUG=INFO`).
    choices: select::ChoiceLog,
}

pub struct Comm {
    shared: Arc<Shared>,
    pub hosts: Vec<String>,
    worker: Mutex<Option<(mpsc::Sender<Task>, std::thread::JoinHandle<()>)>>,
}

const SCHEDULE_CACHE_MAX: usize = 4096;

/// Besides the call: its element size and the algorithm the caller asked for.
type ChoiceKey = (usize, Option<Algo>);
type Choice = (Algo, select::Why);

pub use crate::engine::{InterruptCheck, INTERRUPT_EVERY};

fn fnv1a(words: impl IntoIterator<Item = u64>) -> u64 {
    // FNV-1a-style over whole 64-bit words with a final avalanche: stable
    // across builds and hosts (unlike std's hasher), a few lines, and one
    // multiply per word — it runs on every operation.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h ^= h >> 32;
    h.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Comm {
    fn from_parts(
        id: String,
        job: String,
        rank: usize,
        infos: &[PeerInfo],
        mut engine: Engine,
        cfg: Config,
    ) -> Comm {
        let nranks = infos.len();
        let hosts: Vec<String> = infos.iter().map(|p| p.host.clone()).collect();
        let cancel: Arc<Cancel> = Arc::default();
        engine.cancel = cancel.clone();
        engine.stamp_messages = cfg.record_messages > 0;
        let recorder = Recorder::new(cfg.flight_recorder, cfg.record_messages);
        let links = engine.link_counters();
        let auto = {
            let (topo, order, fabric) =
                order::choose(Topology::from_hosts(&hosts), &hosts, &cfg.topo);
            let tuned = cfg.tuning.as_ref().and_then(|t| t.file.for_topology(&topo));
            let model = tuned.as_ref().and_then(|t| t.model);
            select::Auto {
                topo,
                order,
                fabric: fabric.map(Arc::new),
                tuned,
                model,
                measured_at_start: false,
            }
        };
        Comm {
            shared: Arc::new(Shared {
                id,
                job,
                rank,
                nranks,
                hosts: hosts.clone(),
                pids: infos.iter().map(|p| p.pid).collect(),
                clock: ClockOffset::SAME_HOST,
                inner: Mutex::new(Inner {
                    engine,
                    coll_seq: 0,
                    op_seq: 0,
                    p2p: P2pSeqs::new(nranks),
                    failed: None,
                    schedules: HashMap::new(),
                    last_schedule: None,
                }),
                recorder: Mutex::new(recorder),
                links,
                pending: AtomicUsize::new(0),
                watchers: Arc::new(AtomicUsize::new(0)),
                cancel,
                auto,
                chosen: Mutex::new(HashMap::new()),
                choices: select::ChoiceLog::default(),
                cfg,
            }),
            hosts,
            worker: Mutex::new(None),
        }
    }

    /// Start-up calibration (see `calibrate.rs`), collective: on a job across
    /// hosts whose tuning table gives no cost model, rank 0 measures one and
    /// every rank chooses by it. Before the communicator is shared with
    /// any thread.
    fn calibrate(&mut self) -> Result<()> {
        if self.shared.auto.topo.nhosts() < 2 {
            return Ok(());
        }
        let wanted = self.shared.cfg.calibrate && self.shared.auto.model.is_none();
        let Some(model) = calibrate::run(self, wanted)? else {
            return Ok(());
        };
        // Every rank must install the model, or ranks would choose
        // differently: a failure here is an error, never a silent skip.
        let shared = self.exclusive("calibration")?;
        shared.auto.model = Some(model);
        shared.auto.measured_at_start = true;
        Ok(())
    }

    /// Start-up, collective: how far this rank's clock is from rank 0's
    /// (see `clock.rs`). Before the communicator is shared with any thread.
    fn measure_clock(&mut self) -> Result<()> {
        let clock = clock::measure(self)?;
        self.exclusive("measuring clocks")?.clock = clock;
        Ok(())
    }

    /// The shared state, to change during set-up (`during` names the step
    /// for the error): only while no thread holds it.
    fn exclusive(&mut self, during: &str) -> Result<&mut Shared> {
        let refused = self.shared.err(
            ErrorKind::Setup {
                detail: format!("communicator shared before {during}"),
                culprit: None,
            },
            None,
        );
        Arc::get_mut(&mut self.shared).ok_or(refused)
    }

    /// The end of set-up: the totals metrics report count the application's
    /// operations, not set-up's own (clock ping-pongs, calibration; their
    /// records stay in the flight recorder, their bytes in the links'
    /// counters).
    fn reset_totals(&self) {
        self.shared.recorder.lock().unwrap().reset_totals();
    }

    /// `CADENCE_DEBUG=INFO`: rank 0 prints how algorithms are chosen.
    fn announce_selection(&self) {
        let s = &self.shared;
        if s.cfg.debug >= DebugLevel::Info && s.rank == 0 {
            let path = s.cfg.tuning.as_ref().map(|t| t.path.display().to_string());
            for line in select::table_lines(&s.cfg.algo, &s.auto, path.as_deref()) {
                stderr_line!("cadence rank {} INFO: {line}", s.rank);
            }
            let o = &s.auto.order;
            stderr_line!(
                "cadence rank {} INFO: ring order {}: {}",
                s.rank,
                o.hosts.join(" -> "),
                o.why
            );
        }
    }

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
    pub fn rank(&self) -> usize {
        self.shared.rank
    }
    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }
    /// Which ranks share a host.
    pub fn topology(&self) -> &Topology {
        &self.shared.auto.topo
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
            return self.shared.execute(req, None, interrupted).map(|_| None);
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
        let done = Arc::new(Completion::new(self.shared.watchers.clone()));
        let enqueue_ns = self.shared.recorder.lock().unwrap().now_ns();
        let mut w = self.worker.lock().unwrap();
        if w.is_none() {
            let (tx, rx) = mpsc::channel::<Task>();
            let shared = self.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("cadence-progress-{}", self.shared.rank))
                .spawn(move || {
                    let mut next: Option<Task> = None;
                    while let Some(task) = next.take().or_else(|| rx.recv().ok()) {
                        if is_p2p(&task.req) {
                            next = shared.execute_p2p_batch(task, &rx);
                        } else {
                            let r = shared.execute(task.req, Some(task.enqueue_ns), None);
                            shared.pending.fetch_sub(1, Ordering::AcqRel);
                            task.done.finish(r);
                        }
                    }
                })
                .map_err(|e| CommError::setup(format!("cannot start progress thread: {e}")))?;
            *w = Some((tx, handle));
        }
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        let task = Task {
            req,
            done: done.clone(),
            enqueue_ns,
        };
        if w.as_ref().unwrap().0.send(task).is_err() {
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(CommError::new(ErrorKind::Failed {
                detail: "progress thread is gone".into(),
                culprit: None,
            }));
        }
        Ok(done)
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

    /// The newest `last` operations that completed successfully between
    /// `from_unix_ns` (included) and `to_unix_ns` (excluded), as a dump
    /// (what a slowness window sends); `None` when there were none. The
    /// filter runs before anything is serialized: a window costs the
    /// watchdog only the operations it sends.
    ///
    /// Of their messages only the timed receives of at least
    /// `min_recv_bytes` are kept (done, and with time between their first
    /// and last progress): the only ones the slowness classifier reads, and
    /// a fraction of the bytes to send and parse.
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
            .dump_json_filtered("slowness window", Some(last), Some(window))
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
    pub fn dump_to(&self, dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
        self.shared.dump_to(dir, "on demand")
    }

    /// Stops the progress thread (after queued operations finish).
    pub fn close(&self) {
        if let Some((tx, handle)) = self.worker.lock().unwrap().take() {
            drop(tx);
            let _ = handle.join();
        }
    }

    /// Test hook: writes garbage to the TCP link to `peer`.
    pub fn inject_garbage(&self, peer: usize) -> Result<()> {
        let mut inner = self.shared.inner.lock().unwrap();
        match inner.engine.links.get_mut(peer) {
            Some(Some(Link::Tcp(t))) => t
                .inject_garbage()
                .map_err(|e| CommError::invalid(format!("inject: {e}"))),
            _ => Err(CommError::invalid(format!("no TCP link to rank {peer}"))),
        }
    }

    /// Fails the communicator on purpose and tells every peer why: the
    /// operation in flight (if any) gives up at its next wait, later ones
    /// fail at once, and each peer's pending or next operation fails with an
    /// error naming this rank and carrying `reason`. Returns once the peers
    /// have been told (at most the running operation's own deadline).
    pub fn abort(&self, reason: &str) {
        self.shared
            .cancel
            .set(ErrorKind::UserAbort(reason.to_string()));
        let mut inner = self.shared.inner.lock().unwrap();
        if inner.failed.is_none() {
            let e = self
                .shared
                .err(ErrorKind::UserAbort(reason.to_string()), None);
            self.shared.fail_locked(&mut inner, &e);
        }
    }

    /// Whether the communicator failed (and why).
    pub fn failure(&self) -> Option<CommError> {
        self.shared.inner.lock().unwrap().failed.clone()
    }
}

/// How often the path keeper looks at the links (see
/// [`Comm::start_path_keeper`]).
const KEEP_PATHS_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

impl Comm {
    /// With several paths to some peer: a thread that does the links'
    /// background work (path checks, chunks sent again, failback) while no
    /// operation runs, so that a rank computing between collectives, or
    /// done with them, still delivers what a failed path held (its peer may
    /// be waiting for it) and finds a path that came back. It takes the
    /// engine only when it is free (`try_lock`: an operation in progress
    /// does this work itself), and ends with the communicator. A link left
    /// with no path fails the communicator as an operation would.
    pub(crate) fn start_path_keeper(&self) {
        if !self.shared.inner.lock().unwrap().engine.multipath() {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        let _ = std::thread::Builder::new()
            .name(format!("cadence-paths-{}", self.shared.rank))
            .spawn(move || loop {
                std::thread::sleep(KEEP_PATHS_EVERY);
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                if shared.cancel.reason().is_some() {
                    return;
                }
                let Ok(mut inner) = shared.inner.try_lock() else {
                    continue;
                };
                if let Err(e) = inner.engine.maintain_links() {
                    shared.cancel.set(e);
                    return;
                }
            });
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    fn err(&self, kind: ErrorKind, op: Option<(CollKind, u64)>) -> CommError {
        CommError {
            kind,
            rank: Some(self.rank),
            op,
            comm_id: self.id.as_str().into(),
        }
    }

    fn choose_algo(&self, req: &OpRequest, args: &CollArgs) -> Result<Algo> {
        let es = req.dtype.size();
        let select = || {
            select::select_algo_on(&self.cfg.algo, args, &self.auto, es, req.algo)
                .map_err(|m| self.err(ErrorKind::InvalidArgument(m), None))
        };
        // Without a cost model choosing is a few comparisons: no cache. With
        // one, the cache is looked up by reference (no copy of the call's
        // counts); only a new call shape is copied in.
        let key = (es, req.algo);
        let known = self.auto.model.and_then(|_| {
            let chosen = self.chosen.lock().unwrap();
            let shapes = chosen.get(args)?;
            shapes.iter().find(|(k, _)| *k == key).map(|(_, c)| *c)
        });
        let (algo, why) = match known {
            Some(c) => c,
            None if self.auto.model.is_none() => select()?,
            None => {
                let c = select()?;
                let mut chosen = self.chosen.lock().unwrap();
                if chosen.len() >= SCHEDULE_CACHE_MAX {
                    chosen.clear();
                }
                chosen.entry(args.clone()).or_default().push((key, c));
                c
            }
        };
        if self.cfg.debug >= DebugLevel::Info && self.rank == 0 {
            let bytes = select::coll_bytes(args, es);
            if self.choices.first(req.kind, bytes, algo) {
                let line = select::choice_line(req.kind, bytes, self.nranks, algo, &why);
                stderr_line!("cadence rank {} INFO: {line}", self.rank);
            }
        }
        Ok(algo)
    }

    /// Checks arguments that need no communication. Returns the collective's
    /// arguments and the buffer sizes in elements.
    fn validate(&self, req: &OpRequest) -> std::result::Result<CollArgs, String> {
        let n = self.nranks;
        let k = req.kind;
        let any_source = is_any_source(req);
        if any_source && n < 2 {
            return Err("recv from any source: no other rank in this communicator".into());
        }
        let args = CollArgs {
            kind: k,
            // Checked as a receive from some other rank.
            root: if any_source {
                (self.rank + 1) % n
            } else {
                req.root
            },
            counts: req.counts.clone(),
        };
        schedule::check_args(&args, n).map_err(|e| e.to_string())?;
        if matches!(k, CollKind::Send | CollKind::Recv) && req.root == self.rank {
            return Err(format!("{k}: rank {} cannot {k} to itself", self.rank));
        }
        if k.reduces() {
            if let RedOp::PremulSum(f) = req.op {
                if !req.dtype.is_float() {
                    return Err(format!(
                        "premul_sum needs a floating-point dtype, not {}",
                        req.dtype
                    ));
                }
                if !f.is_finite() {
                    return Err(format!("premul_sum factor {f} is not finite"));
                }
            }
        }
        let (ni, no) = args.buffer_lens(self.rank, n);
        let es = req.dtype.size();
        if req.has_input && req.bufs.input_bytes != ni * es {
            return Err(format!(
                "{k}: input has {} elements, expected {ni}",
                req.bufs.input_bytes / es
            ));
        }
        if !req.has_input && ni > 0 {
            return Err(format!(
                "{k}: this rank must pass an input of {ni} elements"
            ));
        }
        if req.has_output && req.bufs.output_bytes != no * es {
            return Err(format!(
                "{k}: output has {} elements, expected {no}",
                req.bufs.output_bytes / es
            ));
        }
        Ok(args)
    }

    /// Runs one operation; `enqueue_ns` is None when it was never queued.
    fn execute(
        &self,
        req: OpRequest,
        enqueue_ns: Option<u64>,
        interrupted: Option<InterruptCheck>,
    ) -> Result<()> {
        let args = self
            .validate(&req)
            .map_err(|m| self.err(ErrorKind::InvalidArgument(m), None))?;
        let algo = self.choose_algo(&req, &args)?;
        let mut inner = self.inner.lock().unwrap();
        if let Some(f) = &inner.failed {
            return Err(self.err(ErrorKind::failed_after(f), None));
        }
        if let Some(why) = self.cancel.reason() {
            // Aborted, or a caller gave up on an earlier operation that
            // completed before it noticed; the peers may wait on this one.
            let e = self.err(why, None);
            self.fail_locked(&mut inner, &e);
            return Err(e);
        }
        // Everything that can refuse the call before it is numbered: a
        // refused call must not shift the numbering the peers expect.
        let (sched, lowering) = self.prepare(&mut inner, &req, &args, algo)?;
        inner.op_seq += 1;
        let id = inner.op_seq;
        let meta = self.number(&mut inner, &req, &args, algo);
        let started = self.record_start(id, Some(&meta), &req, algo, enqueue_ns);
        let evidence = OpEvidence {
            shared: self,
            op: id,
        };
        let ctx = OpCtx {
            interrupt: interrupted.as_ref(),
            // On the progress thread (enqueued), the caller may be busy
            // elsewhere.
            watchers: enqueue_ns.map(|_| &*self.watchers),
            evidence: (self.cfg.record_messages > 0).then_some(&evidence as &dyn Evidence),
            started: Some(started),
        };
        let deadline = started + self.cfg.timeout;
        let result = inner
            .engine
            .run_lowered(
                &sched,
                &lowering,
                &meta,
                req.op.elementwise(),
                req.bufs,
                deadline,
                ctx,
            )
            .map_err(|k| self.err(k, Some((req.kind, meta.seq))));
        if let Err(e) = &result {
            if !matches!(e.kind, ErrorKind::InvalidArgument(_)) {
                self.fail_locked(&mut inner, e);
            }
        }
        let finished = inner.engine.take_finished_at();
        drop(inner);
        self.record_end(id, &result, finished);
        if let Err(e) = &result {
            self.warn_failed(e);
            self.dump_on_error(e);
        }
        result
    }

    /// The wire identity of the call about to run, which numbers it: the
    /// next collective sequence number, or the next message of its
    /// (source, destination) pair for a send or receive.
    fn number(&self, inner: &mut Inner, req: &OpRequest, args: &CollArgs, algo: Algo) -> OpMeta {
        if matches!(req.kind, CollKind::Send | CollKind::Recv) {
            return inner.p2p.meta(self.rank, req);
        }
        inner.coll_seq += 1;
        let redop = if req.kind.reduces() { req.op.code() } else { 0 };
        let words = [
            req.kind.code() as u64,
            req.dtype.code() as u64,
            redop as u64,
            req.root as u64,
            algo as u64,
        ]
        .into_iter()
        .chain(args.counts.iter().map(|&c| c as u64));
        OpMeta {
            coll: req.kind,
            dtype: req.dtype,
            redop,
            root: req.root as u32,
            seq: inner.coll_seq,
            sig: fnv1a(words),
            count: args.counts.iter().sum::<usize>() as u64,
        }
    }

    /// The call's schedule (built once per call shape and algorithm) and
    /// what it needs around it (temporaries, scaling).
    fn prepare(
        &self,
        inner: &mut Inner,
        req: &OpRequest,
        args: &CollArgs,
        algo: Algo,
    ) -> Result<(Arc<Schedule>, Lowering)> {
        let n = self.nranks;
        let es = req.dtype.size();
        let (ni, no) = args.buffer_lens(self.rank, n);
        let own_block = match req.kind {
            CollKind::AllGather => args.counts[..self.rank].iter().sum::<usize>() * es,
            _ => 0,
        };
        let layout = req.bufs.layout(req.kind, own_block, req.has_output);
        let lowering = schedule::lower::lower(req.kind, req.op, req.root, self.rank, n, no, layout);
        debug_assert_eq!(req.bufs.input_bytes, ni * es);

        let cached = match &inner.last_schedule {
            // A training loop repeats the same call: compare before hashing.
            Some((a, al, s)) if *al == algo && a == args => Some(s.clone()),
            _ => inner
                .schedules
                .get(args)
                .and_then(|v| v.iter().find(|(a, _)| *a == algo))
                .map(|(_, s)| s.clone()),
        };
        let sched = match cached {
            Some(s) => s,
            None => {
                let s = Arc::new(
                    schedule::build_on(args, self.rank, &self.auto.topo, algo)
                        .map_err(|e| self.err(ErrorKind::InvalidArgument(e.to_string()), None))?,
                );
                if self.cfg.debug >= DebugLevel::Info {
                    stderr_line!(
                        "cadence rank {} INFO: {} of {} x {} over {n} ranks: algorithm {} ({} phases)",
                        self.rank,
                        req.kind,
                        args.counts.iter().sum::<usize>(),
                        req.dtype,
                        algo.name(),
                        s.phases.len()
                    );
                }
                if inner.schedules.len() >= SCHEDULE_CACHE_MAX {
                    inner.schedules.clear();
                }
                inner
                    .schedules
                    .entry(args.clone())
                    .or_default()
                    .push((algo, s.clone()));
                s
            }
        };
        if !matches!(&inner.last_schedule, Some((a, al, _)) if *al == algo && a == args) {
            inner.last_schedule = Some((args.clone(), algo, sched.clone()));
        }
        Ok((sched, lowering))
    }

    /// Fails the communicator after `e`: later operations fail at once,
    /// and every peer is told why (the one failure path, for collectives and
    /// point-to-point batches alike).
    fn fail_locked(&self, inner: &mut Inner, e: &CommError) {
        inner.failed = Some(e.clone());
        inner.engine.broadcast_abort(e);
    }

    /// Prints a failed operation's error (`CADENCE_DEBUG` WARN and above).
    fn warn_failed(&self, e: &CommError) {
        if self.cfg.debug >= DebugLevel::Warn {
            stderr_line!("{e}");
        }
    }

    /// Opens the record of operation `id`; `meta` is its wire identity
    /// (`None` for a receive from any source not yet matched). Returns when
    /// it started, which the caller's deadline counts from (one clock read
    /// for both: a small call's clock reads are a fifth of its cost).
    fn record_start(
        &self,
        id: u64,
        meta: Option<&OpMeta>,
        req: &OpRequest,
        algo: Algo,
        enqueue_ns: Option<u64>,
    ) -> Instant {
        let es = req.dtype.size();
        let count: usize = req.counts.iter().sum();
        let started = Instant::now();
        let mut rec = self.recorder.lock().unwrap();
        let now = rec.ns_at(started);
        rec.push(OpRecord {
            id,
            seq: meta.map_or(0, |m| m.seq),
            sig: meta.map_or(0, |m| m.sig),
            collective: req.kind.name(),
            kind: req.kind,
            algo: algo.name(),
            dtype: req.dtype.name(),
            redop: if req.kind.reduces() {
                req.op.name()
            } else {
                ""
            },
            root: req.root,
            count: count as u64,
            bytes: (req
                .bufs
                .input_bytes
                .max(req.bufs.output_bytes)
                .max(count * es)) as u64,
            enqueue_ns: enqueue_ns.unwrap_or(now),
            start_ns: now,
            end_ns: 0,
            status: Cow::Borrowed("running"),
            msgs_from: 0,
            nmsgs: 0,
        });
        started
    }

    /// A receive from any source was matched to `peer`: its record gets the
    /// pair's sequence number.
    fn record_matched(&self, id: u64, meta: &OpMeta, peer: usize) {
        let mut rec = self.recorder.lock().unwrap();
        if let Some(r) = rec.get_mut(id) {
            r.seq = meta.seq;
            r.sig = meta.sig;
            r.root = peer;
        }
    }

    /// Closes the record of operation `id` and counts it in the totals.
    /// Ends operation `id`'s record: at `finished` (when its last phase
    /// retired, a clock read the engine made anyway), or now.
    fn record_end(&self, id: u64, result: &Result<()>, finished: Option<Instant>) {
        let status = match result {
            Ok(()) => Cow::Borrowed("ok"),
            Err(e) => Cow::Owned(e.to_string()),
        };
        let mut rec = self.recorder.lock().unwrap();
        let at = match finished {
            Some(t) => rec.ns_at(t),
            None => rec.now_ns(),
        };
        if let Some(r) = rec.end_at(id, at, result.is_ok(), status) {
            if self.cfg.debug >= DebugLevel::Trace {
                // One JSON line per operation, as the flight recorder has it.
                let line = serde_json::to_string(r).unwrap_or_default();
                stderr_line!("cadence rank {} TRACE {line}", self.rank);
            }
        }
    }

    /// The dump: who this rank is, its clock, its records with their
    /// messages (the newest `last` only, when given), and its link counters
    /// (format: docs/diagnosis.md).
    fn dump_json(&self, reason: &str, last: Option<usize>) -> String {
        self.dump_json_filtered(reason, last, None)
            .expect("an unfiltered dump always has a body")
    }

    /// The dump, of the newest `last` operations (of those that completed in
    /// `window`, when given); `None` when a window holds no operation.
    fn dump_json_filtered(
        &self,
        reason: &str,
        last: Option<usize>,
        window: Option<Window>,
    ) -> Option<String> {
        use serde_json::{json, Value};
        // While an operation runs, the engine is busy: its failure and wait
        // statistics are left out rather than waited for. The links'
        // counters can be read at any time.
        let (failure, waits) = match self.inner.try_lock() {
            Ok(i) => (
                json!(i.failed.as_ref().map(|e| e.to_string())),
                json!(i.engine.wait_stats),
            ),
            Err(_) => (Value::Null, Value::Null),
        };
        let links: Vec<_> = self.links.iter().map(|l| l.snapshot()).collect();
        // Copy what the dump needs under the recorder's lock (the operations
        // take it at start and end), and build the JSON after letting go:
        // serializing a full ring takes tens of milliseconds.
        struct Copied {
            rec: OpRecord,
            state: &'static str,
            msgs: Option<Vec<MsgRecord>>,
            at: Option<u64>,
        }
        let (copied, dump_ns, base_unix_ns, total_ops) = {
            let rec = self.recorder.lock().unwrap();
            let base = rec.base_unix_ns;
            let wanted = |r: &&OpRecord| match window {
                None => true,
                Some(w) => {
                    r.status == "ok" && (w.from_unix_ns..w.to_unix_ns).contains(&(base + r.end_ns))
                }
            };
            let n = rec.records().filter(wanted).count();
            if n == 0 && window.is_some() {
                return None;
            }
            let copied: Vec<Copied> = rec
                .records()
                .filter(wanted)
                .skip(n.saturating_sub(last.unwrap_or(usize::MAX)))
                .map(|r| {
                    let (state, msgs, at) = match rec.messages(r) {
                        Messages::Final(it, _) => match window {
                            Some(w) => (
                                "final",
                                Some(it.filter(|m| w.keeps(m)).copied().collect()),
                                None,
                            ),
                            None => ("final", Some(it.copied().collect()), None),
                        },
                        Messages::Live(m, at) => ("live", Some(m.to_vec()), Some(at)),
                        Messages::Dropped => ("dropped", None, None),
                        Messages::None => ("none", None, None),
                    };
                    Copied {
                        rec: r.clone(),
                        state,
                        msgs,
                        at,
                    }
                })
                .collect();
            (copied, rec.now_ns(), rec.base_unix_ns, rec.total_ops)
        };
        let ops: Vec<Value> = copied
            .into_iter()
            .map(|c| {
                let mut v = serde_json::to_value(&c.rec).unwrap_or_default();
                v["comm_id"] = Value::from(self.id.as_str());
                v["messages_state"] = Value::from(c.state);
                v["messages"] = json!(c.msgs);
                if let Some(at) = c.at {
                    v["messages_at_ns"] = Value::from(at);
                }
                v
            })
            .collect();
        let peers: Vec<Value> = (0..self.nranks)
            .map(|r| json!({"rank": r, "host": self.hosts[r], "pid": self.pids[r]}))
            .collect();
        json!({
            "format": "cadence-dump",
            "version": DUMP_VERSION,
            "job": self.job,
            "comm_id": self.id,
            "rank": self.rank,
            "nranks": self.nranks,
            "host": self.hosts[self.rank],
            "hostname": hostname(),
            "pid": std::process::id(),
            "peers": peers,
            "timeout_s": self.cfg.timeout.as_secs_f64(),
            "base_unix_ns": base_unix_ns,
            "dump_ns": dump_ns,
            "clock": self.clock,
            "reason": reason,
            "failure": failure,
            "total_ops": total_ops,
            "record_capacity": self.cfg.flight_recorder,
            "message_capacity": self.cfg.record_messages,
            "ops": ops,
            "links": links,
            "waits": waits,
            "ring_order": self.auto.order,
        })
        .to_string()
        .into()
    }

    /// The totals Prometheus metrics are made of, as JSON (format:
    /// docs/diagnosis.md): per collective kind, operations ok and failed,
    /// bytes and a duration histogram; per link, its counters; the oldest
    /// operation still running. Never waits for a running operation: one
    /// short lock of the recorder (which operations take for a few adds).
    fn metrics_json(&self) -> String {
        use crate::monitor::totals::{bucket_bound_ns, DURATION_BUCKETS};
        use serde_json::json;
        let (now, totals, running) = {
            let rec = self.recorder.lock().unwrap();
            (rec.now_ns(), rec.totals().clone(), rec.oldest_running())
        };
        let collectives: Vec<_> = totals
            .used()
            .map(|(k, t)| {
                json!({
                    "collective": k.name(),
                    "ok": t.ok,
                    "failed": t.failed,
                    "bytes": t.bytes,
                    "duration_ns": t.duration_ns,
                    "buckets": t.buckets,
                })
            })
            .collect();
        let links: Vec<_> = self
            .links
            .iter()
            .map(|l| {
                let mut v = json!(l.snapshot());
                v["peer_host"] = json!(self.hosts.get(l.peer));
                v
            })
            .collect();
        let bounds: Vec<u64> = (0..DURATION_BUCKETS).map(bucket_bound_ns).collect();
        json!({
            "comm_id": self.id,
            "job": self.job,
            "rank": self.rank,
            "nranks": self.nranks,
            "host": self.hosts[self.rank],
            "now_ns": now,
            "bucket_bounds_ns": bounds,
            "collectives": collectives,
            "links": links,
            "running": running.map(|(k, seq, start)| json!({
                "collective": k.name(), "seq": seq, "start_ns": start,
            })),
        })
        .to_string()
    }

    fn dump_to(&self, dir: &std::path::Path, reason: &str) -> std::io::Result<std::path::PathBuf> {
        std::fs::create_dir_all(dir)?;
        let name = format!("cadence-{}-rank{}.json", self.id, self.rank);
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, self.dump_json(reason, None))?;
        std::fs::rename(&tmp, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(path)
    }

    fn dump_on_error(&self, e: &CommError) {
        if let Some(dir) = &self.cfg.dump_dir {
            if let Err(err) = self.dump_to(dir, &format!("failure: {e}")) {
                stderr_line!(
                    "cadence: could not write a dump into {}: {err}",
                    dir.display()
                );
            }
        }
    }
}

/// Version of the dump format (`format: "cadence-dump"`); readers refuse
/// versions they do not know.
pub const DUMP_VERSION: u32 = 1;

/// The machine's host name (the emulated host is `host` in the dump).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// One transfer as a message record (times on the recorder's clock).
fn msg_record(
    base: Instant,
    peer: usize,
    dir: Dir,
    bytes: usize,
    moved: usize,
    state: MsgState,
    trace: &JobTrace,
) -> MsgRecord {
    MsgRecord {
        op: trace.tag,
        peer: peer as u32,
        dir,
        state,
        bytes: bytes as u64,
        moved: moved as u64,
        first_ns: trace.first.map(|t| ns_since(base, t)),
        last_ns: trace.last.map(|t| ns_since(base, t)),
    }
}

fn ns_since(base: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(base).as_nanos() as u64
}

fn state(done: bool, held: bool) -> MsgState {
    match (done, held) {
        (true, _) => MsgState::Done,
        (false, true) => MsgState::Held,
        (false, false) => MsgState::Pending,
    }
}

fn send_record(base: Instant, (peer, j): &(usize, SendJob)) -> MsgRecord {
    let st = state(j.done, j.held);
    msg_record(base, *peer, Dir::Send, j.src.len(), j.moved(), st, &j.trace)
}

fn recv_record(base: Instant, (peer, j): &(usize, RecvJob)) -> MsgRecord {
    let st = state(j.done, j.held);
    msg_record(
        base,
        *peer,
        Dir::Recv,
        j.sink.len(),
        j.moved(),
        st,
        &j.trace,
    )
}

/// Records the messages of one operation (a schedule's run): every
/// transfer belongs to operation `op`.
struct OpEvidence<'a> {
    shared: &'a Shared,
    op: u64,
}

impl Evidence for OpEvidence<'_> {
    fn transfers(&self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)], at: Moment) {
        let stamped = |t: &JobTrace| t.first.is_some();
        if at == Moment::Finished
            && !sends.iter().any(|(_, j)| stamped(&j.trace))
            && !recvs.iter().any(|(_, j)| stamped(&j.trace))
        {
            // Finished before it waited long: its record is evidence enough
            // (and the fast path takes no lock for its messages).
            return;
        }
        let mut rec = self.shared.recorder.lock().unwrap();
        let (op, base) = (self.op, rec.base);
        let all = sends
            .iter()
            .map(|s| MsgRecord {
                op,
                ..send_record(base, s)
            })
            .chain(recvs.iter().map(|r| MsgRecord {
                op,
                ..recv_record(base, r)
            }));
        if at == Moment::Waiting {
            let now = rec.now_ns();
            rec.set_live(now, all);
        } else {
            rec.push_messages(op, all);
            rec.clear_live();
        }
    }
}
