//! Running a schedule (see `schedule::ir` for the semantics): its phases in
//! order, each *admitted* (local steps run, transfers queued), moved by
//! [`Engine::drive`], and *retired* once its transfers and folds are done.
//! The lookahead (`lookahead.rs`) admits the next phase early, held.

use super::folds::{advance_folds, FoldJob};
use super::lookahead::{admissible, release_held, JobRange};
use super::memory::{ranges_overlap, Memory};
use super::{internal, prefers_stream, Buffers, Engine, Marks, Moment, Moving, OpCtx, Turn};
use crate::error::ErrorKind;
use crate::schedule::{Phase, Schedule, Span, Step};
use crate::transport::shm::{Inbox, Progress};
use crate::transport::{OpMeta, RecvJob, SendJob, Sink, SinkMode, Source};
use crate::types::{CollKind, ElemOp};
use std::time::{Duration, Instant};

/// One operation's transfers, kept in the engine across operations so that
/// the small-message path allocates nothing.
#[derive(Default)]
pub(super) struct Jobs {
    sends: Vec<(usize, SendJob)>,
    recvs: Vec<(usize, RecvJob)>,
    book: PhaseBook,
}

/// What the phases keep about their transfers besides the jobs themselves
/// (which [`Engine::drive`] moves): where each admitted phase's jobs start,
/// the memory each job touches, and the current phase's folds.
#[derive(Default)]
struct PhaseBook {
    send_ranges: Vec<JobRange>,
    recv_ranges: Vec<JobRange>,
    first_send: Vec<usize>,
    first_recv: Vec<usize>,
    /// The current phase's folds.
    folds: Vec<FoldJob>,
}

impl Jobs {
    fn clear(&mut self) {
        self.sends.clear();
        self.recvs.clear();
        let b = &mut self.book;
        b.send_ranges.clear();
        b.recv_ranges.clear();
        b.first_send.clear();
        b.first_recv.clear();
        b.folds.clear();
    }
}

impl Engine {
    /// Executes one rank's schedule. `deadline` bounds every wait.
    pub fn run(
        &mut self,
        sched: &Schedule,
        meta: &OpMeta,
        elem_op: ElemOp,
        bufs: Buffers,
        deadline: Instant,
        ctx: OpCtx,
    ) -> Result<(), ErrorKind> {
        let dtype = meta.dtype;
        let esize = dtype.size();
        self.op_yield = self.yield_budget(meta.coll, meta.count * esize as u64);
        self.op_stream = self.may_stream && prefers_stream(meta.coll, sched.algo);
        let need = sched.scratch_len * esize;
        if self.scratch.len() < need {
            self.scratch.resize(need, 0);
        }
        let mem = Memory {
            bufs,
            scratch: self.scratch.as_mut_ptr(),
            scratch_bytes: need,
            esize,
        };
        let mut jobs = std::mem::take(&mut self.jobs);
        jobs.clear();
        let result = self.run_phases(&sched.phases, meta, elem_op, &mem, deadline, ctx, &mut jobs);
        if let Some(ev) = ctx.evidence {
            let at = match result {
                Ok(()) => Moment::Finished,
                Err(_) => Moment::Failed,
            };
            ev.transfers(&jobs.sends, &jobs.recvs, at);
        }
        jobs.clear();
        self.jobs = jobs;
        result
    }

    /// The phases in order, with the one-phase lookahead (`lookahead.rs`):
    /// each turn of [`Engine::drive`] is a [`PhaseRun::turn`].
    #[allow(clippy::too_many_arguments)]
    fn run_phases(
        &mut self,
        phases: &[Phase],
        meta: &OpMeta,
        elem_op: ElemOp,
        mem: &Memory,
        deadline: Instant,
        ctx: OpCtx,
        jobs: &mut Jobs,
    ) -> Result<(), ErrorKind> {
        let Jobs { sends, recvs, book } = jobs;
        let mut run = PhaseRun {
            phases,
            meta,
            elem_op,
            mem,
            deadline,
            stream: self.op_stream,
            // Same-host peers that time out waiting for us read where we are.
            collective: !matches!(meta.coll, CollKind::Send | CollKind::Recv),
            cur: 0,
            next: 0,
            phase_t0: ctx.started.unwrap_or_else(Instant::now),
            held_left: 0,
        };
        self.finished_at = None;
        run.publish_progress(&self.inbox, true);
        let started = run.phase_t0;
        let result = self.drive(sends, recvs, ctx, started, |eng, sends, recvs| {
            run.turn(eng, sends, recvs, book)
        });
        run.publish_progress(&self.inbox, false);
        result.map_err(|e| self.in_phase(e, run.cur, run.collective, meta.seq))
    }

