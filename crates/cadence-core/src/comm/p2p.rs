//! Point-to-point operations queued on the progress thread run together, like
//! a group call, so that `irecv` then `send` (or a ring of them) cannot
//! deadlock behind one another. They run through the engine's one loop
//! ([`Engine::drive`]); this file only decides which transfers exist.

use super::shared_links::Share;
use super::{fnv1a, recv_record, send_record, Inner, OpRequest, Shared, Task};
use crate::engine::{Engine, Evidence, Moment, Moving, OpCtx, Turn};
use crate::error::ErrorKind;
use crate::monitor::MsgRecord;
use crate::schedule::Algo;
use crate::transport::{OpMeta, RecvJob, SendJob, Sink, SinkMode, Source, FRAME_DATA};
use crate::types::{CollKind, ElemOp};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

/// Receives from any source carry this as their peer until matched.
pub const ANY_SOURCE: usize = usize::MAX;

pub(super) fn is_p2p(req: &OpRequest) -> bool {
    matches!(req.kind, CollKind::Send | CollKind::Recv)
}

pub(super) fn is_any_source(req: &OpRequest) -> bool {
    req.kind == CollKind::Recv && req.root == ANY_SOURCE
}

/// Point-to-point messages have their own sequence per (source,
/// destination) pair, so ranks that take no part do not have to count them
/// (and collectives' numbering is not shifted by them). Kept for the
/// peers messages went to or came from only.
#[derive(Default)]
pub(super) struct P2pSeqs {
    sent: HashMap<usize, u64>,
    received: HashMap<usize, u64>,
}

impl P2pSeqs {
    /// The sequence number of the last message received from `peer`.
    fn received_from(&self, peer: usize) -> u64 {
        self.received.get(&peer).copied().unwrap_or(0)
    }

    /// The wire identity of the next send to, or receive from, `req.root`;
    /// both sides describe the message as a send.
    pub(super) fn meta(&mut self, rank: usize, comm: u32, req: &OpRequest) -> OpMeta {
        let send = req.kind == CollKind::Send;
        let (src, dst, counter) = if send {
            (rank, req.root, self.sent.entry(req.root).or_default())
        } else {
            (req.root, rank, self.received.entry(req.root).or_default())
        };
        *counter += 1;
        let count = req.counts[0] as u64;
        OpMeta {
            coll: CollKind::Send,
            dtype: req.dtype,
            redop: 0,
            root: dst as u32,
            seq: *counter,
            sig: fnv1a([99, req.dtype.code() as u64, count, src as u64, dst as u64]),
            count,
            comm,
        }
    }
}

/// One queued operation of the batch.
struct Active {
    task: Task,
    /// Its record (`OpRecord::id`).
    id: u64,
    /// Its (source, destination) pair's sequence number; 0 until a receive
    /// from any source is matched.
    seq: u64,
    kind: CollKind,
    deadline: Instant,
    /// Index into `sends`/`recvs`; `None` for a receive from any source not
    /// yet matched to a sender.
    job: Option<usize>,
    finished: bool,
}

