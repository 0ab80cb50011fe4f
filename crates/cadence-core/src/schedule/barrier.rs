//! Barrier by dissemination.
//!
//! Terms:
//! - **signal**: a zero-length message; it carries no data, only the fact that
//!   its sender got this far.
//! - **round** k = 0, 1, … while 2^k < n: rank r signals r + 2^k and waits for
//!   the signal of r - 2^k (mod n), both in one phase.
//!
//! After round k a rank has heard, directly or through others, from the 2^(k+1)
//! ranks just below it, so after ceil(log2 n) rounds it has heard from all of
//! them: nobody leaves before everybody has arrived. The verifier checks
//! exactly that, with vector clocks.

use super::ir::{Span, Step};
use super::plan::Plan;

pub(crate) fn dissemination(plan: &mut Plan) {
    let (r, n) = (plan.rank, plan.nranks);
    let nothing = Span::output(0, 0);
    let mut dist = 1;
    while dist < n {
        plan.phase()
            .step(Step::Send {
                peer: (r + dist) % n,
                src: nothing,
            })
            .step(Step::Recv {
                peer: (r + n - dist) % n,
                dst: nothing,
                reduce_with: None,
            });
        dist *= 2;
    }
}