    /// Adds phase `p`'s duration to the busy time of the links it used,
    /// once per link (a phase that sends to and receives from one peer, or
    /// sends it several pieces, is one stretch of busy time for that link).
    #[allow(clippy::too_many_arguments)]
    fn account_phase(
        &mut self,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        first_send: &[usize],
        first_recv: &[usize],
        p: usize,
        took: Duration,
    ) {
        let busy = took.as_nanos() as u64;
        let (ss, rs) = job_spans(p, sends, recvs, first_send, first_recv);
        let peers = sends[ss]
            .iter()
            .map(|(q, _)| *q)
            .chain(recvs[rs].iter().map(|(q, _)| *q));
        for peer in peers.clone() {
            if self.mark(peer, Marks::CHARGED) {
                continue;
            }
            if let Some(l) = self.links.get(peer) {
                l.stats().busy_ns.add(busy);
            }
        }
        for peer in peers {
            self.marks[peer] &= !Marks::CHARGED;
        }
    }
}

/// Where one operation stands in its phases: the state its turns share.
struct PhaseRun<'a> {
    phases: &'a [Phase],
    meta: &'a OpMeta,
    elem_op: ElemOp,
    mem: &'a Memory,
    deadline: Instant,
    /// Whether this call's messages stream through shared memory
    /// ([`prefers_stream`]).
    stream: bool,
    /// Not point-to-point: the rank publishes where it is in its phases.
    collective: bool,
    /// The oldest phase with unfinished transfers.
    cur: usize,
    /// The next phase to admit.
    next: usize,
    /// When phase `cur` started.
    phase_t0: Instant,
    /// Held jobs of the lookahead phase (an upper bound: its step count).
    held_left: usize,
}

