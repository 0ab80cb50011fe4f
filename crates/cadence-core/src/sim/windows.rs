//! What a simulated job's ranks would publish to the live slowness judge:
//! the library's calls run on the model with a fault injected, the run's
//! simulated time cut into windows, and per window each rank's record as
//! the core's `dump_window` writes it (`comm::dump`): the operations that
//! completed in the window (the newest [`WINDOW_OPS`]), and of their
//! messages only the timed receives the judge reads.

use super::dumps::{
    ns, pid, CallInfo, Clock, Dump, Link, Op, Peer, BASE_UNIX_NS, COMM_ID, MESSAGE_CAPACITY,
    TIMEOUT_S,
};
use super::exec::{Fault, RankRecord, Recorded, XferState};
use super::run::Cluster;
use crate::comm::DUMP_VERSION;
use crate::schedule::Algo;
use crate::types::CollKind;
use serde::Serialize;

/// Operations a window's record keeps at most, the newest (the live
/// watchdog's `WINDOW_OPS`).
pub const WINDOW_OPS: usize = 128;
/// Operation records a rank keeps (the core's default flight recorder).
const FLIGHT_RECORDER: usize = 1024;

/// How a run's simulated time is cut into windows, and what a window's
/// records keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cut {
    /// Each window's length (s).
    pub window_s: f64,
    /// How far into window 0 the job starts (s, under `window_s`): live
    /// windows are cut on the wall clock, which a job starts at any point
    /// of. Window k is [k w - phase, (k + 1) w - phase).
    pub phase_s: f64,
    /// Receives a record keeps: done, timed, of at least this many bytes
    /// (`Window::keeps`).
    pub min_recv_bytes: u64,
    /// How long after a window's end its records are taken (s): operations
    /// that end meanwhile push their messages into the ring too, and the
    /// ring forgets the oldest.
    pub dump_after_s: f64,
}

impl Cut {
    /// Windows of `window_s` from the job's start, records taken at each
    /// window's end.
    pub fn new(window_s: f64, min_recv_bytes: u64) -> Cut {
        Cut {
            window_s,
            phase_s: 0.0,
            min_recv_bytes,
            dump_after_s: 0.0,
        }
    }

    fn check(&self) -> Result<(), String> {
        if !(self.window_s.is_finite() && self.window_s > 0.0) {
            return Err(format!("a window must be > 0 s, not {}", self.window_s));
        }
        if !(self.phase_s >= 0.0 && self.phase_s < self.window_s) {
            return Err(format!(
                "a window's phase must be in [0, {}) s, not {}",
                self.window_s, self.phase_s
            ));
        }
        if !(self.dump_after_s.is_finite() && self.dump_after_s >= 0.0) {
            return Err(format!(
                "records are taken ≥ 0 s after a window, not {}",
                self.dump_after_s
            ));
        }
        Ok(())
    }

    /// Window k's bounds in simulated seconds, end excluded.
    fn bounds(&self, k: usize) -> (f64, f64) {
        let lo = k as f64 * self.window_s - self.phase_s;
        (lo, lo + self.window_s)
    }
}

/// A recorded run of the library's calls, cut into windows on demand.
pub struct SimWindows {
    pub algo: Algo,
    /// Seconds until the last rank finished (of those that did).
    pub seconds: f64,
    /// How many calls each rank made (fewer for a rank that stopped).
    pub calls: usize,
    run: Recorded,
    call: CallInfo,
    host_of: Vec<usize>,
    /// Per rank, the peers it exchanges messages with (its links), ascending.
    peers: Vec<Vec<usize>>,
}

