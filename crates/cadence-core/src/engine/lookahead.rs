//! The one-phase lookahead: while phase p's transfers are in flight, phase
//! p+1's (when it has no local steps) are admitted *held*, and each starts
//! as soon as it touches no memory that an unfinished transfer of an earlier
//! phase writes, or reads memory it would write. Messages to one peer still
//! go in order. So a ring sliced into pieces forwards piece k as soon as
//! piece k arrived, and the link does not idle at every phase boundary for
//! the last byte's round trip. Phases stay the unit of the schedule's
//! semantics (the verifier's model); lookahead only starts work earlier that
//! the phase order already allowed to be in flight.

use super::phases::{has_folds, has_local_steps, job_spans};
use crate::schedule::Phase;
use crate::transport::{RecvJob, SendJob};

/// Whether phase `next` may be admitted while phase `cur` is the oldest with
/// unfinished transfers: the current phase always (its local steps run now,
/// all earlier phases being complete); the one after it only if it has no
/// local steps and the current one no folds (which write until their phase
/// retires, unseen by the hazard check).
pub(super) fn admissible(phases: &[Phase], cur: usize, next: usize) -> bool {
    next < phases.len()
        && (next == cur
            || (next == cur + 1 && !has_local_steps(&phases[next]) && !has_folds(&phases[cur])))
}

/// The memory one transfer touches, for the lookahead's hazard check: a
/// send's source or a receive's destination, and a reducing receive's other
/// operand (which it reads), as addresses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JobRange {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) with: Option<usize>,
}

/// Releases the held jobs of phase `cur`+1 that conflict with no unfinished
/// job of phase `cur`: a send must not read what a receive still writes; a
/// receive must not write what a send still reads or a receive still writes
/// or reads, nor read what a receive still writes. Returns how many it
/// released.
pub(super) fn release_held(
    sends: &mut [(usize, SendJob)],
    recvs: &mut [(usize, RecvJob)],
    send_ranges: &[JobRange],
    recv_ranges: &[JobRange],
    first_send: &[usize],
    first_recv: &[usize],
    cur: usize,
) -> usize {
    let (cs, cr) = job_spans(cur, sends, recvs, first_send, first_recv);
    let (hs, hr) = job_spans(cur + 1, sends, recvs, first_send, first_recv);
    let send_range = |i: usize| &send_ranges[i];
    let recv_range = |i: usize| &recv_ranges[i];
    let hits = |a: usize, alen: usize, b: usize, blen: usize| {
        alen > 0 && blen > 0 && a < b + blen && b < a + alen
    };
    let mut released = 0;
    for i in hs {
        if !sends[i].1.held {
            continue;
        }
        let r = send_range(i);
        // An empty message carries no data, only order (a barrier's signal
        // must not leave before the previous round's arrived): it waits for
        // its whole phase to become current.
        if r.len == 0 {
            continue;
        }
        let blocked = cr.clone().any(|j| {
            !recvs[j].1.done && hits(r.start, r.len, recv_range(j).start, recv_range(j).len)
        });
        if !blocked {
            sends[i].1.held = false;
            released += 1;
        }
    }
    for i in hr {
        if !recvs[i].1.held {
            continue;
        }
        let r = *recv_range(i);
        if r.len == 0 {
            continue; // see above: released when its phase becomes current
        }
        let vs_send = cs.clone().any(|j| {
            !sends[j].1.done && hits(r.start, r.len, send_range(j).start, send_range(j).len)
        });
        let vs_recv = cr.clone().any(|j| {
            let b = recv_range(j);
            !recvs[j].1.done
                && (hits(r.start, r.len, b.start, b.len)
                    || r.with.is_some_and(|w| hits(w, r.len, b.start, b.len))
                    || b.with.is_some_and(|w| hits(r.start, r.len, w, b.len)))
        });
        if !vs_send && !vs_recv {
            recvs[i].1.held = false;
            released += 1;
        }
    }
    released
}
