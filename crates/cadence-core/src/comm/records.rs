//! The flight recorder's side of an operation: its record opened and
//! closed, and its messages (every transfer's progress) as evidence.

use super::{OpRequest, Shared};
use crate::config::DebugLevel;
use crate::engine::{Evidence, Moment};
use crate::error::Result;
use crate::monitor::{Dir, MsgRecord, MsgState, OpRecord};
use crate::schedule::Algo;
use crate::transport::{JobTrace, OpMeta, RecvJob, SendJob};
use std::borrow::Cow;
use std::time::Instant;

impl Shared {
    /// Opens the record of operation `id`; `meta` is its wire identity
    /// (`None` for a receive from any source not yet matched). Returns when
    /// it started, which the caller's deadline counts from (one clock read
    /// for both: clock reads weigh on a small call's cost).
    pub(super) fn record_start(
        &self,
        id: u64,
        meta: Option<&OpMeta>,
        req: &OpRequest,
        algo: Algo,
        enqueue_ns: Option<u64>,
    ) -> Instant {
        let es = req.dtype.size();
        let count = crate::schedule::ir::elements(req.kind, &req.counts, self.nranks);
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
    pub(super) fn record_matched(&self, id: u64, meta: &OpMeta, peer: usize) {
        let mut rec = self.recorder.lock().unwrap();
        if let Some(r) = rec.get_mut(id) {
            r.seq = meta.seq;
            r.sig = meta.sig;
            r.root = peer;
        }
    }

    /// Closes the record of operation `id` and counts it in the totals: at
    /// `finished` (when its last phase retired, a clock read the engine made
    /// anyway), or now.
    pub(super) fn record_end(&self, id: u64, result: &Result<()>, finished: Option<Instant>) {
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

pub(super) fn send_record(base: Instant, (peer, j): &(usize, SendJob)) -> MsgRecord {
    let st = state(j.done, j.held);
    msg_record(base, *peer, Dir::Send, j.src.len(), j.moved(), st, &j.trace)
}

pub(super) fn recv_record(base: Instant, (peer, j): &(usize, RecvJob)) -> MsgRecord {
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
pub(super) struct OpEvidence<'a> {
    pub(super) shared: &'a Shared,
    pub(super) op: u64,
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
