//! Point-to-point send and receive.
//!
//! Terms:
//! - **peer**: the other rank, `CollArgs::root` on both sides.
//!
//! A send is one Send of the whole Input, a receive one Recv into the whole
//! Output. Both are emitted even when empty: a user's zero-length send still
//! pairs with the peer's receive and orders what comes after it.

use super::ir::{Span, Step};
use super::plan::Plan;

pub(crate) fn send(plan: &mut Plan, count: usize, peer: usize) {
    plan.phase().step(Step::Send {
        peer,
        src: Span::input(0, count),
    });
}

pub(crate) fn recv(plan: &mut Plan, count: usize, peer: usize) {
    plan.phase().step(Step::Recv {
        peer,
        dst: Span::output(0, count),
        reduce_with: None,
    });
}
