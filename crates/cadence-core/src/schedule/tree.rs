//! Binomial trees: broadcast and reduce.
//!
//! Terms:
//! - **virtual rank** v = (rank - root) mod n, so the root is 0.
//! - **round** k, for k = 0, 1, … while 2^k < n: one level of the tree.
//! - **parent** of v ≠ 0: v with its lowest set bit cleared (v - 2^k, where 2^k
//!   is that bit). **children** of v: v + 2^k for every round k below v's
//!   lowest set bit (every round, for the root) with v + 2^k < n.
//! - **accumulator** (reduce): where a rank combines its children's partial
//!   results. The root's is Output; other ranks use scratch, so a non-root
//!   rank's Output (its user tensor, when the call is in place) is left as it
//!   was, as NCCL does.
//!
//! Broadcast: in round k the 2^k ranks that hold the data (v < 2^k) send it to
//! v + 2^k, doubling the holders each round.
//!
//! Reduce is the mirror image: a rank receives from its children in increasing
//! k (the smallest subtree is ready first), reducing each on arrival, then
//! sends to its parent. The first reduction reads Input (`accumulator = Input ⊕
//! child`), so Input is never copied.
//!
//! ceil(log2 n) latencies of whole-buffer messages: for small buffers.

use super::ir::Span;
use super::plan::{to_real, to_virtual, Plan};

/// The rounds of a tree on n ranks: 0, 1, … while 2^k < n.
fn rounds(n: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS as usize).take_while(move |&k| (1usize << k) < n)
}

pub(crate) fn broadcast(plan: &mut Plan, count: usize, root: usize) {
    let n = plan.nranks;
    let v = to_virtual(plan.rank, root, n);
    let data = Span::output(0, count);
    for k in rounds(n) {
        let bit = 1 << k;
        if v < bit {
            if v + bit < n {
                plan.phase().send(to_real(v + bit, root, n), data);
            }
        } else if v < 2 * bit {
            plan.phase().recv(to_real(v - bit, root, n), data);
        }
    }
}

pub(crate) fn reduce(plan: &mut Plan, count: usize, root: usize) {
    let n = plan.nranks;
    let v = to_virtual(plan.rank, root, n);
    let input = Span::input(0, count);
    let acc = if v == 0 {
        Span::output(0, count)
    } else {
        Span::scratch(0, count)
    };
    // Whether `acc` holds a partial result yet; until then this rank's
    // contribution is its Input.
    let mut started = false;
    for k in rounds(n) {
        let bit = 1 << k;
        let current = if started { acc } else { input };
        if v & bit != 0 {
            plan.phase().send(to_real(v - bit, root, n), current);
            break;
        }
        if v + bit < n {
            plan.phase()
                .recv_reduce(to_real(v + bit, root, n), acc, current);
            started = true;
        }
    }
    if started && v != 0 {
        plan.need_scratch(count);
    }
}
