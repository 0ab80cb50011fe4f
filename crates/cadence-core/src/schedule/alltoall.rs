//! All-to-all: pairwise and direct.
//!
//! Terms:
//! - **send block** d of rank r: the `args.alltoall_block(r, d, n)` elements of r's Input
//!   meant for rank d, at their displacement in Input.
//! - **receive block** s of rank r: the `args.alltoall_block(s, r, n)` elements rank s
//!   sends to r, at their displacement in Output.
//! - **round** k = 1 … n-1 (pairwise): rank r sends its send block r+k to rank
//!   r+k and receives its receive block r-k from rank r-k. Every rank sends to
//!   one peer and receives from one per round, so no rank is flooded.
//!
//! A rank's block for itself is a local copy, done in the first phase. Direct
//! posts all rounds at once in one phase: one latency, but n-1 concurrent
//! messages per rank.

use super::ir::{Buf, CollArgs, Span};
use super::plan::Plan;

/// The send and receive blocks of one rank.
struct Layout {
    /// `(offset, len)` in Input of the block for rank d, by d.
    send: Vec<(usize, usize)>,
    /// `(offset, len)` in Output of the block from rank s, by s.
    recv: Vec<(usize, usize)>,
}

impl Layout {
    fn new(args: &CollArgs, r: usize, n: usize) -> Layout {
        Layout {
            send: packed((0..n).map(|d| args.alltoall_block(r, d, n))),
            recv: packed((0..n).map(|s| args.alltoall_block(s, r, n))),
        }
    }

    fn send(&self, d: usize) -> Span {
        let (off, len) = self.send[d];
        Span::new(Buf::Input, off, len)
    }

    fn recv(&self, s: usize) -> Span {
        let (off, len) = self.recv[s];
        Span::new(Buf::Output, off, len)
    }
}

/// `(offset, len)` of blocks of the given lengths laid end to end.
fn packed(lens: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut at = 0;
    lens.map(|len| {
        at += len;
        (at - len, len)
    })
    .collect()
}

pub(crate) fn pairwise(plan: &mut Plan, args: &CollArgs) {
    let (r, n) = (plan.rank, plan.nranks);
    let layout = Layout::new(args, r, n);
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        let mut phase = plan.phase();
        if k == 1 {
            phase.copy(layout.send(r), layout.recv(r));
        }
        phase
            .send(to, layout.send(to))
            .recv(from, layout.recv(from));
    }
}

pub(crate) fn direct(plan: &mut Plan, args: &CollArgs) {
    let (r, n) = (plan.rank, plan.nranks);
    let layout = Layout::new(args, r, n);
    let mut phase = plan.phase();
    phase.copy(layout.send(r), layout.recv(r));
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        phase
            .send(to, layout.send(to))
            .recv(from, layout.recv(from));
    }
}
