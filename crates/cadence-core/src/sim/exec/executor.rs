//! The executor: every rank's phases, event by event. A rank enters a
//! phase (its local steps on its CPU), posts its transfers, admits the next
//! phase held when it may run ahead, releases held transfers as the current
//! phase's finish, and retires phases as their transfers are done.

use super::channel::{Chan, End};
use super::compile::{blocks, Compiled};
use super::fault::Hung;
use super::model::Model;
use super::program::Outcome;
use super::records::Recorder;
use crate::sim::flows::Flows;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// Per rank: the current phase, the admitted held one, and their
/// transfers' state.
#[derive(Default)]
pub(super) struct RankState {
    pub(super) cur: usize,
    /// Whether phase `cur` has posted (its local steps are done).
    pub(super) posted: bool,
    /// Whether phase `cur + 1` is admitted (held).
    pub(super) ahead: bool,
    pub(super) cur_open: usize,
    pub(super) ahead_open: usize,
    /// Per transfer of the current / held phase: done; for the held phase
    /// also the unfinished transfers of the current one that block it
    /// (`u32::MAX`: an empty message, released when its phase is current).
    pub(super) cur_done: Vec<bool>,
    pub(super) ahead_done: Vec<bool>,
    pub(super) ahead_block: Vec<u32>,
    /// Where each transfer of the current / held phase sits on its channel.
    pub(super) cur_at: Vec<(u32, u64)>,
    pub(super) ahead_at: Vec<(u32, u64)>,
    pub(super) cpu_free: f64,
    /// Whether the rank's work on the call that starts at phase `cur` is done.
    pub(super) call_paid: bool,
    /// The next unit of the program this rank has not finished.
    pub(super) unit: usize,
    /// When the rank's CPU may start its next message.
    pub(super) inject_free: f64,
    pub(super) finished: f64,
}

/// Events ordered by time, then by the order they were made (determinism).
struct Event(f64, u64, Kind);
#[derive(Clone, Copy)]
pub(super) enum Kind {
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

/// A flow id's mark for a message's start-up work on shared cores (the
/// rest of the id is its channel), as against the message on the wire.
pub(super) const CPU_WORK: usize = 1 << (usize::BITS - 1);
/// A flow id's mark for a rank's work on a call before its first phase,
/// on shared cores (the rest of the id is the rank).
pub(super) const CALL_WORK: usize = 1 << (usize::BITS - 2);

pub(super) struct Sim<'a> {
    pub(super) model: &'a Model,
    pub(super) es: f64,
    pub(super) progs: Vec<Compiled>,
    /// Per rank and phase: whether the phase has local steps, starts a
    /// call, or folds or follows a phase that does (then it is never
    /// admitted ahead).
    pub(super) has_local: Vec<Vec<bool>>,
    /// Per rank and phase: whether the phase is a call's first.
    pub(super) call_first: Vec<Vec<bool>>,
    /// Per rank, the phase index at which each unit of the program ends;
    /// per unit, when its last rank was done.
    pub(super) unit_ends: Vec<Vec<usize>>,
    pub(super) call_ends: Vec<f64>,
    pub(super) ranks: Vec<RankState>,
    pub(super) chans: Vec<Chan>,
    pub(super) chan_of: HashMap<(u32, u32), u32>,
    pub(super) flows: Flows,
    events: BinaryHeap<Event>,
    made: u64,
    pub(super) now: f64,
    pub(super) messages: u64,
    /// A recorded run's hooks and faults (None, the default: no cost but
    /// a branch).
    pub(super) rec: Option<Recorder>,
    pub(super) hung: Option<Hung>,
    /// A rank that enters every call late, and by how much.
    pub(super) late: Option<(usize, f64)>,
}

impl<'a> Sim<'a> {
    /// The simulation of `progs` (per rank its compiled program, and the
    /// phase at which each of the program's `units` ends) on `model`.
    pub(super) fn new(
        model: &'a Model,
        elem_size: usize,
        progs: Vec<Compiled>,
        unit_ends: Vec<Vec<usize>>,
        units: usize,
    ) -> Sim<'a> {
        let n = progs.len();
        Sim {
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
            call_ends: vec![0.0; units],
            chans: Vec::new(),
            chan_of: HashMap::new(),
            flows: Flows::shaped(model.links(), &model.buckets()),
            events: BinaryHeap::new(),
            made: 0,
            now: 0.0,
            messages: 0,
            rec: None,
            hung: None,
            late: None,
        }
    }
}

impl Sim<'_> {
    pub(super) fn push(&mut self, at: f64, kind: Kind) {
        self.made += 1;
        self.events.push(Event(at, self.made, kind));
    }

    pub(super) fn run(mut self) -> Result<Outcome, String> {
        self.run_events()?;
        let n = self.progs.len();
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

    /// Runs events until none is left: every rank finished, or the ones
    /// that did not wait on something that never comes.
    pub(super) fn run_events(&mut self) -> Result<(), String> {
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
        Ok(())
    }

    /// Rank r enters its current phase: local steps on its CPU, then Post.
    /// A call's first phase waits for the rank's work on the call, where
    /// the ranks share cores.
    pub(super) fn enter(&mut self, r: usize) {
        let call_work = self.model.call_overhead;
        let st = &mut self.ranks[r];
        // A late rank's own work before each call.
        let late = match self.late {
            Some((rank, delay)) if rank == r && self.call_first[r][st.cur] => delay,
            _ => 0.0,
        };
        if let Some(rec) = &mut self.rec {
            rec.enter(r, st.cur, &self.unit_ends[r], self.now + late);
        }
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
        let at = (self.now + late).max(st.cpu_free) + cost;
        st.cpu_free = at;
        st.posted = false;
        self.push(at, Kind::Post(r as u32));
    }

    /// One end of a transfer is done on its rank.
    pub(super) fn end_done(&mut self, e: End) -> Result<(), String> {
        let r = e.rank as usize;
        let p = e.phase as usize;
        let i = e.idx as usize - self.progs[r].first[p] as usize;
        if let Some(rec) = &mut self.rec {
            rec.done(r, e.idx as usize, self.now);
        }
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
            let b = if !x.carries_data() {
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
            let before = st.unit;
            Self::end_units(&self.unit_ends[r], st, &mut self.call_ends, now);
            if let Some(rec) = &mut self.rec {
                rec.finish(r, before..st.unit, now);
            }
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
