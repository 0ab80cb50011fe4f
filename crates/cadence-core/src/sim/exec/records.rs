//! What a recorded run ([`super::simulate_recorded`]) keeps per rank: when
//! it entered and finished each call, when each of its transfers first
//! moved and when it completed, and where the unfinished ones stood when
//! the run ended, which is what a real rank's flight recorder would hold
//! when a fault hits.

use super::compile::Compiled;
use super::executor::{RankState, Sim};

/// Where a transfer stood when the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XferState {
    Done,
    /// Posted (its phase is current) or released ahead: waiting on the
    /// peer or the link.
    Pending,
    /// Admitted ahead but blocked by the rank's own earlier transfers, or
    /// in a phase the rank has not reached.
    Held,
}

/// One transfer of a rank's program, as the run left it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transfer {
    pub peer: usize,
    pub send: bool,
    pub bytes: u64,
    /// Seconds when it first moved on this rank (a send: its first byte
    /// left; a receive: its first bytes were taken in), None if it did not.
    pub first_at: Option<f64>,
    /// Seconds when it completed on this rank (a send: its last byte
    /// left; a receive: it was taken in), None if it did not.
    pub done_at: Option<f64>,
    pub state: XferState,
}

/// When a rank entered one call (its first phase) and finished it (its
/// last), in simulated seconds; None: not (yet).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallSpan {
    pub entered: Option<f64>,
    pub finished: Option<f64>,
}

/// Where a rank stood when the run ended: its current phase, whether it
/// posted, and per transfer of the admitted phase whether it was released.
struct AtEnd {
    cur: usize,
    posted: bool,
    ahead_released: Option<Vec<bool>>,
}

/// One rank's record of a recorded run.
pub struct RankRecord {
    /// Per call of the run (a stopped rank's calls after it stopped stay
    /// empty).
    pub calls: Vec<CallSpan>,
    prog: Compiled,
    /// The phase at which each of the rank's calls ends.
    ends: Vec<usize>,
    first_at: Vec<f64>,
    done_at: Vec<f64>,
    at_end: AtEnd,
    elem_size: f64,
}

impl RankRecord {
    /// Whether the rank got through its whole program.
    pub fn finished(&self) -> bool {
        self.at_end.cur >= self.prog.nphases()
    }

    /// The phases of call `call` (empty for a call the rank does not make).
    fn phases(&self, call: usize) -> std::ops::Range<usize> {
        match self.ends.get(call) {
            Some(&end) => call.checked_sub(1).map_or(0, |c| self.ends[c])..end,
            None => 0..0,
        }
    }

    /// How many transfers call `call` makes on this rank.
    pub fn transfer_count(&self, call: usize) -> usize {
        let phases = self.phases(call);
        phases.map(|p| self.prog.span(p).len()).sum()
    }

    /// The transfers of call `call`, in the rank's program order (empty for
    /// a call the rank does not make).
    pub fn transfers(&self, call: usize) -> impl Iterator<Item = Transfer> + '_ {
        self.phases(call).flat_map(move |p| {
            self.prog
                .span(p)
                .enumerate()
                .map(move |(j, idx)| self.transfer(p, j, idx))
        })
    }

    /// Transfer `idx` of the program, the `j`-th of its phase `p`.
    fn transfer(&self, p: usize, j: usize, idx: usize) -> Transfer {
        let x = &self.prog.xfers[idx];
        let done = self.done_at[idx];
        let first = self.first_at[idx];
        let at = &self.at_end;
        let state = if !done.is_nan() || p < at.cur {
            XferState::Done
        } else if p == at.cur && at.posted {
            XferState::Pending
        } else {
            match &at.ahead_released {
                Some(released) if p == at.cur + 1 && released[j] => XferState::Pending,
                _ => XferState::Held,
            }
        };
        Transfer {
            peer: x.peer as usize,
            send: x.send,
            bytes: (x.len as f64 * self.elem_size) as u64,
            first_at: known(first),
            done_at: known(done),
            state,
        }
    }
}

/// What a recorded run found.
pub struct Recorded {
    pub ranks: Vec<RankRecord>,
    /// Seconds until the last rank finished (of those that did).
    pub seconds: f64,
    /// When the run stalled (its last event), when some rank could not
    /// finish; None when every rank did.
    pub stalled_at: Option<f64>,
    /// The ranks that did not finish their program.
    pub unfinished: Vec<usize>,
    /// Messages that crossed the modeled network.
    pub messages: u64,
}

