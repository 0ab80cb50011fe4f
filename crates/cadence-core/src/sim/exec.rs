//! Running every rank's schedule on a modeled cluster: the executor half of
//! the simulator (issue 15).
//!
//! Semantics, as the engine runs a schedule (`engine::run_phases`):
//! - A rank runs its phases in order. Entering a phase it does the phase's
//!   local steps (`Copy`, `Reduce`: γ per byte on the rank's CPU), then
//!   **posts** the phase's transfers.
//! - **Look-ahead**: while phase p is current, phase p+1 (when it has no
//!   local steps) is admitted *held*; each of its transfers is released
//!   once no unfinished transfer of phase p writes memory it touches, or
//!   reads memory it writes (the engine's hazard rule), and an empty one
//!   when its phase becomes current. So a sliced ring forwards slice k as
//!   soon as slice k arrived.
//! - **Channels**: the k-th `Send` from a to b is the k-th `Recv` at b from a
//!   (channel order, as on the wire), and messages on one channel leave one
//!   after another (one stream). A message leaves once its send is released
//!   and the one before it on the channel has left; a large one (over the
//!   transport's eager limit: socket buffers, shared-memory slots) waits for
//!   its receive to be released too. It is a flow over its route
//!   ([`Model::route`]) sharing links by weighted max-min fairness
//!   ([`super::flows`]), weighted by the messages its channel has ready
//!   when it leaves (TCP favours a connection that always has data), and
//!   arrives α after its last byte left (so back-to-back slices do not pay
//!   α each).
//! - Each message costs its sender's CPU a fixed overhead before it leaves,
//!   one message after another (many concurrent messages overlap their
//!   latency, not their start-up work). Where the ranks share a machine's
//!   cores ([`Model::shared_cores`]: an emulated cluster), that start-up
//!   work, at least [`Model::loaded_overhead`] a message, is shared by all
//!   the messages being started at once on the machine (processor sharing,
//!   at most one core each); with [`Model::stack_cost`] the bytes of
//!   messages between hosts cross those cores too, as a link, and each
//!   call first costs each rank [`Model::call_overhead`] of them.
//! - A receive completes when its message arrived and it is released; a
//!   reducing one also needs γ per byte of the receiver's CPU, which it
//!   spends while the bytes arrive (the engine reduces pieces as they land),
//!   one reduction at a time per rank.
//! - A phase ends when all its transfers are done; the held phase becomes
//!   current and the one after it may be admitted held.
//!
//! Not modeled: CPU contention between ranks beyond the memory link, the
//! shared cores' start-up work and their network stacks (reductions and
//! copies use a rank's own CPU), TCP slow start and retransmits, the
//! engine's wake-up costs on an idle machine (they are in α).
//!
//! The schedules are compiled to a compact form as they are built
//! ([`simulate_with`]), so 4096 ranks' schedules of thousands of phases fit
//! in memory, and time advances from event to event: the cost is per
//! message, not per byte.

use super::flows::{Bucket, Flows};
use crate::schedule::{Buf, Schedule, Span, Step, Topology};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// A cluster as the executor sees it: where ranks live, what links their
/// messages cross, and what things cost.
#[derive(Clone, Debug)]
pub struct Model {
    pub topo: Topology,
    /// Per host: bytes/s its NICs send and receive (all of them together:
    /// cadence stripes a link over every NIC).
    pub nic_out: Vec<f64>,
    pub nic_in: Vec<f64>,
    /// Per host its group (leaf switch, rack), and per group what flows
    /// out of and into it share (bytes/s; infinite: no shared uplink).
    pub group_of: Vec<usize>,
    pub group_out: Vec<f64>,
    pub group_in: Vec<f64>,
    /// Seconds from a message's last byte leaving to its arrival: between
    /// hosts, plus `hop_alpha` when it crosses groups; on one host.
    pub tcp_alpha: f64,
    pub hop_alpha: f64,
    pub shm_alpha: f64,
    /// Bytes/s a rank copies in from shared memory, and one host's memory
    /// moves for all its ranks together.
    pub shm_rate: f64,
    pub mem_rate: f64,
    /// Seconds of the sending rank's CPU per message (LogP's o), one message
    /// after another: concurrent messages overlap their latencies, not
    /// their start-up work. Between hosts and on one host.
    pub tcp_overhead: f64,
    pub shm_overhead: f64,
    /// Messages up to this many bytes leave before their receive is posted.
    pub tcp_eager: f64,
    pub shm_eager: f64,
    /// Seconds per byte of a local reduction or copy.
    pub gamma: f64,
    /// Token buckets in front of the NICs and uplinks (`tc tbf`, as the
    /// emulated cluster shapes its links); None on real hardware.
    pub shaper: Option<Shaper>,
    /// Cores that every rank of the cluster shares (an emulated cluster
    /// runs all its hosts on one machine); None: each rank has a core of
    /// its own. With it a message's overhead is work on those cores, shared
    /// by the messages being started at once (processor sharing, at most
    /// one core each), so a step in which every rank sends costs more than
    /// one in which two do.
    pub shared_cores: Option<f64>,
    /// With shared cores: the core time every message costs at least
    /// (seconds), what a loaded machine spends switching its receiver in
    /// and out, over shared memory as over TCP.
    pub loaded_overhead: f64,
    /// With shared cores: seconds of those cores per byte of a message
    /// between hosts (the hosts' network stacks: TCP, the veths and
    /// shapers, the copies in and out); 0: free. The stacks' bytes and the
    /// messages' start-up work then share the same cores, so a step in
    /// which every rank sends costs their sum, not the larger of the two.
    pub stack_cost: f64,
    /// With shared cores: the core time each rank spends on a call before
    /// its first message (the binding, the schedule's lookup, the
    /// operation's record), shared with everything else on those cores.
    pub call_overhead: f64,
}

/// How shaped links pass traffic: after an idle spell each NIC or uplink
/// direction passes `burst` seconds of its rate at `peak` (bytes/s, what the
/// path does unshaped), then its rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shaper {
    pub burst: f64,
    pub peak: f64,
}

impl Model {
    /// A flat cluster: every host's NIC at `rate` both ways, one switch.
    pub fn flat(topo: Topology, rate: f64, tcp_alpha: f64) -> Model {
        let h = topo.nhosts();
        Model {
            topo,
            nic_out: vec![rate; h],
            nic_in: vec![rate; h],
            group_of: vec![0; h],
            group_out: vec![f64::INFINITY],
            group_in: vec![f64::INFINITY],
            tcp_alpha,
            hop_alpha: 0.0,
            shm_alpha: 1e-6,
            shm_rate: 8e9,
            mem_rate: f64::INFINITY,
            tcp_overhead: 0.0,
            shm_overhead: 0.0,
            tcp_eager: 4.0 * 1024.0 * 1024.0,
            shm_eager: 256.0 * 1024.0,
            gamma: 1.0 / 4e9,
            shaper: None,
            shared_cores: None,
            loaded_overhead: 0.0,
            stack_cost: 0.0,
            call_overhead: 0.0,
        }
    }

    fn nhosts(&self) -> usize {
        self.topo.nhosts()
    }

    fn ngroups(&self) -> usize {
        self.group_out.len()
    }

