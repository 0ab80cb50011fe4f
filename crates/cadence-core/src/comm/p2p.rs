//! Point-to-point operations queued on the progress thread run together, like
//! a group call, so that `irecv` then `send` (or a ring of them) cannot
//! deadlock behind one another.

use super::{fnv1a, Inner, OpRequest, Shared, Task};
use crate::config::DebugLevel;
use crate::engine::Wait;
use crate::error::{ErrorKind, Result};
use crate::schedule::Algo;
use crate::transport::{OpMeta, RecvJob, SendJob, Sink, SinkMode, Source};
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
            job: usize,
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
                let meta = p2p_meta(&mut inner, self.rank, &task.req);
                let req = &task.req;
                self.record_start(seq, req, Algo::P2p, Some(task.enqueue_ns));
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
                    job,
                    finished: false,
                    task,
                });
            }
            let (progressed, pending) = match inner.engine.progress_round(&mut sends, &mut recvs) {
                Ok(x) => x,
                Err(k) => break Err(self.err(k, None)),
            };
            for a in active.iter_mut().filter(|a| !a.finished) {
                let done = if a.kind == CollKind::Send {
                    sends[a.job].1.done
                } else {
                    recvs[a.job].1.done
                };
                if done {
                    a.finished = true;
                    self.record_end(a.seq, &Ok(()));
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    a.task.done.finish(Ok(()));
                }
            }
            if !pending {
                break Ok(());
            }
            if progressed {
                wait.reset();
                continue;
            }
            let deadline = active
                .iter()
                .filter(|a| !a.finished)
                .map(|a| a.deadline)
                .min();
            let meta = sends
                .first()
                .map(|s| s.1.meta)
                .or(recvs.first().map(|r| r.1.meta));
            let (sig, seq) = meta.map_or((0, 0), |m| (m.sig, m.seq));
            if let Err(k) = inner.engine.backoff(
                &mut wait,
                &sends,
                &recvs,
                deadline.unwrap_or_else(Instant::now),
                sig,
                seq,
            ) {
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
