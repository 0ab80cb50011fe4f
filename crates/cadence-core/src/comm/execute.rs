//! Running one operation: check its arguments, choose its algorithm, build
//! (or find) its schedule, number it as the peers will, and drive it through
//! the engine, recording it and failing the communicator if it fails.

use super::p2p::is_any_source;
use super::records::OpEvidence;
use super::shared_links::Ticket;
use super::{Inner, InterruptCheck, OpRequest, Shared};
use crate::choice;
use crate::config::DebugLevel;
use crate::engine::{Evidence, OpCtx};
use crate::error::{ErrorKind, Result};
use crate::schedule::{self, lower::Lowering, Algo, CollArgs, Schedule};
use crate::transport::OpMeta;
use crate::types::{CollKind, RedOp};
use std::sync::Arc;

/// Most call shapes the schedule and choice caches hold: past it they are
/// emptied, which bounds their memory.
const SCHEDULE_CACHE_MAX: usize = 4096;

/// A hash of `words` that is the same on every host and build: the
/// operations' signatures (`OpMeta::sig`) are made with it.
pub(crate) fn fnv1a(words: impl IntoIterator<Item = u64>) -> u64 {
    // FNV-1a-style over whole 64-bit words with a final avalanche: stable
    // across builds and hosts (unlike std's hasher), a few lines, and one
    // multiply per word — it runs on every operation.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h ^= h >> 32;
    h.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Shared {
    /// The algorithm for this call: the caller's, or the library's choice
    /// (remembered per call shape when a cost model makes choosing costly).
    pub(super) fn choose_algo(&self, req: &OpRequest, args: &CollArgs) -> Result<Algo> {
        let es = req.dtype.size();
        let select = || {
            choice::select_algo_on(&self.cfg.algo, args, &self.auto, es, req.algo)
                .map_err(|m| self.err(ErrorKind::InvalidArgument(m), None))
        };
        // Without a cost model choosing is a few comparisons: no cache. With
        // one, the cache is looked up by reference (no copy of the call's
        // counts); only a new call shape is copied in.
        let key = (es, req.algo);
        // An alltoall of one rank's own counts is chosen without the model:
        // nothing to remember, and its counts change from call to call.
        let cached = self.auto.model.is_some() && args.own_alltoall(self.nranks).is_none();
        let known = cached.then_some(()).and_then(|_| {
            let chosen = self.chosen.lock().unwrap();
            let shapes = chosen.get(args)?;
            shapes.iter().find(|(k, _)| *k == key).map(|(_, c)| *c)
        });
        let (algo, why) = match known {
            Some(c) => c,
            None if !cached => select()?,
            None => {
                let c = select()?;
                let mut chosen = self.chosen.lock().unwrap();
                if chosen.len() >= SCHEDULE_CACHE_MAX {
                    chosen.clear();
                }
                chosen.entry(args.clone()).or_default().push((key, c));
                c
            }
        };
        if self.cfg.debug >= DebugLevel::Info && self.rank == 0 {
            let bytes = choice::coll_bytes(args, self.nranks, es);
            if self.choices.first(req.kind, bytes, algo) {
                let line = choice::choice_line(req.kind, bytes, self.nranks, algo, &why);
                stderr_line!("cadence rank {} INFO: {line}", self.rank);
            }
        }
        Ok(algo)
    }

    /// Checks arguments that need no communication. Returns the collective's
    /// arguments.
    pub(super) fn validate(&self, req: &OpRequest) -> std::result::Result<CollArgs, String> {
        let n = self.nranks;
        let k = req.kind;
        let any_source = is_any_source(req);
        if any_source && n < 2 {
            return Err("recv from any source: no other rank in this communicator".into());
        }
        let args = CollArgs {
            kind: k,
            // Checked as a receive from some other rank.
            root: if any_source {
                (self.rank + 1) % n
            } else {
                req.root
            },
            counts: req.counts.clone(),
        };
        schedule::check_args(&args, n).map_err(|e| e.to_string())?;
        if matches!(k, CollKind::Send | CollKind::Recv) && req.root == self.rank {
            return Err(format!("{k}: rank {} cannot {k} to itself", self.rank));
        }
        if k.reduces() {
            if let RedOp::PremulSum(f) = req.op {
                if !req.dtype.is_float() {
                    return Err(format!(
                        "premul_sum needs a floating-point dtype, not {}",
                        req.dtype
                    ));
                }
                if !f.is_finite() {
                    return Err(format!("premul_sum factor {f} is not finite"));
                }
            }
        }
        let (ni, no) = args.buffer_lens(self.rank, n);
        let es = req.dtype.size();
        if req.has_input && req.bufs.input_bytes != ni * es {
            return Err(format!(
                "{k}: input has {} elements, expected {ni}",
                req.bufs.input_bytes / es
            ));
        }
        if !req.has_input && ni > 0 {
            return Err(format!(
                "{k}: this rank must pass an input of {ni} elements"
            ));
        }
        if req.has_output && req.bufs.output_bytes != no * es {
            return Err(format!(
                "{k}: output has {} elements, expected {no}",
                req.bufs.output_bytes / es
            ));
        }
        Ok(args)
    }

    /// Runs one operation; `enqueue_ns` is None when it was never queued;
    /// `ticket`: its turn on links shared with other communicators.
    pub(super) fn execute(
        &self,
        req: OpRequest,
        enqueue_ns: Option<u64>,
        interrupted: Option<InterruptCheck>,
        ticket: Option<Ticket>,
    ) -> Result<()> {
        let args = self
            .validate(&req)
            .map_err(|m| self.err(ErrorKind::InvalidArgument(m), None))?;
        let algo = self.choose_algo(&req, &args)?;
        let mut inner = self.inner.lock().unwrap();
        if let Some(f) = &inner.failed {
            return Err(self.err(ErrorKind::failed_after(f), None));
        }
        if let Some(why) = self.cancel.reason() {
            // Aborted, or a caller gave up on an earlier operation that
            // completed before it noticed; the peers may wait on this one.
            let e = self.err(why, None);
            self.fail_locked(&mut inner, &e);
            return Err(e);
        }
        // Everything that can refuse the call before it is numbered: a
        // refused call must not shift the numbering the peers expect.
        let (sched, lowering) = self.prepare(&mut inner, &req, &args, algo)?;
        inner.op_seq += 1;
        let id = inner.op_seq;
        let meta = self.number(&mut inner, &req, &args, algo);
        let started = self.record_start(id, Some(&meta), &req, algo, enqueue_ns);
        let evidence = OpEvidence {
            shared: self,
            op: id,
        };
        let ctx = OpCtx {
            interrupt: interrupted.as_ref(),
            // On the progress thread (enqueued), the caller may be busy
            // elsewhere.
            watchers: enqueue_ns.map(|_| &*self.watchers),
            evidence: (self.cfg.record_messages > 0).then_some(&evidence as &dyn Evidence),
            started: Some(started),
        };
        let deadline = started + self.cfg.timeout;
        let result = self.holding_links(&mut inner, ticket, deadline, true, |inner, lent| {
            let result = lent
                .and_then(|()| {
                    inner.engine.run_lowered(
                        &sched,
                        &lowering,
                        &meta,
                        req.op.elementwise(),
                        req.bufs,
                        deadline,
                        ctx,
                    )
                })
                .map_err(|k| self.err(k, Some((req.kind, meta.seq))));
            if let Err(e) = &result {
                if !matches!(e.kind, ErrorKind::InvalidArgument(_)) {
                    self.fail_locked(inner, e);
                }
            }
            result
        });
        let finished = inner.engine.take_finished_at();
        drop(inner);
        self.record_end(id, &result, finished);
        if let Err(e) = &result {
            self.warn_failed(e);
            self.dump_on_error(e);
        }
        result
    }

    /// The wire identity of the call about to run, which numbers it: the
    /// next collective sequence number, or the next message of its
    /// (source, destination) pair for a send or receive.
    fn number(&self, inner: &mut Inner, req: &OpRequest, args: &CollArgs, algo: Algo) -> OpMeta {
        if matches!(req.kind, CollKind::Send | CollKind::Recv) {
            let tag = inner.engine.comm_tag;
            return inner.p2p.meta(self.rank, tag, req);
        }
        inner.coll_seq += 1;
        let redop = if req.kind.reduces() { req.op.code() } else { 0 };
        // Every rank's signature is of the same arguments, except an
        // alltoall's own counts, which differ by rank: the receivers check
        // each message's length against theirs instead.
        let own = args.own_alltoall(self.nranks).is_some();
        let counts = if own { &[][..] } else { &args.counts[..] };
        let words = [
            req.kind.code() as u64,
            req.dtype.code() as u64,
            redop as u64,
            req.root as u64,
            algo as u64,
        ]
        .into_iter()
        .chain(own.then_some(self.nranks as u64))
        .chain(counts.iter().map(|&c| c as u64));
        OpMeta {
            coll: req.kind,
            dtype: req.dtype,
            redop,
            root: req.root as u32,
            seq: inner.coll_seq,
            sig: fnv1a(words),
            // Of an alltoall of its own counts, what this rank sends.
            count: match args.own_alltoall(self.nranks) {
                Some((_, send, _)) => send.iter().sum::<usize>() as u64,
                None => args.elements(self.nranks) as u64,
            },
            comm: inner.engine.comm_tag,
        }
    }

    /// The call's schedule (built once per call shape and algorithm) and
    /// what it needs around it (temporaries, scaling).
    fn prepare(
        &self,
        inner: &mut Inner,
        req: &OpRequest,
        args: &CollArgs,
        algo: Algo,
    ) -> Result<(Arc<Schedule>, Lowering)> {
        let n = self.nranks;
        let es = req.dtype.size();
        let (ni, no) = args.buffer_lens(self.rank, n);
        let own_block = match req.kind {
            CollKind::AllGather => args.counts[..self.rank].iter().sum::<usize>() * es,
            _ => 0,
        };
        let layout = req.bufs.layout(req.kind, own_block, req.has_output);
        let lowering = schedule::lower::lower(req.kind, req.op, req.root, self.rank, n, no, layout);
        debug_assert_eq!(req.bufs.input_bytes, ni * es);

        let cached = match &inner.last_schedule {
            // A training loop repeats the same call: compare before hashing.
            Some((a, al, s)) if *al == algo && a == args => Some(s.clone()),
            _ => inner
                .schedules
                .get(args)
                .and_then(|v| v.iter().find(|(a, _)| *a == algo))
                .map(|(_, s)| s.clone()),
        };
        let sched = match cached {
            Some(s) => s,
            None => {
                let s = Arc::new(
                    schedule::build_on(args, self.rank, &self.auto.topo, algo)
                        .map_err(|e| self.err(ErrorKind::InvalidArgument(e.to_string()), None))?,
                );
                if self.cfg.debug >= DebugLevel::Info && args.own_alltoall(n).is_none() {
                    stderr_line!(
                        "cadence rank {} INFO: {} of {} x {} over {n} ranks: algorithm {} ({} phases)",
                        self.rank,
                        req.kind,
                        args.elements(n),
                        req.dtype,
                        algo.name(),
                        s.phases.len()
                    );
                }
                // An alltoall of its own counts is built again for other
                // counts (O(n) a call); only the last one is kept.
                if args.own_alltoall(n).is_none() {
                    if inner.schedules.len() >= SCHEDULE_CACHE_MAX {
                        inner.schedules.clear();
                    }
                    inner
                        .schedules
                        .entry(args.clone())
                        .or_default()
                        .push((algo, s.clone()));
                }
                s
            }
        };
        if !matches!(&inner.last_schedule, Some((a, al, _)) if *al == algo && a == args) {
            inner.last_schedule = Some((args.clone(), algo, sched.clone()));
        }
        Ok((sched, lowering))
    }
}