    /// Checks the model's shape and numbers: one line per mistake.
    pub fn check(&self) -> Result<(), String> {
        let (h, g) = (self.nhosts(), self.ngroups());
        if self.nic_out.len() != h || self.nic_in.len() != h || self.group_of.len() != h {
            return Err(format!("per-host lists do not have {h} entries"));
        }
        if self.group_in.len() != g || self.group_of.iter().any(|&x| x >= g) {
            return Err(format!("group lists do not match {g} groups"));
        }
        let rates = self
            .nic_out
            .iter()
            .chain(&self.nic_in)
            .chain(&self.group_out)
            .chain(&self.group_in)
            .chain([&self.shm_rate, &self.mem_rate]);
        if rates.into_iter().any(|&r| r.is_nan() || r <= 0.0) {
            return Err("every rate must be positive".into());
        }
        let times = [
            self.tcp_alpha,
            self.hop_alpha,
            self.shm_alpha,
            self.gamma,
            self.tcp_overhead,
            self.shm_overhead,
            self.tcp_eager,
            self.shm_eager,
            self.loaded_overhead,
            self.stack_cost,
            self.call_overhead,
        ];
        if times.iter().any(|&t| !t.is_finite() || t < 0.0) {
            return Err("latencies, overheads, γ and eager limits must be finite and ≥ 0".into());
        }
        if let Some(s) = self.shaper {
            if !(s.burst.is_finite() && s.burst >= 0.0 && s.peak > 0.0) {
                return Err("a shaper's burst must be ≥ 0 and its peak rate positive".into());
            }
        }
        Ok(())
    }

    /// Link capacities: NIC out per host, NIC in per host, group out, group
    /// in, each rank's shared-memory copy-in, each host's memory.
    fn links(&self) -> Vec<f64> {
        let mut cap = self.nic_out.clone();
        cap.extend(&self.nic_in);
        cap.extend(&self.group_out);
        cap.extend(&self.group_in);
        cap.extend(std::iter::repeat_n(self.shm_rate, self.topo.nranks()));
        cap.extend(std::iter::repeat_n(self.mem_rate, self.nhosts()));
        if let Some(cores) = self.shared_cores {
            // Each rank's thread, then the machine, in units of work that
            // messages between hosts also spend (see `cpu_unit`).
            let unit = self.cpu_unit();
            cap.extend(std::iter::repeat_n(1.0 / unit, self.topo.nranks()));
            cap.push(cores / unit);
        }
        cap
    }

    /// Seconds of core time in one unit of the cores' links: a byte's
    /// worth of the network stacks where they cost something (so that the
    /// bytes of a message between hosts cross the cores' link as they
    /// cross a NIC, one unit a byte), else one second.
    fn cpu_unit(&self) -> f64 {
        if self.stack_cost > 0.0 {
            self.stack_cost
        } else {
            1.0
        }
    }

    /// The machine's cores' link, when the ranks share cores.
    fn cores_link(&self) -> Option<usize> {
        self.shared_cores?;
        let (h, g, n) = (self.nhosts(), self.ngroups(), self.topo.nranks());
        Some(2 * h + 2 * g + n + h + n)
    }

    /// The links a message's start-up work on rank a's CPU crosses, when
    /// the ranks share cores: its thread and the machine's cores.
    fn cpu_route(&self, a: usize) -> Vec<usize> {
        let (h, g, n) = (self.nhosts(), self.ngroups(), self.topo.nranks());
        let base = 2 * h + 2 * g + n + h;
        vec![base + a, base + n]
    }

    /// Per link of [`Model::links`], its token bucket: the NICs' and the
    /// groups' uplinks' when the model has a shaper.
    fn buckets(&self) -> Vec<Option<Bucket>> {
        let cap = self.links();
        let shaped = 2 * self.nhosts() + 2 * self.ngroups();
        cap.iter()
            .enumerate()
            .map(|(l, &c)| {
                let s = self.shaper?;
                (l < shaped && c.is_finite()).then(|| Bucket {
                    depth: c * s.burst,
                    peak: s.peak.max(c),
                })
            })
            .collect()
    }

    /// The links a message from rank a to rank b crosses.
    pub fn route(&self, a: usize, b: usize) -> Vec<usize> {
        let (h, g, n) = (self.nhosts(), self.ngroups(), self.topo.nranks());
        let (ha, hb) = (self.topo.host_of(a), self.topo.host_of(b));
        if ha == hb {
            return vec![2 * h + 2 * g + b, 2 * h + 2 * g + n + ha];
        }
        let (ga, gb) = (self.group_of[ha], self.group_of[hb]);
        let mut r = vec![ha, h + hb];
        if ga != gb {
            r.extend([2 * h + ga, 2 * h + g + gb]);
        }
        if self.stack_cost > 0.0 {
            r.extend(self.cores_link());
        }
        r
    }

    /// Rates (bytes/s) of flows between hosts (not ranks) started at
    /// once, by max-min fair sharing of the NICs and the groups' uplinks:
    /// what a profile's round measures on this model (each host's flow
    /// leaves from its first rank, as the profile's leaders do).
    pub fn host_flow_rates(&self, flows: &[(usize, usize)]) -> Vec<f64> {
        let leader = |h: usize| self.topo.ranks_on(h)[0];
        let routes: Vec<Vec<usize>> = flows
            .iter()
            .map(|&(a, b)| self.route(leader(a), leader(b)))
            .collect();
        let refs: Vec<&[usize]> = routes.iter().map(Vec::as_slice).collect();
        super::flows::max_min_rates(&self.links(), &refs)
    }

    fn alpha(&self, a: usize, b: usize) -> f64 {
        let (ha, hb) = (self.topo.host_of(a), self.topo.host_of(b));
        if ha == hb {
            self.shm_alpha
        } else if self.group_of[ha] != self.group_of[hb] {
            self.tcp_alpha + self.hop_alpha
        } else {
            self.tcp_alpha
        }
    }

    fn overhead(&self, a: usize, b: usize) -> f64 {
        if self.topo.host_of(a) == self.topo.host_of(b) {
            self.shm_overhead
        } else {
            self.tcp_overhead
        }
    }

    fn eager(&self, a: usize, b: usize) -> f64 {
        if self.topo.host_of(a) == self.topo.host_of(b) {
            self.shm_eager
        } else {
            self.tcp_eager
        }
    }
}

/// One transfer of a compiled schedule. Offsets are in elements within a
/// buffer (`buf`: Input 0, Output 1, Scratch 2), for the hazard check.
#[derive(Clone, Copy, Debug)]
struct Xfer {
    peer: u32,
    off: u32,
    len: u32,
    with_off: u32,
    send: bool,
    reduce: bool,
    buf: u8,
    with_buf: u8,
}

/// A rank's schedule as the executor needs it: per phase the elements its
/// local steps touch and where its transfers start in `xfers`.
struct Compiled {
    first: Vec<u32>,
    local: Vec<f64>,
    /// Per phase: whether it folds (`Step::Fold`), so that neither it nor
    /// the phase after it is admitted ahead, as in the engine.
    folds: Vec<bool>,
    xfers: Vec<Xfer>,
}

impl Compiled {
    fn nphases(&self) -> usize {
        self.first.len()
    }

    /// The schedules of `units` one after another (a rank's calls in
    /// order), and the phase index at which each unit ends.
    fn sequence(units: &[&Compiled]) -> (Compiled, Vec<usize>) {
        let mut out = Compiled {
            first: Vec::new(),
            local: Vec::new(),
            folds: Vec::new(),
            xfers: Vec::new(),
        };
        let mut ends = Vec::with_capacity(units.len());
        for u in units {
            let base = out.xfers.len() as u32;
            out.first.extend(u.first.iter().map(|&f| f + base));
            out.local.extend(&u.local);
            out.folds.extend(&u.folds);
            out.xfers.extend(&u.xfers);
            ends.push(out.first.len());
        }
        (out, ends)
    }
    fn span(&self, p: usize) -> std::ops::Range<usize> {
        let end = self
            .first
            .get(p + 1)
            .map_or(self.xfers.len(), |&e| e as usize);
        self.first[p] as usize..end
    }
}