impl Cluster {
    /// Every rank makes `calls` calls of `kind` on a full buffer of `count`
    /// elements of `elem_size` bytes, the algorithm the library's choice,
    /// with `fault` injected; the run, ready to be cut into windows.
    pub fn windows(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        calls: usize,
        fault: Fault,
    ) -> Result<SimWindows, String> {
        let (run, call) = self.run_recorded(kind, count, elem_size, calls, fault)?;
        let topo = &self.model.topo;
        let peers = run
            .ranks
            .iter()
            .map(|rec| {
                // Every call runs the same schedule: the first names them all.
                let mut v: Vec<usize> = rec.transfers(0).map(|t| t.peer).collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .collect();
        Ok(SimWindows {
            algo: call.algo,
            seconds: run.seconds,
            calls: calls.max(1),
            host_of: (0..topo.nranks()).map(|r| topo.host_of(r)).collect(),
            peers,
            run,
            call,
        })
    }

    /// As [`Cluster::windows`], cut into windows of `window_s` from the
    /// job's start: per window, per rank, the JSON text of the record it
    /// would publish (None: it completed no operation in the window).
    #[allow(clippy::too_many_arguments)]
    pub fn window_records(
        &self,
        kind: CollKind,
        count: usize,
        elem_size: usize,
        calls: usize,
        fault: Fault,
        window_s: f64,
        min_recv_bytes: u64,
    ) -> Result<Vec<Vec<Option<String>>>, String> {
        let w = self.windows(kind, count, elem_size, calls, fault)?;
        let cut = Cut::new(window_s, min_recv_bytes);
        (0..w.count(&cut)?).map(|k| w.window(k, &cut)).collect()
    }
}

impl SimWindows {
    /// How many windows the run's operations end in (the first from the
    /// job's start to the last operation's end, empty ones included).
    pub fn count(&self, cut: &Cut) -> Result<usize, String> {
        cut.check()?;
        let last = self
            .run
            .ranks
            .iter()
            .flat_map(|rec| rec.calls.iter().filter_map(|s| s.finished))
            .fold(0.0, f64::max);
        Ok(((last + cut.phase_s) / cut.window_s).floor() as usize + 1)
    }

    /// How many transfers rank r makes in call c (what the call pushes
    /// into its message ring).
    #[cfg(test)]
    pub(super) fn transfer_count(&self, r: usize, c: usize) -> usize {
        self.run.ranks[r].transfer_count(c)
    }

    /// Window k: per rank the text of its record, None when it completed
    /// no operation in the window. Made in parallel over the machine's
    /// cores.
    pub fn window(&self, k: usize, cut: &Cut) -> Result<Vec<Option<String>>, String> {
        cut.check()?;
        Ok(super::per_rank(self.run.ranks.len(), |r| {
            self.text(r, k, cut)
        }))
    }

    /// Rank r's record of window k.
    fn text(&self, r: usize, k: usize, cut: &Cut) -> Option<String> {
        let rec = &self.run.ranks[r];
        let (lo, hi) = cut.bounds(k);
        let dump_s = hi + cut.dump_after_s;
        let ended = |c: usize| rec.calls[c].finished.filter(|&f| f < dump_s);
        // A rank's calls end in order: those ended by the dump are a prefix.
        let pushed = (0..rec.calls.len())
            .take_while(|&c| ended(c).is_some())
            .count();
        let started = (0..rec.calls.len())
            .take_while(|&c| rec.calls[c].entered.is_some_and(|e| e < dump_s))
            .count();
        let in_window: Vec<usize> = (started.saturating_sub(FLIGHT_RECORDER)..pushed)
            .filter(|&c| ended(c).is_some_and(|f| lo <= f && f < hi))
            .collect();
        if in_window.is_empty() {
            return None;
        }
        let kept_from = kept_from(rec, pushed);
        let ops = in_window[in_window.len().saturating_sub(WINDOW_OPS)..]
            .iter()
            .map(|&c| {
                let span = rec.calls[c];
                let entered = ns(span.entered.expect("an ended call was entered"));
                let messages = (c >= kept_from).then(|| timed_receives(rec, c, cut));
                Op {
                    id: c + 1,
                    seq: c + 1,
                    sig: &self.call.sig,
                    collective: self.call.kind.name(),
                    comm_id: COMM_ID,
                    algo: self.call.algo.name(),
                    dtype: self.call.dtype,
                    redop: if self.call.kind.reduces() { "sum" } else { "" },
                    root: 0,
                    count: self.call.count,
                    bytes: self.call.count * self.call.elem_size as u64,
                    enqueue_ns: entered,
                    start_ns: entered,
                    end_ns: ns(span.finished.expect("ended")),
                    status: "ok",
                    messages_state: if messages.is_some() {
                        "final"
                    } else {
                        "dropped"
                    },
                    messages,
                    messages_at_ns: None,
                }
            })
            .collect();
        let host = |q: usize| format!("h{}", self.host_of[q]);
        let mut listed = self.peers[r].clone();
        listed.push(r);
        listed.sort_unstable();
        let dump = Dump {
            format: "cadence-dump",
            version: DUMP_VERSION,
            job: "sim",
            comm_id: COMM_ID,
            rank: r,
            nranks: self.run.ranks.len(),
            host: host(r),
            hostname: host(r),
            pid: pid(r),
            peers: listed
                .into_iter()
                .map(|q| Peer {
                    rank: q,
                    host: host(q),
                    pid: pid(q),
                    addr: "",
                })
                .collect(),
            timeout_s: TIMEOUT_S,
            base_unix_ns: BASE_UNIX_NS,
            dump_ns: ns(dump_s),
            clock: Clock {
                offset_ns: 0,
                error_ns: 0,
                method: "same host",
            },
            reason: "slowness window",
            failure: None,
            links: Some(self.links(r, started, dump_s)),
            total_ops: started,
            record_capacity: FLIGHT_RECORDER,
            message_capacity: MESSAGE_CAPACITY,
            ops,
        };
        Some(serde_json::to_string(&dump).expect("a dump has string keys only"))
    }

    /// Rank r's counters per peer: what moved by `at` in its first
    /// `started` calls.
    fn links(&self, r: usize, started: usize, at: f64) -> Vec<Link> {
        let mine = &self.peers[r];
        let mut links: Vec<Link> = mine
            .iter()
            .map(|&q| Link {
                peer: q,
                transport: match self.host_of[q] == self.host_of[r] {
                    true => "shm",
                    false => "tcp",
                },
                bytes_sent: 0,
                bytes_recv: 0,
                msgs_sent: 0,
                msgs_recv: 0,
            })
            .collect();
        let rec = &self.run.ranks[r];
        for c in 0..started {
            for t in rec
                .transfers(c)
                .filter(|t| t.done_at.is_some_and(|d| d < at))
            {
                let Ok(i) = mine.binary_search(&t.peer) else {
                    continue;
                };
                let l = &mut links[i];
                match t.send {
                    true => (l.bytes_sent, l.msgs_sent) = (l.bytes_sent + t.bytes, l.msgs_sent + 1),
                    false => {
                        (l.bytes_recv, l.msgs_recv) = (l.bytes_recv + t.bytes, l.msgs_recv + 1)
                    }
                }
            }
        }
        links
    }
}

/// The first of a rank's `pushed` ended calls whose messages are still in
/// its message ring: each call pushes all its transfers when it ends, and
/// the ring keeps the newest MESSAGE_CAPACITY (a call whose messages did
/// not all stay shows none: "dropped").
fn kept_from(rec: &RankRecord, pushed: usize) -> usize {
    let mut held = 0;
    for c in (0..pushed).rev() {
        held += rec.transfer_count(c);
        if held > MESSAGE_CAPACITY {
            return c + 1;
        }
    }
    0
}

/// Call c's receives that the window keeps: done, of at least
/// `min_recv_bytes`, their last progress after their first (a message that
/// was there already moves in one go: no rate in it).
fn timed_receives(rec: &RankRecord, c: usize, cut: &Cut) -> Vec<WinMsg> {
    rec.transfers(c)
        .filter(|t| !t.send && t.state == XferState::Done && t.bytes >= cut.min_recv_bytes)
        .filter_map(|t| {
            let (first, last) = (ns(t.first_at?), ns(t.done_at?));
            (last > first).then_some(WinMsg {
                peer: t.peer,
                dir: "recv",
                state: "done",
                bytes: t.bytes,
                moved: t.bytes,
                first_ns: first,
                last_ns: last,
            })
        })
        .collect()
}

/// One message as the core records it (`MsgRecord`).
#[derive(Serialize)]
struct WinMsg {
    peer: usize,
    dir: &'static str,
    state: &'static str,
    bytes: u64,
    moved: u64,
    first_ns: u64,
    last_ns: u64,
}