impl Shared {
    /// Runs queued sends and receives together, like a group call: each
    /// moves as soon as its peer is ready, so `irecv` then `send` (or a ring
    /// of `isend`/`irecv`) cannot deadlock behind one another. Sends and
    /// receives queued while the batch runs join it; the first queued
    /// collective ends the batch and is returned, to run after it.
    pub(super) fn execute_p2p_batch(
        &self,
        mut first: Task,
        rx: &mpsc::Receiver<Task>,
    ) -> Option<Task> {
        let mut guard = self.inner.lock().unwrap();
        // On shared links the batch holds them from the first operation's
        // turn, and takes in only operations issued right after it (each
        // takes the turn on): one issued after an operation of another
        // communicator ends the batch.
        let share = self.share.get();
        let mut held = first.ticket.take();
        if let (Some(share), Some(t)) = (share, held.as_mut()) {
            let deadline = Instant::now() + self.cfg.timeout;
            if let Err(k) = share.lend(&mut guard.engine, t, deadline, Some(&self.cancel)) {
                let e = self.err(k, None);
                self.fail_locked(&mut guard, &e);
                drop(guard);
                self.pending.fetch_sub(1, Ordering::AcqRel);
                first.done.finish(Err(e));
                return None;
            }
        }
        let Inner {
            engine,
            p2p,
            failed,
            op_seq,
            ..
        } = &mut *guard;
        let mut sends: Vec<(usize, SendJob)> = Vec::new();
        let mut recvs: Vec<(usize, RecvJob)> = Vec::new();
        let mut active: Vec<Active> = Vec::new();
        let mut stash: Option<Task> = None;
        let mut incoming = Some(first);
        let evidence = BatchEvidence { shared: self };
        let tag = engine.comm_tag;
        let ctx = OpCtx {
            interrupt: None,
            watchers: Some(&self.watchers),
            evidence: (self.cfg.record_messages > 0).then_some(&evidence as &dyn Evidence),
            started: None,
        };
        let result = engine.drive(
            &mut sends,
            &mut recvs,
            ctx,
            Instant::now(),
            |eng, sends, recvs| {
                // Finish what completed.
                for a in active.iter_mut().filter(|a| !a.finished) {
                    let done = match (a.kind, a.job) {
                        (_, None) => false,
                        (CollKind::Send, Some(j)) => sends[j].1.done,
                        (_, Some(j)) => recvs[j].1.done,
                    };
                    if done {
                        a.finished = true;
                        if let Some(j) = a.job {
                            self.record_message(a.id, a.kind, j, sends, recvs, true);
                        }
                        self.record_end(a.id, &Ok(()), None);
                        self.pending.fetch_sub(1, Ordering::AcqRel);
                        a.task.done.finish(Ok(()));
                    }
                }
                // Take in every operation queued so far.
                while stash.is_none() {
                    let task = match incoming.take() {
                        Some(t) => t,
                        None => match rx.try_recv() {
                            Ok(t) => t,
                            Err(_) => break,
                        },
                    };
                    let joins = match (&held, &task.ticket) {
                        (Some(h), Some(t)) => Share::follows(h, t),
                        // Queued before the links were shared, the batch
                        // holds none: a later operation waits its turn.
                        (None, Some(_)) => false,
                        _ => true,
                    };
                    if !is_p2p(&task.req) || !joins {
                        stash = Some(task);
                        break;
                    }
                    let mut task = task;
                    if let Some(mut t) = task.ticket.take() {
                        Share::take_in(&mut t);
                        held = Some(t);
                    }
                    let checked = self
                        .validate(&task.req)
                        .map_err(|m| self.err(ErrorKind::InvalidArgument(m), None));
                    let refused = checked.err().or_else(|| {
                        failed
                            .as_ref()
                            .map(|f| self.err(ErrorKind::failed_after(f), None))
                    });
                    if let Some(e) = refused {
                        self.pending.fetch_sub(1, Ordering::AcqRel);
                        task.done.finish(Err(e));
                        continue;
                    }
                    *op_seq += 1;
                    let id = *op_seq;
                    let meta =
                        (!is_any_source(&task.req)).then(|| p2p.meta(self.rank, tag, &task.req));
                    let started = self.record_start(
                        id,
                        meta.as_ref(),
                        &task.req,
                        Algo::P2p,
                        Some(task.enqueue_ns),
                    );
                    let job = meta.map(|m| add_job(m, id, &task.req, sends, recvs));
                    active.push(Active {
                        id,
                        seq: meta.map_or(0, |m| m.seq),
                        kind: task.req.kind,
                        deadline: started + self.cfg.timeout,
                        job,
                        finished: false,
                        task,
                    });
                }
                // Receives from any source, in issue order, each matched to the
                // first peer whose next message is a send to this rank.
                let mut matched = false;
                for a in active.iter_mut().filter(|a| a.job.is_none()) {
                    if let Some(peer) = match_any_source(eng, p2p, self.rank, recvs)? {
                        a.task.req.root = peer;
                        let meta = p2p.meta(self.rank, tag, &a.task.req);
                        self.record_matched(a.id, &meta, peer);
                        a.seq = meta.seq;
                        a.job = Some(add_job(meta, a.id, &a.task.req, sends, recvs));
                        a.task.done.set_source(peer);
                        matched = true;
                    }
                }
                if matched {
                    return Ok(Turn::Again);
                }
                if active.iter().all(|a| a.finished) {
                    return Ok(Turn::Finished);
                }
                let now = Instant::now();
                let unmatched = active.iter().filter(|a| a.job.is_none());
                if let Some(a) = unmatched.clone().find(|a| now > a.deadline) {
                    return Err(ErrorKind::NoSender {
                        secs: self.cfg.timeout.as_secs_f64(),
                        bytes: a.task.req.counts[0] * a.task.req.dtype.size(),
                    });
                }
                let outside = unmatched.count() > 0;
                let deadline = active
                    .iter()
                    .filter(|a| !a.finished && a.job.is_some())
                    .map(|a| a.deadline)
                    .min()
                    // Only unmatched receives left: the check above bounds them.
                    .unwrap_or(now + self.cfg.timeout);
                let meta = sends
                    .iter()
                    .find(|s| !s.1.done)
                    .map(|s| s.1.meta)
                    .or(recvs.iter().find(|r| !r.1.done).map(|r| r.1.meta));
                let (sig, seq) = meta.map_or((0, 0), |m| (m.sig, m.seq));
                Ok(Turn::Move(Moving {
                    deadline,
                    sig,
                    seq,
                    outside,
                }))
            },
        );
        let give_back = |inner: &mut Inner| {
            if let (Some(share), Some(t)) = (share, &held) {
                share.give_back(&mut inner.engine, t);
            }
        };
        if let Err(k) = result {
            let e = self.err(k, None);
            self.fail_locked(&mut guard, &e);
            give_back(&mut guard);
            drop(guard);
            for a in active.into_iter().filter(|a| !a.finished) {
                let mut e = e.clone();
                // A receive from any source never matched has no number.
                e.op = (a.seq > 0).then_some((a.kind, a.seq));
                if let Some(j) = a.job {
                    self.record_message(a.id, a.kind, j, &sends, &recvs, false);
                }
                self.record_end(a.id, &Err(e.clone()), None);
                self.warn_failed(&e);
                self.pending.fetch_sub(1, Ordering::AcqRel);
                a.task.done.finish(Err(e));
            }
            self.dump_on_error(&e);
        } else {
            give_back(&mut guard);
        }
        self.recorder.lock().unwrap().clear_live();
        stash
    }
}