fn buf_id(b: Buf) -> u8 {
    match b {
        Buf::Input => 0,
        Buf::Output => 1,
        Buf::Scratch => 2,
    }
}

fn small(x: usize, what: &str) -> Result<u32, String> {
    u32::try_from(x).map_err(|_| format!("{what} {x} is beyond what the simulator indexes (2^32)"))
}

fn compile(s: &Schedule) -> Result<Compiled, String> {
    let mut c = Compiled {
        first: Vec::with_capacity(s.phases.len()),
        local: Vec::with_capacity(s.phases.len()),
        folds: Vec::with_capacity(s.phases.len()),
        xfers: Vec::new(),
    };
    for phase in &s.phases {
        c.first.push(small(c.xfers.len(), "transfer count")?);
        let mut local = 0usize;
        // A receive that a fold reduces as it lands costs the CPU what a
        // reducing receive does, and is modeled as one (its operand the
        // fold's destination).
        let folded = |span: Span| {
            phase.steps.iter().find_map(|st| match *st {
                Step::Fold { src, dst } if src == span => Some(dst),
                _ => None,
            })
        };
        for step in &phase.steps {
            let (peer, span, send, with) = match *step {
                Step::Send { peer, src } => (peer, src, true, None),
                Step::Recv {
                    peer,
                    dst,
                    reduce_with,
                } => (peer, dst, false, reduce_with.or_else(|| folded(dst))),
                Step::Copy { src, .. } | Step::Reduce { src, .. } => {
                    local += src.len;
                    continue;
                }
                Step::Fold { .. } => continue,
            };
            c.xfers.push(Xfer {
                peer: small(peer, "rank")?,
                off: small(span.off, "offset")?,
                len: small(span.len, "length")?,
                with_off: small(with.map_or(0, |w| w.off), "offset")?,
                send,
                reduce: with.is_some(),
                buf: buf_id(span.buf),
                with_buf: with.map_or(0, |w| buf_id(w.buf)),
            });
        }
        c.local.push(local as f64);
        c.folds
            .push(phase.steps.iter().any(|st| matches!(st, Step::Fold { .. })));
    }
    Ok(c)
}

fn hits(abuf: u8, a: u32, alen: u32, bbuf: u8, b: u32, blen: u32) -> bool {
    abuf == bbuf && alen > 0 && blen > 0 && a < b + blen && b < a + alen
}

/// Whether `earlier`, unfinished, keeps the held transfer `held` of the
/// next phase from starting (the engine's `release_held`).
fn blocks(earlier: &Xfer, held: &Xfer) -> bool {
    let (e, h) = (earlier, held);
    if h.send {
        !e.send && hits(h.buf, h.off, h.len, e.buf, e.off, e.len)
    } else if e.send {
        hits(h.buf, h.off, h.len, e.buf, e.off, e.len)
    } else {
        hits(h.buf, h.off, h.len, e.buf, e.off, e.len)
            || (h.reduce && hits(h.with_buf, h.with_off, h.len, e.buf, e.off, e.len))
            || (e.reduce && hits(h.buf, h.off, h.len, e.with_buf, e.with_off, e.len))
    }
}

/// One end of a message: rank, phase, index in the rank's transfers.
#[derive(Clone, Copy, Debug)]
struct End {
    rank: u32,
    phase: u32,
    idx: u32,
}

#[derive(Default)]
struct Msg {
    bytes: f64,
    reduce: bool,
    send: Option<End>,
    recv: Option<End>,
    /// When each end was released (it may start / complete).
    send_ready: Option<f64>,
    recv_ready: Option<f64>,
    started: Option<f64>,
    arrived: Option<f64>,
    recv_scheduled: bool,
}

/// Messages between one sender and one receiver, in channel order.
struct Chan {
    src: u32,
    dst: u32,
    /// Messages not yet received; `q[0]` has sequence number `base`.
    q: VecDeque<Msg>,
    base: u64,
    sends: u64,
    recvs: u64,
    /// The next message to leave, and whether one is on the wire.
    next_out: u64,
    busy: bool,
}

impl Chan {
    fn msg(&mut self, seq: u64) -> &mut Msg {
        let i = (seq - self.base) as usize;
        while self.q.len() <= i {
            self.q.push_back(Msg::default());
        }
        &mut self.q[i]
    }
}

/// Messages on the channel's wire or waiting to leave with their send
/// released, from the one leaving now.
fn ch_ready(ch: &Chan) -> usize {
    ch.q.iter()
        .skip((ch.next_out - ch.base) as usize)
        .take_while(|m| m.send_ready.is_some())
        .count()
        .max(1)
}

/// Per rank: the current phase, the admitted held one, and their
/// transfers' state.
#[derive(Default)]
struct RankState {
    cur: usize,
    /// Whether phase `cur` has posted (its local steps are done).
    posted: bool,
    /// Whether phase `cur + 1` is admitted (held).
    ahead: bool,
    cur_open: usize,
    ahead_open: usize,
    /// Per transfer of the current / held phase: done; for the held phase
    /// also the unfinished transfers of the current one that block it
    /// (`u32::MAX`: an empty message, released when its phase is current).
    cur_done: Vec<bool>,
    ahead_done: Vec<bool>,
    ahead_block: Vec<u32>,
    /// Where each transfer of the current / held phase sits on its channel.
    cur_at: Vec<(u32, u64)>,
    ahead_at: Vec<(u32, u64)>,
    cpu_free: f64,
    /// Whether the rank's work on the call that starts at phase `cur` is done.
    call_paid: bool,
    /// The next unit of the program this rank has not finished.
    unit: usize,
    /// When the rank's CPU may start its next message.
    inject_free: f64,
    finished: f64,
}

/// Events ordered by time, then by the order they were made (determinism).
struct Event(f64, u64, Kind);
#[derive(Clone, Copy)]
enum Kind {
    /// Rank's local steps are done: its phase posts.
    Post(u32),
    /// A channel's head message leaves.
    Leave(u32),
    /// A message's receive completes.
    Received(u32, u64),
}
impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

/// What a simulation found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Seconds until the last rank finished.
    pub seconds: f64,
    /// Messages that crossed the modeled network (shared memory included).
    pub messages: u64,
    /// Per call ([`simulate_calls`]), when the last rank was done with it.
    pub call_ends: Vec<f64>,
}

/// Simulated seconds for every rank's schedule (`schedules[r]` is rank r's)
/// to finish on `model`, elements of `elem_size` bytes. Err when the
/// schedules do not match up (a send without its receive, sizes that
/// differ, a cyclic wait), which the verifier rules out for the library's.
pub fn simulate(schedules: &[Schedule], model: &Model, elem_size: usize) -> Result<f64, String> {
    let n = schedules.len();
    if n != model.topo.nranks() {
        return Err(format!("{n} schedules for {} ranks", model.topo.nranks()));
    }
    simulate_with(|r| Ok(schedules[r].clone()), model, elem_size).map(|o| o.seconds)
}

