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
/// job of phase `cur`, by the rule the verifier checks within a phase
/// (`schedule::hazard`). Returns how many it released.
pub(super) fn release_held(
    sends: &mut [(usize, SendJob)],
    recvs: &mut [(usize, RecvJob)],
    send_ranges: &[JobRange],
    recv_ranges: &[JobRange],
    first_send: &[usize],
    first_recv: &[usize],
    cur: usize,
) -> usize {
    use crate::schedule::hazard::{may_start_ahead, Access, Region};
    let (cs, cr) = job_spans(cur, sends, recvs, first_send, first_recv);
    let (hs, hr) = job_spans(cur + 1, sends, recvs, first_send, first_recv);
    // Addresses: one memory, in bytes.
    let region = |start: usize, len: usize| Region::new(0, start, len);
    let send_access = |i: usize| {
        let r = &send_ranges[i];
        Access::Send {
            src: region(r.start, r.len),
        }
    };
    let recv_access = |i: usize| {
        let r = &recv_ranges[i];
        Access::Recv {
            dst: region(r.start, r.len),
            with: r.with.map(|w| region(w, r.len)),
        }
    };
    let may_start = |held: Access, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)]| {
        // Two reads never conflict: a held send skips the current sends.
        let cs = if held.writes() {
            cs.clone()
        } else {
            cs.end..cs.end
        };
        let unfinished_sends = cs.filter(|&j| !sends[j].1.done).map(send_access);
        let unfinished_recvs = cr.clone().filter(|&j| !recvs[j].1.done).map(recv_access);
        may_start_ahead(&held, unfinished_sends.chain(unfinished_recvs))
    };
    let mut released = 0;
    for i in hs {
        if sends[i].1.held && may_start(send_access(i), sends, recvs) {
            sends[i].1.held = false;
            released += 1;
        }
    }
    for i in hr {
        if recvs[i].1.held && may_start(recv_access(i), sends, recvs) {
            recvs[i].1.held = false;
            released += 1;
        }
    }
    released
}
