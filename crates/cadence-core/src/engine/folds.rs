//! Folds (`Step::Fold`): `dst ⊕= src` of the current phase, run over the
//! bytes of `src` as its receive lands them, in chain order behind the fold
//! or reducing receive before it into the same destination.

use super::internal;
use super::lookahead::JobRange;
use super::memory::{ranges_overlap, Memory};
use crate::error::ErrorKind;
use crate::reduce;
use crate::schedule::Span;
use crate::transport::RecvJob;
use crate::types::{DType, ElemOp};

/// What a fold's next element waits for besides its own receive: the
/// fold before it into the same destination, or the phase's reducing
/// receive into it.
#[derive(Clone, Copy, Debug)]
enum FoldAfter {
    Nothing,
    Fold(usize),
    Recv(usize),
}

/// A `Step::Fold` of the current phase: `dst ⊕= src` over the bytes
/// `done..` as they land (addresses and byte counts).
#[derive(Clone, Copy, Debug)]
pub(super) struct FoldJob {
    src: usize,
    dst: usize,
    len: usize,
    done: usize,
    /// The receive landing `src`, an index into the receive list.
    recv: usize,
    after: FoldAfter,
}

impl FoldJob {
    /// Finds the fold's receive (and its chain predecessor) among the
    /// receives of the phase starting at `first`, and the folds before it.
    pub(super) fn new(
        mem: &Memory,
        src: Span,
        dst: Span,
        first: usize,
        recvs: &[(usize, RecvJob)],
        recv_ranges: &[JobRange],
        folds: &[FoldJob],
    ) -> Result<FoldJob, ErrorKind> {
        let (s, n) = mem.locate(src)?;
        let (d, m) = mem.locate(dst)?;
        if n != m || ranges_overlap(s, d, n) {
            return Err(internal("fold operands differ in length or overlap"));
        }
        let (s, d) = (s as usize, d as usize);
        let recv = (first..recvs.len())
            .find(|&i| {
                let r = &recv_ranges[i];
                r.start == s && r.len == n && recvs[i].1.sink.copies()
            })
            .ok_or_else(|| internal("a fold without its phase's receive"))?;
        let after = if let Some(j) = folds.iter().rposition(|f| f.dst == d) {
            FoldAfter::Fold(j)
        } else if let Some(i) =
            (first..recvs.len()).find(|&i| recv_ranges[i].start == d && !recvs[i].1.sink.copies())
        {
            FoldAfter::Recv(i)
        } else {
            FoldAfter::Nothing
        };
        Ok(FoldJob {
            src: s,
            dst: d,
            len: n,
            done: 0,
            recv,
            after,
        })
    }

    /// Whether the fold has reduced all its bytes.
    pub(super) fn finished(&self) -> bool {
        self.done == self.len
    }
}

/// Runs every fold of the phase over the whole elements that have landed
/// and that its chain predecessor has finished. Returns whether any moved.
pub(super) fn advance_folds(
    folds: &mut [FoldJob],
    recvs: &[(usize, RecvJob)],
    dtype: DType,
    op: ElemOp,
) -> bool {
    let esize = dtype.size();
    let mut moved = false;
    for k in 0..folds.len() {
        let f = folds[k];
        if f.done == f.len {
            continue;
        }
        let mut limit = recvs[f.recv].1.landed();
        match f.after {
            FoldAfter::Nothing => {}
            FoldAfter::Fold(j) => limit = limit.min(folds[j].done),
            FoldAfter::Recv(i) => limit = limit.min(recvs[i].1.landed()),
        }
        limit -= limit % esize;
        if limit <= f.done {
            continue;
        }
        // SAFETY: both spans were bounds-checked by `locate` and do not
        // overlap (`FoldJob::new`). `src[done..limit]` has landed: its
        // receive writes it no more. `dst` is written during the phase only
        // by the folds of its chain and the one reducing receive into it
        // (verified schedule rule), and the chain order keeps this fold
        // behind both over `done..limit`; the engine's one thread runs them.
        let (from, into) = unsafe {
            (
                std::slice::from_raw_parts((f.src + f.done) as *const u8, limit - f.done),
                std::slice::from_raw_parts_mut((f.dst + f.done) as *mut u8, limit - f.done),
            )
        };
        reduce::reduce_inplace(dtype, op, into, from);
        folds[k].done = limit;
        moved = true;
    }
    moved
}