/// As [`simulate`], with rank r's schedule from `build(r)`: each is
/// compiled as it is built and dropped (in parallel over the machine's
/// cores), so thousands of ranks need only the compact form in memory.
pub fn simulate_with<F>(build: F, model: &Model, elem_size: usize) -> Result<Outcome, String>
where
    F: Fn(usize) -> Result<Schedule, String> + Sync,
{
    simulate_calls(build, model, elem_size, 1)
}

/// As [`simulate_with`], every rank making `calls` such calls back to back,
/// as a benchmark's timed loop does: a rank starts its next call when its
/// own part of the last one is done (no look-ahead across calls: a call
/// returns first), so calls overlap across ranks, and shaped links carry
/// their buckets' state from one to the next. [`Outcome::call_ends`] says
/// when each call was done on every rank.
pub fn simulate_calls<F>(
    build: F,
    model: &Model,
    elem_size: usize,
    calls: usize,
) -> Result<Outcome, String>
where
    F: Fn(usize) -> Result<Schedule, String> + Sync,
{
    let program = vec![Unit::Call(0); calls.max(1)];
    let no_gap = |_| Err("the program has no gap".to_string());
    simulate_program(|r, _| build(r), no_gap, &program, model, elem_size)
}

/// A rank's compiled program, and the phase index at which each unit ends.
type Program = (Compiled, Vec<usize>);

/// One call of a program ([`simulate_program`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    /// A collective being simulated: which of the program's calls (several
    /// take turns, as `cadence bench --algo all` times its algorithms).
    Call(usize),
    /// What a benchmark runs between its samples (a barrier): its own
    /// schedule, so its messages and the links' idle time are modeled.
    Gap,
}

/// Every rank makes the calls of `program` in order, back to back: `Call(k)`
/// runs `build(r, k)`'s schedule, `Gap` runs `gap(r)`'s. A rank starts a call
/// when its own part of the one before is done (no look-ahead across
/// calls), and shaped links carry their buckets' state from call to call.
/// [`Outcome::call_ends`] has an entry per unit of `program`.
pub fn simulate_program<F, G>(
    build: F,
    gap: G,
    program: &[Unit],
    model: &Model,
    elem_size: usize,
) -> Result<Outcome, String>
where
    F: Fn(usize, usize) -> Result<Schedule, String> + Sync,
    G: Fn(usize) -> Result<Schedule, String> + Sync,
{
    model.check()?;
    let n = model.topo.nranks();
    let with_gap = program.contains(&Unit::Gap);
    let variants = program
        .iter()
        .filter_map(|u| match u {
            Unit::Call(k) => Some(k + 1),
            Unit::Gap => None,
        })
        .max()
        .unwrap_or(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |w| w.get())
        .clamp(1, n.max(1));
    let mut progs: Vec<Option<Result<Program, String>>> = (0..n).map(|_| None).collect();
    std::thread::scope(|s| {
        for (w, part) in progs.chunks_mut(n.div_ceil(workers).max(1)).enumerate() {
            let build = &build;
            let base = w * n.div_ceil(workers).max(1);
            let gap = &gap;
            s.spawn(move || {
                for (i, slot) in part.iter_mut().enumerate() {
                    let r = base + i;
                    let bodies: Result<Vec<Compiled>, String> = (0..variants)
                        .map(|k| build(r, k).and_then(|sch| compile(&sch)))
                        .collect();
                    let pause = match with_gap {
                        true => gap(r).and_then(|sch| compile(&sch)),
                        false => Ok(Compiled::sequence(&[]).0),
                    };
                    *slot = Some(bodies.and_then(|b| {
                        pause.map(|g| {
                            let units: Vec<&Compiled> = program
                                .iter()
                                .map(|u| match u {
                                    Unit::Call(k) => &b[*k],
                                    Unit::Gap => &g,
                                })
                                .collect();
                            Compiled::sequence(&units)
                        })
                    }));
                }
            });
        }
    });
    let (progs, unit_ends): (Vec<Compiled>, Vec<Vec<usize>>) = progs
        .into_iter()
        .map(|p| p.expect("every rank built"))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    let sim = Sim {
        model,
        es: elem_size as f64,
        ranks: (0..n).map(|_| RankState::default()).collect(),
        // A call's first phase is never admitted ahead (the call before it
        // returned first).
        has_local: progs
            .iter()
            .zip(&unit_ends)
            .map(|(p, ends)| {
                let mut first = vec![false; p.nphases()];
                for &e in ends {
                    if let Some(f) = first.get_mut(e) {
                        *f = true;
                    }
                }
                (0..p.nphases())
                    .map(|q| {
                        p.local[q] > 0.0 || first[q] || p.folds[q] || (q > 0 && p.folds[q - 1])
                    })
                    .collect()
            })
            .collect(),
        call_first: progs
            .iter()
            .zip(&unit_ends)
            .map(|(p, ends)| {
                let mut first = vec![false; p.nphases()];
                for e in std::iter::once(0).chain(ends.iter().copied()) {
                    if let Some(f) = first.get_mut(e) {
                        *f = true;
                    }
                }
                first
            })
            .collect(),
        progs,
        unit_ends,
        call_ends: vec![0.0; program.len()],
        chans: Vec::new(),
        chan_of: HashMap::new(),
        flows: Flows::shaped(model.links(), &model.buckets()),
        events: BinaryHeap::new(),
        made: 0,
        now: 0.0,
        messages: 0,
    };
    sim.run()
}

/// A flow id's mark for a message's start-up work on shared cores (the
/// rest of the id is its channel), as against the message on the wire.
const CPU_WORK: usize = 1 << (usize::BITS - 1);
/// A flow id's mark for a rank's work on a call before its first phase,
/// on shared cores (the rest of the id is the rank).
const CALL_WORK: usize = 1 << (usize::BITS - 2);

struct Sim<'a> {
    model: &'a Model,
    es: f64,
    progs: Vec<Compiled>,
    /// Per rank and phase: whether the phase has local steps, starts a
    /// call, or folds or follows a phase that does (then it is never
    /// admitted ahead).
    has_local: Vec<Vec<bool>>,
    /// Per rank and phase: whether the phase is a call's first.
    call_first: Vec<Vec<bool>>,
    /// Per rank, the phase index at which each unit of the program ends;
    /// per unit, when its last rank was done.
    unit_ends: Vec<Vec<usize>>,
    call_ends: Vec<f64>,
    ranks: Vec<RankState>,
    chans: Vec<Chan>,
    chan_of: HashMap<(u32, u32), u32>,
    flows: Flows,
    events: BinaryHeap<Event>,
    made: u64,
    now: f64,
    messages: u64,
}

