//! Point-to-point operations queued on the progress thread run together, like
//! a group call, so that `irecv` then `send` (or a ring of them) cannot
//! deadlock behind one another.

use super::{fnv1a, Inner, OpRequest, Shared, Task};
use crate::config::DebugLevel;
use crate::engine::Wait;
use crate::error::{ErrorKind, Result};
use crate::schedule::Algo;
use crate::transport::{OpMeta, RecvJob, SendJob, Sink, SinkMode, Source, FRAME_DATA};
use crate::types::{CollKind, ElemOp};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

impl Shared {
    /// Runs queued sends and receives together, like a group call: each
    /// moves as soon as its peer is ready, so `irecv` then `send` (or a ring
    /// of `isend`/`irecv`) cannot deadlock behind one another. Sends and
    /// receives queued while the batch runs join it; the first queued
    /// collective ends the batch and is returned, to run after it.
    pub(super) fn execute_p2p_batch(&self, first: Task, rx: &mpsc::Receiver<Task>) -> Option<Task> {
        struct Active {
            task: Task,
            seq: u64,
            kind: CollKind,
            deadline: Instant,
            /// Index into `sends`/`recvs`; `None` for a receive from any
            /// source not yet matched to a sender.
            job: Option<usize>,
            finished: bool,
        }
        let mut inner = self.inner.lock().unwrap();
        inner.engine.watchers = Some(self.watchers.clone());
        let mut sends: Vec<(usize, SendJob)> = Vec::new();
        let mut recvs: Vec<(usize, RecvJob)> = Vec::new();
        let mut active: Vec<Active> = Vec::new();
        let mut stash: Option<Task> = None;
        let mut incoming = Some(first);
        let mut wait = Wait::new();
        let result: Result<()> = loop {
            // Take in every operation queued so far.
            while stash.is_none() {
                let task = match incoming.take() {
                    Some(t) => t,
                    None => match rx.try_recv() {
                        Ok(t) => t,
                        Err(_) => break,
                    },
                };
                if !is_p2p(&task.req) {
                    stash = Some(task);
                    break;
                }
                let checked = self
                    .validate(&task.req)
                    .map_err(|m| self.err(ErrorKind::InvalidArgument(m), None));
                let refused = checked.err().or_else(|| {
                    inner
                        .failed
                        .as_ref()
                        .map(|f| self.err(ErrorKind::Failed(f.to_string()), None))
                });
                if let Some(e) = refused {
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    task.done.finish(Err(e));
                    continue;
                }
                inner.op_seq += 1;
                let seq = inner.op_seq;
                self.record_start(seq, &task.req, Algo::P2p, Some(task.enqueue_ns));
                if is_any_source(&task.req) {
                    active.push(Active {
                        seq,
                        kind: CollKind::Recv,
                        deadline: Instant::now() + self.cfg.timeout,
                        job: None,
                        finished: false,
                        task,
                    });
                    continue;
                }
                let meta = p2p_meta(&mut inner, self.rank, &task.req);
                let req = &task.req;
                let es = req.dtype.size();
                let n = req.counts[0] * es;
                let job = if req.kind == CollKind::Send {
                    // SAFETY: the caller keeps the input alive and unmodified
                    // until this operation completes (Work holds it).
                    let src = unsafe { Source::new(req.bufs.input, n) };
                    sends.push((req.root, SendJob::new(meta, src)));
                    sends.len() - 1
                } else {
                    // SAFETY: the caller keeps the output alive and untouched
                    // by others until this operation completes.
                    let sink = unsafe {
                        Sink::new(req.bufs.output, n, SinkMode::Copy, req.dtype, ElemOp::Sum)
                    };
                    recvs.push((req.root, RecvJob::new(meta, sink)));
                    recvs.len() - 1
                };
                active.push(Active {
                    seq,
                    kind: req.kind,
                    deadline: Instant::now() + self.cfg.timeout,
                    job: Some(job),
                    finished: false,
                    task,
                });
            }
            // Receives from any source, in issue order: each takes the first
            // peer whose next message is a send to this rank. A peer with a
            // receive of this batch still in flight is skipped (its messages
            // arrive in order, and the earliest belongs to that receive).
            let mut matched = false;
            let mut peek_failed = None;
            for a in active.iter_mut().filter(|a| a.job.is_none()) {
                match self.match_any_source(&mut inner, &recvs) {
                    Ok(Some(peer)) => {
                        let req = &mut a.task.req;
                        req.root = peer;
                        let meta = p2p_meta(&mut inner, self.rank, req);
                        let n = req.counts[0] * req.dtype.size();
                        // SAFETY: as for the receives above.
                        let sink = unsafe {
                            Sink::new(req.bufs.output, n, SinkMode::Copy, req.dtype, ElemOp::Sum)
                        };
                        recvs.push((peer, RecvJob::new(meta, sink)));
                        a.job = Some(recvs.len() - 1);
                        a.task.done.set_source(peer);
                        matched = true;
                    }
                    Ok(None) => {}
                    Err(k) => {
                        peek_failed = Some(k);
                        break;
                    }
                }
            }
            if let Some(k) = peek_failed {
                break Err(self.err(k, None));
            }
            let (progressed, pending) = match inner.engine.progress_round(&mut sends, &mut recvs) {
                Ok(x) => x,
                Err(k) => break Err(self.err(k, None)),
            };
            let unmatched = active.iter().any(|a| a.job.is_none());
            for a in active.iter_mut().filter(|a| !a.finished) {
                let Some(job) = a.job else { continue };
                let done = if a.kind == CollKind::Send {
                    sends[job].1.done
                } else {
                    recvs[job].1.done
                };
                if done {
                    a.finished = true;
                    self.record_end(a.seq, &Ok(()));
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    a.task.done.finish(Ok(()));
                }
            }
            if !pending && !unmatched {
                break Ok(());
            }
            if progressed || matched {
                wait.reset();
                continue;
            }
            let now = Instant::now();
            if let Some(a) = active.iter().find(|a| a.job.is_none() && now > a.deadline) {
                break Err(self.err(
                    ErrorKind::NoSender {
                        secs: self.cfg.timeout.as_secs_f64(),
                        bytes: a.task.req.counts[0] * a.task.req.dtype.size(),
                    },
                    None,
                ));
            }
            let deadline = active
                .iter()
                .filter(|a| !a.finished && a.job.is_some())
                .map(|a| a.deadline)
                .min();
            let meta = sends
                .first()
                .map(|s| s.1.meta)
                .or(recvs.first().map(|r| r.1.meta));
            let (sig, seq) = meta.map_or((0, 0), |m| (m.sig, m.seq));
            // Only unmatched receives left: no transfer bounds the wait, the
            // check above does.
            let far = now + self.cfg.timeout;
            if let Err(k) =
                inner
                    .engine
                    .backoff(&mut wait, &sends, &recvs, deadline.unwrap_or(far), sig, seq)
            {
                break Err(self.err(k, None));
            }
        };
        inner.engine.watchers = None;
        if let Err(e) = result {
            inner.failed = Some(e.clone());
            inner.engine.broadcast_abort(&e);
            drop(inner);
            for a in active.into_iter().filter(|a| !a.finished) {
                let mut e = e.clone();
                e.op = Some((a.kind, a.seq));
                self.record_end(a.seq, &Err(e.clone()));
                if self.cfg.debug >= DebugLevel::Warn {
                    eprintln!("{e}");
                }
                self.pending.fetch_sub(1, Ordering::AcqRel);
                a.task.done.finish(Err(e));
            }
            self.dump_on_error();
        }
        stash
    }
}