impl Shared {
    /// Records the one message of point-to-point operation `id` (job `j`
    /// of `sends` or `recvs`, by its kind); one that finished (`ok`) before
    /// the batch waited long is not recorded (see `engine::Evidence`).
    fn record_message(
        &self,
        id: u64,
        kind: CollKind,
        j: usize,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        ok: bool,
    ) {
        let trace = if kind == CollKind::Send {
            &sends[j].1.trace
        } else {
            &recvs[j].1.trace
        };
        if self.cfg.record_messages == 0 || (ok && trace.first.is_none()) {
            return;
        }
        let mut rec = self.recorder.lock().unwrap();
        let base = rec.base;
        let m = if kind == CollKind::Send {
            send_record(base, &sends[j])
        } else {
            recv_record(base, &recvs[j])
        };
        rec.push_messages(id, std::iter::once(m));
    }
}

/// Records snapshots of a batch's messages while it waits long; each
/// transfer's `tag` says which operation it belongs to.
struct BatchEvidence<'a> {
    shared: &'a Shared,
}

impl Evidence for BatchEvidence<'_> {
    fn transfers(&self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)], at: Moment) {
        if at != Moment::Waiting {
            return; // each operation records its message when it ends
        }
        let mut rec = self.shared.recorder.lock().unwrap();
        let base = rec.base;
        let all = sends
            .iter()
            .map(|s| send_record(base, s))
            .chain(recvs.iter().map(|r| recv_record(base, r)))
            .filter(|m: &MsgRecord| m.op != 0);
        let now = rec.now_ns();
        rec.set_live(now, all);
    }
}

/// Adds the transfer of a send or (matched) receive of operation `id`;
/// returns its index in `sends` or `recvs`.
fn add_job(
    meta: OpMeta,
    id: u64,
    req: &OpRequest,
    sends: &mut Vec<(usize, SendJob)>,
    recvs: &mut Vec<(usize, RecvJob)>,
) -> usize {
    let n = req.counts[0] * req.dtype.size();
    if req.kind == CollKind::Send {
        // SAFETY: the request's buffers stay valid and unwritten until this
        // operation completes (`OpRequest`'s borrows or its keep-alive), and
        // the task holding the request outlives the batch.
        let src = unsafe { Source::new(req.bufs.input, n) };
        let mut job = SendJob::new(meta, src);
        job.trace.tag = id;
        sends.push((req.root, job));
        sends.len() - 1
    } else {
        // SAFETY: as above, for the output, which nothing else touches.
        let sink = unsafe { Sink::new(req.bufs.output, n, SinkMode::Copy, req.dtype, ElemOp::Sum) };
        let mut job = RecvJob::new(meta, sink);
        job.trace.tag = id;
        recvs.push((req.root, job));
        recvs.len() - 1
    }
}

/// The first peer (from this rank upwards, wrapping, so no peer is always
/// served first) whose next message on its link is the next point-to-point
/// send to this rank. A peer with a receive of this batch still in flight is
/// skipped: its messages arrive in order, and the earliest belongs to that
/// receive.
fn match_any_source(
    engine: &mut Engine,
    seqs: &P2pSeqs,
    rank: usize,
    recvs: &[(usize, RecvJob)],
) -> Result<Option<usize>, ErrorKind> {
    let n = engine.nranks;
    for k in 1..n {
        let peer = (rank + k) % n;
        if recvs.iter().any(|(p, j)| *p == peer && !j.done) {
            continue;
        }
        let peeked = match engine.links.get_mut(peer) {
            Some(link) => link.peek_header(),
            None => continue,
        };
        let h = match peeked {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(e) => return Err(engine.links.own_error(peer, e)),
        };
        if h.frame == FRAME_DATA
            && h.comm == engine.comm_tag
            && h.coll == CollKind::Send.code()
            && h.root as usize == rank
            && h.seq == seqs.received_from(peer) + 1
        {
            return Ok(Some(peer));
        }
    }
    Ok(None)
}