impl Sim<'_> {
    fn push(&mut self, at: f64, kind: Kind) {
        self.made += 1;
        self.events.push(Event(at, self.made, kind));
    }

    fn run(mut self) -> Result<Outcome, String> {
        let n = self.progs.len();
        for r in 0..n {
            if self.progs[r].nphases() > 0 {
                self.enter(r);
            }
        }
        loop {
            let tf = self.flows.next_completion();
            let te = self.events.peek().map_or(f64::INFINITY, |e| e.0);
            if tf.min(te) == f64::INFINITY {
                break;
            }
            if tf <= te {
                let left = self.flows.run_until(tf);
                self.now = self.flows.now();
                for id in left {
                    if id & CPU_WORK != 0 {
                        self.leave((id & !CPU_WORK) as u32);
                    } else if id & CALL_WORK != 0 {
                        let r = id & !CALL_WORK;
                        self.ranks[r].call_paid = true;
                        self.enter(r);
                    } else {
                        self.left(id as u32)?;
                    }
                }
            } else {
                self.flows.run_until(te);
                self.now = te;
                while self.events.peek().is_some_and(|e| e.0 <= te) {
                    let Event(_, _, kind) = self.events.pop().expect("peeked");
                    match kind {
                        Kind::Post(r) => self.post(r as usize)?,
                        Kind::Leave(c) => self.leave(c),
                        Kind::Received(c, seq) => self.received(c, seq)?,
                    }
                }
            }
        }
        for ch in &self.chans {
            if let Some(m) =
                ch.q.iter()
                    .find(|m| m.bytes >= 0.0 && (m.send.is_none() || m.recv.is_none()))
            {
                return Err(format!(
                    "a message from rank {} to rank {} has no matching {}",
                    ch.src,
                    ch.dst,
                    if m.send.is_some() { "receive" } else { "send" }
                ));
            }
        }
        if let Some(r) = (0..n).find(|&r| self.ranks[r].cur < self.progs[r].nphases()) {
            return Err(format!(
                "rank {r} is stuck in phase {} of {} (a cyclic wait)",
                self.ranks[r].cur,
                self.progs[r].nphases()
            ));
        }
        Ok(Outcome {
            seconds: self.ranks.iter().map(|s| s.finished).fold(0.0, f64::max),
            messages: self.messages,
            call_ends: self.call_ends,
        })
    }

    /// Rank r enters its current phase: local steps on its CPU, then Post.
    /// A call's first phase waits for the rank's work on the call, where
    /// the ranks share cores.
    fn enter(&mut self, r: usize) {
        let call_work = self.model.call_overhead;
        let st = &mut self.ranks[r];
        if call_work > 0.0 && self.model.shared_cores.is_some() && self.call_first[r][st.cur] {
            if !st.call_paid {
                let units = call_work / self.model.cpu_unit();
                self.flows
                    .start(CALL_WORK | r, self.model.cpu_route(r), units);
                return;
            }
            st.call_paid = false;
        }
        let cost = self.progs[r].local[st.cur] * self.es * self.model.gamma;
        let at = self.now.max(st.cpu_free) + cost;
        st.cpu_free = at;
        st.posted = false;
        self.push(at, Kind::Post(r as u32));
    }

    fn chan(&mut self, a: u32, b: u32) -> u32 {
        let next = self.chans.len() as u32;
        let c = *self.chan_of.entry((a, b)).or_insert(next);
        if c == next {
            self.chans.push(Chan {
                src: a,
                dst: b,
                q: VecDeque::new(),
                base: 0,
                sends: 0,
                recvs: 0,
                next_out: 0,
                busy: false,
            });
        }
        c
    }

    /// Puts transfer `idx` (phase `phase`) of rank r on its channel,
    /// released now or held.
    fn register(
        &mut self,
        r: usize,
        phase: usize,
        idx: usize,
        ready: bool,
    ) -> Result<(u32, u64), String> {
        let x = self.progs[r].xfers[idx];
        let n = self.progs.len() as u32;
        if x.peer >= n || x.peer as usize == r {
            return Err(format!("rank {r} names peer {} of {n} ranks", x.peer));
        }
        let (a, b) = if x.send {
            (r as u32, x.peer)
        } else {
            (x.peer, r as u32)
        };
        let c = self.chan(a, b);
        let bytes = x.len as f64 * self.es;
        let now = self.now;
        let ch = &mut self.chans[c as usize];
        let seq = if x.send { &mut ch.sends } else { &mut ch.recvs };
        *seq += 1;
        let seq = *seq - 1;
        let m = ch.msg(seq);
        if (m.send.is_some() || m.recv.is_some()) && m.bytes != bytes {
            return Err(format!(
                "message {seq} from rank {a} to rank {b}: {} bytes sent, {} received",
                if x.send { bytes } else { m.bytes },
                if x.send { m.bytes } else { bytes },
            ));
        }
        m.bytes = bytes;
        let end = Some(End {
            rank: r as u32,
            phase: phase as u32,
            idx: idx as u32,
        });
        let at = ready.then_some(now);
        if x.send {
            m.send = end;
            m.send_ready = at;
        } else {
            m.recv = end;
            m.reduce = x.reduce;
            m.recv_ready = at;
        }
        Ok((c, seq))
    }

    /// A transfer's end may go on: its message may leave or complete.
    fn poke(&mut self, c: u32, seq: u64) {
        self.try_leave(c);
        self.maybe_receive(c, seq);
    }

    fn release(&mut self, c: u32, seq: u64, send: bool) {
        let now = self.now;
        let m = self.chans[c as usize].msg(seq);
        if send {
            m.send_ready = Some(now);
        } else {
            m.recv_ready = Some(now);
        }
        self.poke(c, seq);
    }

    /// Starts the channel's next message when the wire is free and it may go.
    fn try_leave(&mut self, c: u32) {
        let ch = &self.chans[c as usize];
        if ch.busy {
            return;
        }
        let Some(m) = ch.q.get((ch.next_out - ch.base) as usize) else {
            return;
        };
        if m.send_ready.is_none() {
            return;
        }
        let (a, b) = (ch.src as usize, ch.dst as usize);
        if m.bytes > self.model.eager(a, b) && m.recv_ready.is_none() {
            return;
        }
        self.chans[c as usize].busy = true;
        if self.model.shared_cores.is_some() {
            let work = self.model.overhead(a, b).max(self.model.loaded_overhead);
            self.flows.start(
                CPU_WORK | c as usize,
                self.model.cpu_route(a),
                work / self.model.cpu_unit(),
            );
            return;
        }
        // The sender's CPU starts messages one at a time.
        let st = &mut self.ranks[a];
        let at = self.now.max(st.inject_free) + self.model.overhead(a, b);
        st.inject_free = at;
        self.push(at, Kind::Leave(c));
    }

    fn leave(&mut self, c: u32) {
        let now = self.now;
        let ch = &mut self.chans[c as usize];
        let (a, b) = (ch.src as usize, ch.dst as usize);
        let seq = ch.next_out;
        let m = ch.msg(seq);
        m.started = Some(now);
        let bytes = m.bytes;
        self.messages += 1;
        // A busy link is shared in proportion to the messages each channel
        // has ready (this one and the released ones behind it), as counted
        // when this one leaves: TCP gives a connection that always has data
        // more of a link than one the application leaves idle between
        // messages (a larger congestion window). The engine's trace of a
        // 64 MiB double binary tree on 4 hosts: the inner ranks send each
        // other two messages a slot, back to back, at half the link each,
        // and the leaves one at a quarter; with equal shares every slot
        // waited 26 ms for the inner pair where the engine took 18.
        let weight = ch_ready(&self.chans[c as usize]) as f64;
        self.flows
            .start_weighted(c as usize, self.model.route(a, b), bytes, weight);
    }

    /// The channel's message on the wire has left entirely.
    fn left(&mut self, c: u32) -> Result<(), String> {
        let at = self.now + {
            let ch = &self.chans[c as usize];
            self.model.alpha(ch.src as usize, ch.dst as usize)
        };
        let ch = &mut self.chans[c as usize];
        ch.busy = false;
        let seq = ch.next_out;
        ch.next_out += 1;
        let m = ch.msg(seq);
        m.arrived = Some(at);
        let send = m.send.expect("a message leaves once its send is posted");
        self.end_done(send)?;
        self.maybe_receive(c, seq);
        self.try_leave(c);
        Ok(())
    }

    /// Schedules a message's receive once it arrived and is released.
    fn maybe_receive(&mut self, c: u32, seq: u64) {
        let ch = &mut self.chans[c as usize];
        if seq < ch.base {
            return;
        }
        let dst = ch.dst as usize;
        let m = ch.msg(seq);
        let (Some(arrived), Some(ready)) = (m.arrived, m.recv_ready) else {
            return;
        };
        if m.recv_scheduled {
            return;
        }
        m.recv_scheduled = true;
        let mut at = arrived.max(ready);
        if m.reduce {
            // The engine reduces pieces as they land: the CPU's work runs
            // beside the arrival, one reduction at a time per rank. The CPU
            // is busy for the work only, not for the whole arrival: the
            // reductions of messages arriving together (direct's incast)
            // share the time their bytes take to come in, and the rank is
            // CPU-bound only when their work adds up to more.
            let begun = m.started.unwrap_or(arrived).max(ready);
            let st = &mut self.ranks[dst];
            let work = m.bytes * self.model.gamma;
            let done = st.cpu_free.max(begun) + work;
            st.cpu_free = done;
            at = at.max(done);
        }
        self.push(at, Kind::Received(c, seq));
    }

    fn received(&mut self, c: u32, seq: u64) -> Result<(), String> {
        let ch = &mut self.chans[c as usize];
        let m = ch.msg(seq);
        let end = m.recv.expect("received means posted");
        m.recv_scheduled = false;
        m.arrived = None;
        m.send = None;
        m.recv = None;
        m.bytes = -1.0; // consumed
        while ch.q.front().is_some_and(|m| m.bytes < 0.0) {
            ch.q.pop_front();
            ch.base += 1;
        }
        self.end_done(end)
    }

    /// One end of a transfer is done on its rank.
    fn end_done(&mut self, e: End) -> Result<(), String> {
        let r = e.rank as usize;
        let p = e.phase as usize;
        let i = e.idx as usize - self.progs[r].first[p] as usize;
        let st = &mut self.ranks[r];
        if p == st.cur {
            st.cur_done[i] = true;
            st.cur_open -= 1;
            if st.ahead {
                let earlier = self.progs[r].xfers[e.idx as usize];
                let span = self.progs[r].span(p + 1);
                let mut go = Vec::new();
                for (j, xi) in span.enumerate() {
                    let b = &mut st.ahead_block[j];
                    if *b != u32::MAX && *b > 0 && blocks(&earlier, &self.progs[r].xfers[xi]) {
                        *b -= 1;
                        if *b == 0 {
                            go.push((st.ahead_at[j], self.progs[r].xfers[xi].send));
                        }
                    }
                }
                for ((c, seq), send) in go {
                    self.release(c, seq, send);
                }
            }
            self.retire(r)
        } else if p == st.cur + 1 && st.ahead {
            st.ahead_done[i] = true;
            st.ahead_open -= 1;
            Ok(())
        } else {
            Err(format!(
                "rank {r}: a transfer of phase {p} finished while phase {} is current",
                st.cur
            ))
        }
    }

    /// Rank r's phase p's transfers go on their channels, released.
    fn post(&mut self, r: usize) -> Result<(), String> {
        let p = self.ranks[r].cur;
        let span = self.progs[r].span(p);
        let mut at = Vec::with_capacity(span.len());
        for idx in span.clone() {
            at.push(self.register(r, p, idx, true)?);
        }
        let st = &mut self.ranks[r];
        st.posted = true;
        st.cur_open = span.len();
        st.cur_done.clear();
        st.cur_done.resize(span.len(), false);
        st.cur_at = at.clone();
        for (c, seq) in at {
            self.poke(c, seq);
        }
        self.admit_ahead(r)?;
        self.retire(r)
    }

    /// Admits phase cur+1 held, when it has no local steps.
    fn admit_ahead(&mut self, r: usize) -> Result<(), String> {
        let q = self.ranks[r].cur + 1;
        if self.ranks[r].ahead || q >= self.progs[r].nphases() || self.has_local[r][q] {
            return Ok(());
        }
        let cur = self.progs[r].span(q - 1);
        let span = self.progs[r].span(q);
        let mut block = Vec::with_capacity(span.len());
        for xi in span.clone() {
            let x = &self.progs[r].xfers[xi];
            let b = if x.len == 0 {
                u32::MAX
            } else {
                let st = &self.ranks[r];
                cur.clone()
                    .enumerate()
                    .filter(|&(j, e)| !st.cur_done[j] && blocks(&self.progs[r].xfers[e], x))
                    .count() as u32
            };
            block.push(b);
        }
        let mut at = Vec::with_capacity(span.len());
        for (k, idx) in span.clone().enumerate() {
            at.push(self.register(r, q, idx, block[k] == 0)?);
        }
        let st = &mut self.ranks[r];
        st.ahead = true;
        st.ahead_open = span.len();
        st.ahead_done.clear();
        st.ahead_done.resize(span.len(), false);
        st.ahead_block = block;
        st.ahead_at = at.clone();
        for (k, (c, seq)) in at.into_iter().enumerate() {
            if self.ranks[r].ahead_block[k] == 0 {
                self.poke(c, seq);
            }
        }
        Ok(())
    }

    /// Marks the units of the program that rank r (at phase `st.cur`) has
    /// finished, at `now`.
    fn end_units(ends: &[usize], st: &mut RankState, call_ends: &mut [f64], now: f64) {
        while st.unit < ends.len() && ends[st.unit] <= st.cur {
            call_ends[st.unit] = call_ends[st.unit].max(now);
            st.unit += 1;
        }
    }

    /// Retires rank r's finished phases: the held one becomes current (its
    /// transfers all released) and the next may be admitted; a phase not
    /// admitted yet is entered.
    fn retire(&mut self, r: usize) -> Result<(), String> {
        loop {
            let now = self.now;
            let nphases = self.progs[r].nphases();
            let st = &mut self.ranks[r];
            if !st.posted || st.cur_open > 0 || st.cur >= nphases {
                return Ok(());
            }
            st.cur += 1;
            st.finished = now;
            Self::end_units(&self.unit_ends[r], st, &mut self.call_ends, now);
            if st.ahead {
                st.ahead = false;
                std::mem::swap(&mut st.cur_done, &mut st.ahead_done);
                std::mem::swap(&mut st.cur_at, &mut st.ahead_at);
                st.cur_open = st.ahead_open;
                let held: Vec<(u32, u64, usize)> = st
                    .ahead_block
                    .iter()
                    .enumerate()
                    .filter(|&(_, &b)| b != 0)
                    .map(|(k, _)| (st.cur_at[k].0, st.cur_at[k].1, k))
                    .collect();
                st.ahead_block.clear();
                let first = self.progs[r].first[st.cur] as usize;
                for (c, seq, k) in held {
                    let send = self.progs[r].xfers[first + k].send;
                    self.release(c, seq, send);
                }
                self.admit_ahead(r)?;
            } else {
                if st.cur < nphases {
                    self.enter(r);
                }
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{build_on, Algo, CollArgs, Phase, Span};
    use crate::types::CollKind;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs()
    }

    fn run(kind: CollKind, algo: Algo, counts: Vec<usize>, model: &Model) -> f64 {
        let args = CollArgs {
            kind,
            root: 0,
            counts,
        };
        let s: Vec<_> = (0..model.topo.nranks())
            .map(|r| build_on(&args, r, &model.topo, algo).unwrap())
            .collect();
        simulate(&s, model, 4).unwrap()
    }

    #[test]
    fn a_channel_with_more_messages_ready_gets_more_of_a_busy_link() {
        // Rank 0 sends rank 1 two messages (A, then B) and rank 2 one (C),
        // all released at once, D bytes each; rank 2 then forwards C to
        // rank 3 over links nobody else uses. A leaves with B ready behind
        // it (weight 2), C alone (1): A at 2/3 of the NIC is done at
        // 1.5 D/r with half of C sent; then B and C split it, and C is done
        // at 2.5 D/r, forwarded by 3.5 D/r. (Equal shares: 3 D/r.)
        let n = 1 << 18;
        let d = (4 * n) as f64;
        let m = Model {
            gamma: 0.0,
            ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e8, 0.0)
        };
        let sched = |rank: usize, phases: Vec<Vec<Step>>| Schedule {
            rank,
            nranks: 4,
            algo: Algo::Direct,
            phases: phases.into_iter().map(|steps| Phase { steps }).collect(),
            scratch_len: 0,
        };
        let send = |peer, off| Step::Send {
            peer,
            src: Span::input(off, n),
        };
        let recv = |peer, off| Step::Recv {
            peer,
            dst: Span::output(off, n),
            reduce_with: None,
        };
        let s = vec![
            sched(0, vec![vec![send(1, 0), send(1, n), send(2, 2 * n)]]),
            sched(1, vec![vec![recv(0, 0), recv(0, n)]]),
            sched(
                2,
                vec![
                    vec![recv(0, 0)],
                    vec![Step::Send {
                        peer: 3,
                        src: Span::output(0, n),
                    }],
                ],
            ),
            sched(3, vec![vec![recv(2, 0)]]),
        ];
        let t = simulate(&s, &m, 4).unwrap();
        let want = 3.5 * d / 1e8;
        assert!(close(t, want, 1e-9), "{t} vs {want}");
    }

    #[test]
    fn one_message_costs_alpha_plus_bytes_over_rate() {
        // A broadcast between two hosts is one message.
        let m = Model {
            gamma: 0.0,
            ..Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6)
        };
        let t = run(CollKind::Broadcast, Algo::BinomialTree, vec![1 << 20], &m);
        let want = 50e-6 + (4 << 20) as f64 / 1.25e8;
        assert!(close(t, want, 1e-9), "{t} vs {want}");
    }

    #[test]
    fn ranks_sharing_cores_share_their_messages_start_up_work() {
        // A ring allgather of 4 bytes a rank on 4 hosts: 3 steps, in each of
        // which every rank starts one message (o = 20 µs, the wire free;
        // the own block's copy adds 1 ns).
        let ring = |shared_cores, loaded_overhead, o| {
            let m = Model {
                tcp_overhead: o,
                shared_cores,
                loaded_overhead,
                ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e15, 0.0)
            };
            run(CollKind::AllGather, Algo::Ring, vec![1; 4], &m)
        };
        // A core each: a step is one start-up.
        let t = ring(None, 0.0, 20e-6);
        assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
        // Two cores for four ranks: each step's four start-ups take two
        // start-ups' time; one core, four.
        let t = ring(Some(2.0), 0.0, 20e-6);
        assert!(close(t, 3.0 * 40e-6, 1e-4), "{t}");
        let t = ring(Some(1.0), 0.0, 20e-6);
        assert!(close(t, 3.0 * 80e-6, 1e-4), "{t}");
        // Eight cores: no rank waits for one (a core at most per message).
        let t = ring(Some(8.0), 0.0, 20e-6);
        assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
        // A busy machine's floor applies where the transport's own cost is less.
        let t = ring(Some(2.0), 10e-6, 1e-6);
        assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
    }

    #[test]
    fn shared_cores_carry_the_network_stacks_bytes_after_the_start_ups() {
        // The same ring with 10 kB a rank (2 500 floats; wire free): each step's four
        // start-ups (20 µs each) and four messages' bytes at 1 µs a kB of
        // core time share two cores, so a step takes (4 × 20 + 4 × 10) / 2
        // = 60 µs: the sum, not the larger of the two.
        let ring = |stack_cost| {
            let m = Model {
                tcp_overhead: 20e-6,
                shared_cores: Some(2.0),
                stack_cost,
                gamma: 0.0,
                ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e15, 0.0)
            };
            run(CollKind::AllGather, Algo::Ring, vec![2_500; 4], &m)
        };
        let t = ring(0.0);
        assert!(close(t, 3.0 * 40e-6, 1e-3), "{t}");
        let t = ring(1e-9);
        assert!(close(t, 3.0 * 60e-6, 1e-3), "{t}");
        // Messages on one host do not cross the stacks.
        let m = Model {
            tcp_overhead: 20e-6,
            shm_overhead: 20e-6,
            shared_cores: Some(2.0),
            stack_cost: 1e-9,
            gamma: 0.0,
            shm_rate: 1e15,
            shm_alpha: 0.0,
            mem_rate: f64::INFINITY,
            ..Model::flat(Topology::from_hosts(&[0, 0, 0, 0]), 1e15, 0.0)
        };
        let t = run(CollKind::AllGather, Algo::Ring, vec![2_500; 4], &m);
        assert!(close(t, 3.0 * 40e-6, 1e-2), "{t}");
    }

    #[test]
    fn each_rank_works_on_a_call_before_its_first_message_on_shared_cores() {
        // The 4-rank ring of 4 bytes a rank, 20 µs a message: 3 steps of
        // 40 µs on 2 cores. With 30 µs of work per rank on each call, the
        // four ranks' 120 µs first take 60 µs of the two cores.
        let m = |call_overhead, shared_cores| Model {
            tcp_overhead: 20e-6,
            shared_cores,
            call_overhead,
            ..Model::flat(Topology::from_hosts(&[0, 1, 2, 3]), 1e15, 0.0)
        };
        let t = run(
            CollKind::AllGather,
            Algo::Ring,
            vec![1; 4],
            &m(0.0, Some(2.0)),
        );
        assert!(close(t, 3.0 * 40e-6, 1e-4), "{t}");
        let t = run(
            CollKind::AllGather,
            Algo::Ring,
            vec![1; 4],
            &m(30e-6, Some(2.0)),
        );
        assert!(close(t, 60e-6 + 3.0 * 40e-6, 1e-4), "{t}");
        // Calls back to back: each one pays it (3 calls, a rank starting
        // the next as soon as its part of the one before is done).
        let topo = Topology::from_hosts(&[0, 1, 2, 3]);
        let b = |r: usize| {
            let args = CollArgs {
                kind: CollKind::AllGather,
                root: 0,
                counts: vec![1; 4],
            };
            build_on(&args, r, &topo, Algo::Ring).map_err(|e| e.to_string())
        };
        let one = simulate_calls(b, &m(30e-6, Some(2.0)), 4, 1)
            .unwrap()
            .seconds;
        let three = simulate_calls(b, &m(30e-6, Some(2.0)), 4, 3)
            .unwrap()
            .seconds;
        assert!(close(three, 3.0 * one, 0.05), "{one} {three}");
        // A core per rank (a real cluster): the spec's number does not apply.
        let t = run(CollKind::AllGather, Algo::Ring, vec![1; 4], &m(30e-6, None));
        assert!(close(t, 3.0 * 20e-6, 1e-4), "{t}");
    }

    #[test]
    fn a_shaped_link_passes_its_burst_at_peak_then_its_rate() {
        // 1 ms of a 125 MB/s link's credit (125 kB) passed at 1.5 GB/s: it
        // drains at 1.375 GB/s, so for 125e3 / 1.375e9 s at the peak, then
        // the rest of 4 MiB at the rate.
        let m = Model {
            gamma: 0.0,
            shaper: Some(Shaper {
                burst: 1e-3,
                peak: 1.5e9,
            }),
            ..Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6)
        };
        let t = run(CollKind::Broadcast, Algo::BinomialTree, vec![1 << 20], &m);
        let t1 = 125e3 / (1.5e9 - 1.25e8);
        let want = 50e-6 + t1 + ((4 << 20) as f64 - 1.5e9 * t1) / 1.25e8;
        assert!(close(t, want, 1e-9), "{t} vs {want}");
        // Back to back the root's next message leaves as the last one has
        // left (α overlaps it): the link never idles, so once the credit is
        // spent each call is the bytes at the rate.
        let o = simulate_calls(
            |r| {
                let args = CollArgs {
                    kind: CollKind::Broadcast,
                    root: 0,
                    counts: vec![1 << 20],
                };
                build_on(&args, r, &m.topo, Algo::BinomialTree).map_err(|e| e.to_string())
            },
            &m,
            4,
            40,
        )
        .unwrap();
        let last = o.call_ends[39] - o.call_ends[38];
        let want = (4 << 20) as f64 / 1.25e8;
        assert!(close(last, want, 1e-9), "{last} vs {want}");
        assert!(o.call_ends[0] < t * 1.001 && o.call_ends[0] > t * 0.999);
        // With a barrier before each call (as the bench's samples have),
        // the link idles while it runs (the broadcast's last α, then the
        // barrier's round trip) and the bucket gets some credit back: each
        // call after a barrier beats the rate, by at most a full bucket.
        let barrier = |r| {
            let args = CollArgs {
                kind: CollKind::Barrier,
                root: 0,
                counts: vec![],
            };
            build_on(&args, r, &m.topo, Algo::Dissemination).map_err(|e| e.to_string())
        };
        let bcast = |r| {
            let args = CollArgs {
                kind: CollKind::Broadcast,
                root: 0,
                counts: vec![1 << 20],
            };
            build_on(&args, r, &m.topo, Algo::BinomialTree).map_err(|e| e.to_string())
        };
        let program = [Unit::Gap, Unit::Call(0)].repeat(20);
        let o = simulate_program(|r, _| bcast(r), barrier, &program, &m, 4).unwrap();
        assert_eq!(o.call_ends.len(), 40);
        let timed = o.call_ends[39] - o.call_ends[38];
        assert!(
            timed < want * 0.999 && timed > want - 1e-3,
            "{timed} vs {want}"
        );
        assert!(o.call_ends[38] - o.call_ends[37] >= 50e-6 * 0.999);
    }

    #[test]
    fn a_ring_allgather_on_a_uniform_network_is_its_closed_form() {
        // n hosts, each step every host sends one block to the next.
        // Unsliced (a block under the ring's slice size is one message), a
        // step forwards what the last one delivered: (n - 1) (α + b / rate).
        // Sliced, the look-ahead forwards slice k while later ones arrive:
        // the links never idle, and only the last slice's α shows:
        // (n - 1) b / rate + α.
        for n in [3usize, 5, 8] {
            let hosts: Vec<usize> = (0..n).collect();
            let m = Model {
                gamma: 0.0,
                ..Model::flat(Topology::from_hosts(&hosts), 1.25e8, 50e-6)
            };
            let step = |block: usize| (block * 4) as f64 / 1.25e8;
            let t = run(CollKind::AllGather, Algo::Ring, vec![1000; n], &m);
            let want = (n - 1) as f64 * (50e-6 + step(1000));
            assert!(close(t, want, 1e-9), "n={n} whole: {t} vs {want}");
            let block = 1usize << 18;
            let t = run(CollKind::AllGather, Algo::Ring, vec![block; n], &m);
            let want = (n - 1) as f64 * step(block) + 50e-6;
            assert!(close(t, want, 1e-9), "n={n} sliced: {t} vs {want}");
        }
    }

    #[test]
    fn an_oversubscribed_uplink_is_shared_by_the_flows_crossing_it() {
        // Racks {0, 2} and {1, 3} (interleaved), 1 Gbit/s hosts, 250 Mbit/s
        // uplinks: the ring in rank order crosses each uplink with two
        // flows a step, the found order with one: twice as fast.
        let (fast, slow) = (1.25e8, 3.125e7);
        let racks = |topo: Topology| Model {
            group_of: vec![0, 1, 0, 1],
            group_out: vec![slow; 2],
            group_in: vec![slow; 2],
            gamma: 0.0,
            ..Model::flat(topo, fast, 0.0)
        };
        let rank_order = Topology::from_hosts(&[0, 1, 2, 3]);
        let found = rank_order.clone().with_host_order(&[0, 2, 1, 3]).unwrap();
        let block = 1usize << 20;
        let slow_t = run(
            CollKind::AllGather,
            Algo::Ring,
            vec![block; 4],
            &racks(rank_order),
        );
        let fast_t = run(
            CollKind::AllGather,
            Algo::Ring,
            vec![block; 4],
            &racks(found),
        );
        let want = 3.0 * (block * 4) as f64 / slow;
        assert!(close(fast_t, want, 1e-6), "{fast_t} vs {want}");
        assert!(
            close(slow_t, 2.0 * want, 1e-6),
            "{slow_t} vs {}",
            2.0 * want
        );
    }

    #[test]
    fn schedules_that_do_not_match_up_are_an_error() {
        use crate::schedule::{Phase, Span};
        let m = Model::flat(Topology::from_hosts(&[0, 1]), 1.25e8, 50e-6);
        let sched = |rank: usize, steps: Vec<Step>| Schedule {
            rank,
            nranks: 2,
            algo: Algo::Direct,
            phases: vec![Phase { steps }],
            scratch_len: 0,
        };
        let send = Step::Send {
            peer: 1,
            src: Span::input(0, 8),
        };
        let e = simulate(&[sched(0, vec![send]), sched(1, vec![])], &m, 4).unwrap_err();
        assert!(
            e.contains("from rank 0 to rank 1 has no matching receive"),
            "{e}"
        );
        let e = simulate(&[sched(0, vec![])], &m, 4).unwrap_err();
        assert!(e.contains("1 schedules for 2 ranks"), "{e}");
    }

    #[test]
    fn every_algorithm_finishes_on_mixed_hosts() {
        // No cyclic wait and a positive time for every allreduce algorithm
        // on 3 hosts x 2 ranks: the executor's matching agrees with the
        // generators'.
        let t = Topology::from_hosts(&[0, 0, 1, 1, 2, 2]);
        let m = Model::flat(t.clone(), 1.25e8, 50e-6);
        let args = CollArgs {
            kind: CollKind::AllReduce,
            root: 0,
            counts: vec![100_003],
        };
        for &a in crate::schedule::algos_for(CollKind::AllReduce) {
            if !crate::schedule::applicable_on(&args, &t, a) {
                continue;
            }
            let secs = run(CollKind::AllReduce, a, vec![100_003], &m);
            assert!(secs > 0.0 && secs.is_finite(), "{a:?}: {secs}");
        }
    }
}