impl PhaseRun<'_> {
    /// One turn of [`Engine::drive`]: admit what may start, fold what has
    /// landed, retire finished phases, release held jobs that became safe.
    fn turn(
        &mut self,
        eng: &mut Engine,
        sends: &mut Vec<(usize, SendJob)>,
        recvs: &mut Vec<(usize, RecvJob)>,
        book: &mut PhaseBook,
    ) -> Result<Turn, ErrorKind> {
        self.admit(sends, recvs, book)?;
        // Folds reduce what has landed since the last turn.
        let folded = advance_folds(&mut book.folds, recvs, self.meta.dtype, self.elem_op);
        let retired = self.retire(eng, sends, recvs, book);
        if self.cur == self.phases.len() {
            if retired {
                eng.finished_at = Some(self.phase_t0);
            }
            return Ok(Turn::Finished);
        }
        if retired || folded {
            // Admit what may follow before moving anything; after a
            // fold, count it as progress (the wait starts over).
            return Ok(Turn::Again);
        }
        if self.next == self.cur + 2 && self.held_left > 0 {
            self.held_left -= release_held(
                sends,
                recvs,
                &book.send_ranges,
                &book.recv_ranges,
                &book.first_send,
                &book.first_recv,
                self.cur,
            );
        }
        Ok(Turn::Move(Moving {
            deadline: self.deadline,
            sig: self.meta.sig,
            seq: self.meta.seq,
            outside: false,
        }))
    }

    /// Admits every phase that may start now ([`admissible`]): the lookahead
    /// phase's transfers are queued held.
    fn admit(
        &mut self,
        sends: &mut Vec<(usize, SendJob)>,
        recvs: &mut Vec<(usize, RecvJob)>,
        book: &mut PhaseBook,
    ) -> Result<(), ErrorKind> {
        while admissible(self.phases, self.cur, self.next) {
            book.first_send.push(sends.len());
            book.first_recv.push(recvs.len());
            let phase = &self.phases[self.next];
            let held = self.next > self.cur;
            if held {
                self.held_left = phase.steps.len();
            }
            for step in &phase.steps {
                match *step {
                    Step::Copy { src, dst } => self.mem.copy(src, dst)?,
                    Step::Reduce { src, dst } => {
                        self.mem.reduce(self.meta.dtype, self.elem_op, src, dst)?
                    }
                    Step::Send { peer, src } => self.queue_send(peer, src, held, sends, book)?,
                    Step::Recv {
                        peer,
                        dst,
                        reduce_with,
                    } => self.queue_recv(peer, dst, reduce_with, held, recvs, book)?,
                    Step::Fold { .. } => {}
                }
            }
            // A phase with folds is never held (they are local steps),
            // so they are the current phase's: its receives are in
            // place now to be found.
            for step in &phase.steps {
                if let Step::Fold { src, dst } = *step {
                    let first = *book.first_recv.last().expect("pushed above");
                    let fold = FoldJob::new(
                        self.mem,
                        src,
                        dst,
                        first,
                        recvs,
                        &book.recv_ranges,
                        &book.folds,
                    )?;
                    book.folds.push(fold);
                }
            }
            self.next += 1;
        }
        Ok(())
    }

    fn queue_send(
        &self,
        peer: usize,
        src: Span,
        held: bool,
        sends: &mut Vec<(usize, SendJob)>,
        book: &mut PhaseBook,
    ) -> Result<(), ErrorKind> {
        let (p, n) = self.mem.locate(src)?;
        // SAFETY: `locate` bounds-checked the span; the schedule rules
        // (verified) keep it unwritten during its phase, and the hazard
        // check keeps it held while an earlier phase writes it.
        let source = unsafe { Source::new(p, n) };
        let mut job = SendJob::new(*self.meta, source);
        job.held = held;
        job.prefer_stream = self.stream;
        sends.push((peer, job));
        book.send_ranges.push(JobRange {
            start: p as usize,
            len: n,
            with: None,
        });
        Ok(())
    }

    fn queue_recv(
        &self,
        peer: usize,
        dst: Span,
        reduce_with: Option<Span>,
        held: bool,
        recvs: &mut Vec<(usize, RecvJob)>,
        book: &mut PhaseBook,
    ) -> Result<(), ErrorKind> {
        let (dtype, elem_op) = (self.meta.dtype, self.elem_op);
        let (d, n) = self.mem.locate(dst)?;
        let (mode, with) = match reduce_with {
            None => (SinkMode::Copy, None),
            Some(a) => {
                let (ap, an) = self.mem.locate(a)?;
                if an != n {
                    return Err(internal("reduce_with length differs from dst"));
                }
                if std::ptr::eq(ap, d) {
                    (SinkMode::ReduceInPlace, None)
                } else if ranges_overlap(ap, d, n) {
                    return Err(internal("reduce_with overlaps dst"));
                } else {
                    (SinkMode::ReduceWith(ap), Some(ap as usize))
                }
            }
        };
        // SAFETY: spans bounds-checked by `locate`; within a phase no other
        // step touches a receive's destination (verified schedule rule),
        // earlier phases' transfers are kept off it by the hazard check, and
        // `ReduceWith` operands are disjoint.
        let sink = unsafe { Sink::new(d, n, mode, dtype, elem_op) };
        let mut job = RecvJob::new(*self.meta, sink);
        job.held = held;
        recvs.push((peer, job));
        book.recv_ranges.push(JobRange {
            start: d as usize,
            len: n,
            with,
        });
        Ok(())
    }

    /// Retires every finished phase in order; the lookahead phase, if any,
    /// becomes the current one and nothing holds its jobs back any more.
    /// Returns whether any retired.
    fn retire(
        &mut self,
        eng: &mut Engine,
        sends: &mut [(usize, SendJob)],
        recvs: &mut [(usize, RecvJob)],
        book: &mut PhaseBook,
    ) -> bool {
        let mut retired = false;
        while self.cur < self.next
            && phase_done(self.cur, sends, recvs, &book.first_send, &book.first_recv)
            && book.folds.iter().all(FoldJob::finished)
        {
            book.folds.clear();
            let now = Instant::now();
            let took = now - self.phase_t0;
            eng.account_phase(
                sends,
                recvs,
                &book.first_send,
                &book.first_recv,
                self.cur,
                took,
            );
            self.phase_t0 = now;
            self.cur += 1;
            retired = true;
            self.held_left = 0;
            self.publish_progress(&eng.inbox, true);
            if self.cur < self.next {
                let (ss, rs) =
                    job_spans(self.cur, sends, recvs, &book.first_send, &book.first_recv);
                sends[ss].iter_mut().for_each(|(_, j)| j.held = false);
                recvs[rs].iter_mut().for_each(|(_, j)| j.held = false);
            }
        }
        retired
    }

    /// Tells same-host peers where this rank stands (collectives only).
    fn publish_progress(&self, inbox: &Option<Inbox>, running: bool) {
        if let (true, Some(inbox)) = (self.collective, inbox) {
            inbox.publish_progress(Progress {
                seq: self.meta.seq,
                running,
                phase: self.cur as u32,
            });
        }
    }
}

pub(super) fn has_local_steps(p: &Phase) -> bool {
    p.steps.iter().any(|s| !s.is_transfer())
}

pub(super) fn has_folds(p: &Phase) -> bool {
    p.steps.iter().any(|s| matches!(s, Step::Fold { .. }))
}

/// The index ranges of phase `p`'s jobs in the send and receive lists
/// (`first_*[p]` is where they start; the last admitted phase runs to the end).
pub(super) fn job_spans(
    p: usize,
    sends: &[(usize, SendJob)],
    recvs: &[(usize, RecvJob)],
    first_send: &[usize],
    first_recv: &[usize],
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let end = |firsts: &[usize], len: usize| firsts.get(p + 1).copied().unwrap_or(len);
    (
        first_send[p]..end(first_send, sends.len()),
        first_recv[p]..end(first_recv, recvs.len()),
    )
}

fn phase_done(
    p: usize,
    sends: &[(usize, SendJob)],
    recvs: &[(usize, RecvJob)],
    first_send: &[usize],
    first_recv: &[usize],
) -> bool {
    let (ss, rs) = job_spans(p, sends, recvs, first_send, first_recv);
    sends[ss].iter().all(|(_, j)| j.done) && recvs[rs].iter().all(|(_, j)| j.done)
}
