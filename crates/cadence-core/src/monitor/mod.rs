//! Always-on operation records and the flight recorder.
//!
//! Every operation gets one [`OpRecord`] (a few words, written at enqueue,
//! start and end); the last `capacity` records stay in a ring buffer that can
//! be dumped as JSON on demand, on error and on timeout. Cost on the hot path:
//! one uncontended mutex and a few stores per operation.
//!
//! Besides, every message an operation moved leaves a [`MsgRecord`] (peer,
//! direction, bytes expected and moved, first and last progress, done or
//! not) in a second ring of fixed size (`CADENCE_RECORD_MESSAGES` messages):
//! the evidence `cadence doctor` matches across ranks. Messages are written
//! once per operation, when it ends, if it waited a while or failed (an
//! operation done within a few µs keeps only its record: see
//! `engine::Evidence`); an operation that waits long also publishes a
//! snapshot of its messages so far (the *live* messages), so a dump taken
//! meanwhile shows which are still pending.
//!
//! What the rings forget, [`totals`] keeps: per collective kind, operations
//! and bytes since the communicator was created and a histogram of their
//! durations, counted as each operation ends (Prometheus metrics read them).

pub mod totals;

use crate::types::CollKind;
use serde::{Serialize, Serializer};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use totals::OpTotals;

#[derive(Clone, Debug, Serialize)]
pub struct OpRecord {
    /// The number that matches one operation across ranks: for
    /// collectives the communicator's collective sequence number (which
    /// point-to-point traffic does not shift), for sends and receives the
    /// sequence number of the (source, destination) pair. 0 for a receive
    /// from any source not yet matched.
    pub seq: u64,
    /// Position among all operations of this communicator (1, 2, ...):
    /// unique on this rank, not comparable across ranks.
    pub id: u64,
    /// Hash of the call's full arguments (what the wire header carries);
    /// equal on every rank that made the same call.
    #[serde(serialize_with = "hex")]
    pub sig: u64,
    pub collective: &'static str,
    /// The collective as a kind (`collective` is its name).
    #[serde(skip)]
    pub kind: CollKind,
    pub algo: &'static str,
    pub dtype: &'static str,
    pub redop: &'static str,
    /// The root; for a send or receive, the peer.
    pub root: usize,
    pub count: u64,
    pub bytes: u64,
    /// Nanoseconds since the communicator was created.
    pub enqueue_ns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// "running", "ok" or the error text (static strings on the hot path:
    /// no allocation per operation).
    pub status: Cow<'static, str>,
    /// Where this operation's messages start in the message ring (a count
    /// of all messages ever recorded) and how many there are.
    #[serde(skip)]
    pub msgs_from: u64,
    #[serde(skip)]
    pub nmsgs: u32,
}

fn hex<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:016x}"))
}

impl OpRecord {
    pub fn is_running(&self) -> bool {
        self.status == "running"
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    Send,
    Recv,
}

/// Where a message stood when it was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MsgState {
    /// Every byte moved.
    Done,
    /// Allowed to move, not finished: waiting on the peer (or the link).
    Pending,
    /// Admitted but held back behind this rank's own earlier transfers
    /// (lookahead): not yet offered to the peer.
    Held,
}

/// One message of one operation, as this rank's engine saw it. Times are
/// nanoseconds since the communicator was created, taken when a progress
/// call returned having moved some of the message (for a send: handed to
/// the transport — the peer's ring or the kernel's socket buffer; for a
/// receive: consumed from it).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MsgRecord {
    #[serde(skip)]
    pub op: u64,
    pub peer: u32,
    pub dir: Dir,
    pub state: MsgState,
    /// Payload bytes the message carries in all.
    pub bytes: u64,
    /// Payload bytes moved so far.
    pub moved: u64,
    /// First and last progress (`None`: nothing moved yet, not even the
    /// header).
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
}

/// The messages of one record, as a dump shows them.
pub enum Messages<'a> {
    /// Recorded when the operation ended.
    Final(std::collections::vec_deque::Iter<'a, MsgRecord>, usize),
    /// A snapshot of a running operation, taken at `at_ns`.
    Live(&'a [MsgRecord], u64),
    /// Recorded, but overwritten since by later operations' messages.
    Dropped,
    /// None kept: the operation finished before it waited long (its
    /// record's times bound its messages), message records are off, or it
    /// is running and has not waited long enough to publish a snapshot.
    None,
}

/// How far back [`Recorder::progress`] looks for a running operation (a
/// point-to-point batch larger than this shows its newer members only).
const PROGRESS_LOOKBACK: usize = 64;

/// The oldest running operation: its sequence number, collective, and when
/// it started (ns since the communicator was created).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunningOp {
    pub seq: u64,
    pub collective: &'static str,
    pub start_ns: u64,
}