impl Shared {
    /// The first peer (from this rank upwards, wrapping, so no peer is always
    /// served first) whose next message on its link is the next point-to-point
    /// send to this rank, among peers with no receive of `recvs` unfinished.
    fn match_any_source(
        &self,
        inner: &mut Inner,
        recvs: &[(usize, RecvJob)],
    ) -> std::result::Result<Option<usize>, ErrorKind> {
        let n = self.nranks;
        for k in 1..n {
            let peer = (self.rank + k) % n;
            if recvs.iter().any(|(p, j)| *p == peer && !j.done) {
                continue;
            }
            let want_seq = inner.p2p_rx[peer] + 1;
            let Some(link) = inner.engine.links[peer].as_mut() else {
                continue;
            };
            let Some(h) = link.peek_header()? else {
                continue;
            };
            if h.frame == FRAME_DATA
                && h.coll == CollKind::Send.code()
                && h.root as usize == self.rank
                && h.seq == want_seq
            {
                return Ok(Some(peer));
            }
        }
        Ok(None)
    }
}

/// Receives from any source carry this as their peer until matched.
pub const ANY_SOURCE: usize = usize::MAX;

pub(super) fn is_any_source(req: &OpRequest) -> bool {
    req.kind == CollKind::Recv && req.root == ANY_SOURCE
}

/// The wire identity of a send or receive. Point-to-point messages have their
/// own sequence per (source, destination) pair, so ranks that take no part do
/// not have to count them; both sides describe the message as a send.
pub(super) fn p2p_meta(inner: &mut Inner, rank: usize, req: &OpRequest) -> OpMeta {
    let send = req.kind == CollKind::Send;
    let (src, dst) = if send {
        (rank, req.root)
    } else {
        (req.root, rank)
    };
    let counter = if send {
        &mut inner.p2p_tx[req.root]
    } else {
        &mut inner.p2p_rx[req.root]
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
    }
}

pub(super) fn is_p2p(req: &OpRequest) -> bool {
    matches!(req.kind, CollKind::Send | CollKind::Recv)
}