/// The executor's hooks while recording: per rank and call when it was
/// entered and finished (NaN: not), and per transfer when it first moved
/// and when it completed.
pub(super) struct Recorder {
    entered: Vec<Vec<f64>>,
    finished: Vec<Vec<f64>>,
    /// Per rank, the first call whose entry is not marked yet.
    next_entry: Vec<usize>,
    first_at: Vec<Vec<f64>>,
    done_at: Vec<Vec<f64>>,
}

impl Recorder {
    /// For `progs` of `calls` calls each (fewer for a stopped rank).
    pub(super) fn new(progs: &[Compiled], calls: usize) -> Recorder {
        let n = progs.len();
        Recorder {
            entered: vec![vec![f64::NAN; calls]; n],
            finished: vec![vec![f64::NAN; calls]; n],
            next_entry: vec![0; n],
            first_at: progs
                .iter()
                .map(|p| vec![f64::NAN; p.xfers.len()])
                .collect(),
            done_at: progs
                .iter()
                .map(|p| vec![f64::NAN; p.xfers.len()])
                .collect(),
        }
    }

    /// Rank r enters phase `cur` at `at`: the calls that start there (or
    /// before, empty ones) are entered.
    pub(super) fn enter(&mut self, r: usize, cur: usize, ends: &[usize], at: f64) {
        let next = &mut self.next_entry[r];
        while *next < ends.len() && next.checked_sub(1).map_or(0, |c| ends[c]) <= cur {
            let e = &mut self.entered[r][*next];
            if e.is_nan() {
                *e = at;
            }
            *next += 1;
        }
    }

    /// Rank r finished `calls` at `at` (an empty call is entered then too).
    pub(super) fn finish(&mut self, r: usize, calls: std::ops::Range<usize>, at: f64) {
        for c in calls {
            self.finished[r][c] = at;
            if self.entered[r][c].is_nan() {
                self.entered[r][c] = at;
            }
        }
    }

    /// Transfer `idx` of rank r first moved at `at`.
    pub(super) fn first(&mut self, r: usize, idx: usize, at: f64) {
        self.first_at[r][idx] = at;
    }

    pub(super) fn done(&mut self, r: usize, idx: usize, at: f64) {
        self.done_at[r][idx] = at;
    }
}

fn known(t: f64) -> Option<f64> {
    (!t.is_nan()).then_some(t)
}

impl Sim<'_> {
    /// The run's records, once it ran as far as it could.
    pub(super) fn into_recorded(self, rec: Recorder) -> Recorded {
        let now = self.now;
        let messages = self.messages;
        let Recorder {
            entered,
            finished,
            first_at,
            done_at,
            ..
        } = rec;
        let mut seconds: f64 = 0.0;
        let mut unfinished = Vec::new();
        let parts = self.progs.into_iter().zip(self.unit_ends).zip(self.ranks);
        let ranks: Vec<RankRecord> = parts
            .zip(
                entered
                    .into_iter()
                    .zip(finished)
                    .zip(first_at.into_iter().zip(done_at)),
            )
            .enumerate()
            .map(
                |(r, (((prog, ends), st), ((entered, finished), (first_at, done_at))))| {
                    let done = st.cur >= prog.nphases();
                    if done {
                        seconds = seconds.max(st.finished);
                    } else {
                        unfinished.push(r);
                    }
                    let calls = entered
                        .iter()
                        .zip(&finished)
                        .enumerate()
                        .map(|(c, (&e, &f))| match c < ends.len() && done {
                            // A rank whose program has no phase left has
                            // finished every call of it, empty ones too.
                            true => CallSpan {
                                entered: Some(known(e).unwrap_or(st.finished)),
                                finished: Some(known(f).unwrap_or(st.finished)),
                            },
                            false => CallSpan {
                                entered: known(e),
                                finished: known(f),
                            },
                        })
                        .collect();
                    RankRecord {
                        calls,
                        prog,
                        ends,
                        first_at,
                        done_at,
                        at_end: at_end(&st),
                        elem_size: self.es,
                    }
                },
            )
            .collect();
        Recorded {
            ranks,
            seconds,
            stalled_at: (!unfinished.is_empty()).then_some(now),
            unfinished,
            messages,
        }
    }
}

fn at_end(st: &RankState) -> AtEnd {
    AtEnd {
        cur: st.cur,
        posted: st.posted,
        ahead_released: st
            .ahead
            .then(|| st.ahead_block.iter().map(|&b| b == 0).collect()),
    }
}