/// See [`Recorder::progress`].
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub total_ops: u64,
    pub running: Option<RunningOp>,
    pub now_ns: u64,
}

pub struct Recorder {
    pub base: Instant,
    /// Wall-clock time of `base` (ns since the Unix epoch), for lining up
    /// dumps of different ranks.
    pub base_unix_ns: u64,
    ops: VecDeque<OpRecord>,
    capacity: usize,
    pub total_ops: u64,
    msgs: VecDeque<MsgRecord>,
    msg_capacity: usize,
    /// Messages ever recorded (the ring holds the last `msgs.len()`).
    msgs_total: u64,
    /// Snapshot of running operations' messages, and when it was taken.
    live: Vec<MsgRecord>,
    live_ns: u64,
    /// Every operation ended so far, by kind (what the ring forgets).
    totals: OpTotals,
    /// Operations whose record left the ring while they still ran (more
    /// running at once than the ring holds: a large point-to-point batch),
    /// so that their end still counts: (id, kind, bytes, start_ns).
    evicted_running: Vec<(u64, CollKind, u64, u64)>,
}

/// Wall-clock nanoseconds since the Unix epoch.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Recorder {
    /// `capacity` operations and `msg_capacity` messages (0: no message
    /// records).
    pub fn new(capacity: usize, msg_capacity: usize) -> Recorder {
        Recorder {
            base: Instant::now(),
            base_unix_ns: unix_ns(),
            ops: VecDeque::with_capacity(capacity.min(4096)),
            capacity: capacity.max(1),
            total_ops: 0,
            msgs: VecDeque::with_capacity(msg_capacity.min(4096)),
            msg_capacity,
            msgs_total: 0,
            live: Vec::new(),
            live_ns: 0,
            totals: OpTotals::default(),
            evicted_running: Vec::new(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Nanoseconds since `base` at `t` (0 before it).
    pub fn ns_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Whether messages are recorded at all.
    pub fn records_messages(&self) -> bool {
        self.msg_capacity > 0
    }

    /// Adds a record (its `id` must grow with every push).
    pub fn push(&mut self, rec: OpRecord) {
        if self.ops.len() == self.capacity {
            if let Some(old) = self.ops.pop_front().filter(|r| r.is_running()) {
                let kept = (old.id, old.kind, old.bytes, old.start_ns);
                self.evicted_running.push(kept);
            }
        }
        self.total_ops += 1;
        self.ops.push_back(rec);
    }

    /// Ends operation `id` now with `status` ("ok" when `ok`, else the
    /// error's text) and counts it in the totals. Returns its record, if
    /// still in the buffer. One search from the back (O(1) when it is the
    /// latest) and a few adds: no allocation.
    pub fn end(&mut self, id: u64, ok: bool, status: Cow<'static, str>) -> Option<&OpRecord> {
        let now = self.now_ns();
        self.end_at(id, now, ok, status)
    }

    /// As [`Recorder::end`], at `now` (nanoseconds since `base`).
    pub fn end_at(
        &mut self,
        id: u64,
        now: u64,
        ok: bool,
        status: Cow<'static, str>,
    ) -> Option<&OpRecord> {
        if let Some(r) = self.ops.iter_mut().rev().find(|r| r.id == id) {
            r.end_ns = now;
            r.status = status;
            let dur = now.saturating_sub(r.start_ns);
            self.totals.add(r.kind, r.bytes, dur, ok);
            return Some(r);
        }
        if let Some(i) = self.evicted_running.iter().position(|e| e.0 == id) {
            let (_, kind, bytes, start) = self.evicted_running.swap_remove(i);
            self.totals.add(kind, bytes, now.saturating_sub(start), ok);
        }
        None
    }

    /// Forgets the totals counted so far (the communicator's own set-up
    /// operations).
    pub fn reset_totals(&mut self) {
        self.totals = OpTotals::default();
    }

    /// Totals of every operation ended so far.
    pub fn totals(&self) -> &OpTotals {
        &self.totals
    }

    /// The oldest operation still running: (kind, seq, start_ns); the seq
    /// is 0 when its record left the ring.
    pub fn oldest_running(&self) -> Option<(CollKind, u64, u64)> {
        let evicted = self.evicted_running.iter().min_by_key(|e| e.3);
        if let Some(&(_, kind, _, start)) = evicted {
            return Some((kind, 0, start));
        }
        let r = self.ops.iter().find(|r| r.is_running())?;
        Some((r.kind, r.seq, r.start_ns))
    }

    /// The record of operation `id`, if still in the buffer.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut OpRecord> {
        // Records are pushed in id order, so the wanted one is found from
        // the back in O(1) in the common case.
        self.ops.iter_mut().rev().find(|r| r.id == id)
    }

    pub fn records(&self) -> impl Iterator<Item = &OpRecord> {
        self.ops.iter()
    }

    /// Where this rank stands, for a watchdog that polls it: how many
    /// operations started, and the oldest one still running (cheap: only
    /// the newest records are looked at, since operations end in order
    /// except within one point-to-point batch).
    pub fn progress(&self) -> Progress {
        let newest = self.ops.len().saturating_sub(PROGRESS_LOOKBACK);
        let running = self
            .ops
            .iter()
            .skip(newest)
            .find(|r| r.is_running())
            .map(|r| RunningOp {
                seq: r.seq,
                collective: r.collective,
                start_ns: r.start_ns,
            });
        Progress {
            total_ops: self.total_ops,
            running,
            now_ns: self.now_ns(),
        }
    }

    /// Records the final messages of operation `op` (all at once: one
    /// operation's messages sit together in the ring). Allocates nothing
    /// once the ring is full.
    pub fn push_messages(&mut self, op: u64, msgs: impl Iterator<Item = MsgRecord>) {
        if self.msg_capacity == 0 {
            return;
        }
        let from = self.msgs_total;
        for m in msgs {
            if self.msgs.len() == self.msg_capacity {
                self.msgs.pop_front();
            }
            self.msgs.push_back(MsgRecord { op, ..m });
            self.msgs_total += 1;
        }
        let n = (self.msgs_total - from) as u32;
        if let Some(r) = self.get_mut(op) {
            r.msgs_from = from;
            r.nmsgs = n;
        }
    }

    /// Replaces the snapshot of running operations' messages (taken at
    /// `at_ns`); the vector's allocation is reused.
    pub fn set_live(&mut self, at_ns: u64, msgs: impl Iterator<Item = MsgRecord>) {
        if self.msg_capacity == 0 {
            return;
        }
        self.live.clear();
        self.live.extend(msgs);
        self.live_ns = at_ns;
    }

    /// Forgets the snapshot (its operations have recorded final messages).
    pub fn clear_live(&mut self) {
        self.live.clear();
    }

    /// The messages of `rec` as a dump shows them.
    pub fn messages(&self, rec: &OpRecord) -> Messages<'_> {
        if rec.nmsgs > 0 {
            let oldest = self.msgs_total - self.msgs.len() as u64;
            if rec.msgs_from < oldest {
                return Messages::Dropped;
            }
            let start = (rec.msgs_from - oldest) as usize;
            let n = rec.nmsgs as usize;
            return Messages::Final(self.msgs.range(start..start + n), n);
        }
        if rec.is_running() {
            let first = self.live.iter().position(|m| m.op == rec.id);
            if let Some(i) = first {
                let n = self.live[i..].iter().take_while(|m| m.op == rec.id).count();
                return Messages::Live(&self.live[i..i + n], self.live_ns);
            }
        }
        Messages::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64) -> OpRecord {
        OpRecord {
            id,
            seq: id,
            sig: 0xabc,
            collective: "allreduce",
            kind: CollKind::AllReduce,
            algo: "ring",
            dtype: "float32",
            redop: "sum",
            root: 0,
            count: 1,
            bytes: 4,
            enqueue_ns: 0,
            start_ns: 0,
            end_ns: 0,
            status: Cow::Borrowed("running"),
            msgs_from: 0,
            nmsgs: 0,
        }
    }

    #[test]
    fn progress_names_the_oldest_running_operation() {
        let mut r = Recorder::new(8, 0);
        assert!(r.progress().running.is_none());
        for id in 1..=3 {
            let mut o = rec(id);
            o.start_ns = id * 10;
            if id == 1 {
                o.status = Cow::Borrowed("ok");
            }
            r.push(o);
        }
        let p = r.progress();
        assert_eq!(p.total_ops, 3);
        let run = p.running.unwrap();
        assert_eq!((run.seq, run.start_ns), (2, 20));
        r.get_mut(2).unwrap().status = Cow::Borrowed("ok");
        r.get_mut(3).unwrap().status = Cow::Borrowed("ok");
        assert!(r.progress().running.is_none());
    }

    fn msg(peer: u32, moved: u64) -> MsgRecord {
        MsgRecord {
            op: 0,
            peer,
            dir: Dir::Send,
            state: MsgState::Done,
            bytes: 8,
            moved,
            first_ns: Some(1),
            last_ns: Some(2),
        }
    }

    #[test]
    fn messages_stay_with_their_operation_until_overwritten() {
        let mut r = Recorder::new(8, 5);
        for id in 1..=3u64 {
            r.push(rec(id));
            r.push_messages(id, (0..2).map(|p| msg(p, id)));
            r.get_mut(id).unwrap().status = Cow::Borrowed("ok");
        }
        // 6 messages into a ring of 5: op 1 lost its first, so it is dropped.
        let ops: Vec<OpRecord> = r.records().cloned().collect();
        assert!(matches!(r.messages(&ops[0]), Messages::Dropped));
        for op in &ops[1..] {
            match r.messages(op) {
                Messages::Final(it, 2) => {
                    assert!(it.clone().all(|m| m.moved == op.id && m.op == op.id));
                    assert_eq!(it.map(|m| m.peer).collect::<Vec<_>>(), [0, 1]);
                }
                _ => panic!("op {} lost its messages", op.id),
            }
        }
    }

    #[test]
    fn a_running_operation_shows_its_live_snapshot() {
        let mut r = Recorder::new(4, 16);
        r.push(rec(1));
        let op = r.records().next().unwrap().clone();
        assert!(matches!(r.messages(&op), Messages::None));
        r.set_live(
            77,
            [msg(1, 3), msg(2, 0)]
                .into_iter()
                .map(|m| MsgRecord { op: 1, ..m }),
        );
        match r.messages(&op) {
            Messages::Live(m, 77) => assert_eq!(m.len(), 2),
            _ => panic!("no live messages"),
        }
        r.push_messages(1, [msg(1, 8)].into_iter());
        r.clear_live();
        r.get_mut(1).unwrap().status = Cow::Borrowed("ok");
        let op = r.records().next().unwrap().clone();
        assert!(matches!(r.messages(&op), Messages::Final(_, 1)));
    }

    #[test]
    fn totals_outlive_the_ring() {
        let mut r = Recorder::new(2, 0);
        for id in 1..=5u64 {
            r.push(rec(id));
            assert!(r.end(id, id != 3, Cow::Borrowed("x")).is_some());
        }
        // Two running at once in a ring of one: the first is evicted
        // before it ends and still counts.
        let mut r2 = Recorder::new(1, 0);
        r2.push(rec(1));
        r2.push(rec(2));
        assert_eq!(r2.oldest_running().map(|o| o.1), Some(0));
        assert!(r2.end(1, true, Cow::Borrowed("ok")).is_none());
        assert_eq!(r2.oldest_running().map(|o| o.1), Some(2));
        assert!(r2.end(2, true, Cow::Borrowed("ok")).is_some());
        assert_eq!(r2.oldest_running(), None);
        assert_eq!(r2.totals().of(CollKind::AllReduce).ok, 2);

        let t = r.totals().of(CollKind::AllReduce);
        assert_eq!((t.ok, t.failed, t.bytes), (4, 1, 16));
        assert_eq!(t.buckets.iter().sum::<u64>(), 4);
        assert_eq!(r.records().count(), 2);
        assert_eq!(r.records().last().unwrap().status, "x");
        assert!(r.records().all(|o| o.end_ns >= o.start_ns));
    }

    #[test]
    fn no_messages_when_turned_off() {
        let mut r = Recorder::new(4, 0);
        r.push(rec(1));
        r.push_messages(1, [msg(1, 8)].into_iter());
        let op = r.records().next().unwrap().clone();
        assert!(!r.records_messages());
        assert!(matches!(r.messages(&op), Messages::None));
    }
}
