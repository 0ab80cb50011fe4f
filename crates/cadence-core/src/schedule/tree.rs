//! Binomial trees: broadcast and reduce.
//!
//! Terms:
//! - **virtual rank** v: the rank's place in the chain from the root
//!   ([`Topology::chain_from`]: the ring order from the root on, the rest of
//!   the root's host first), so the root is 0 and ranks close in v are
//!   close in the network: on one host, or next in the order the path
//!   finder chose across racks. On one host in the default order,
//!   v = (rank - root) mod n.
//! - **round** k, for k = 0, 1, … while 2^k < n: one level of the tree.
//! - **parent** of v ≠ 0: v with its lowest set bit cleared (v - 2^k, where 2^k
//!   is that bit). **children** of v: v + 2^k for every round k below v's
//!   lowest set bit (every round, for the root) with v + 2^k < n.
//! - **accumulator** (reduce): where a rank combines its children's partial
//!   results. The root's is Output; other ranks use scratch, so a non-root
//!   rank's Output (its user tensor, when the call is in place) is left as it
//!   was, as NCCL does.
//!
//! Broadcast: rounds from the largest k down: in round k the holders (v a
//! multiple of 2^(k+1)) send the data to v + 2^k, doubling the holders each
//! round. Largest first so that the far edges (across hosts, across racks)
//! carry one message at a time early on, and the many messages of the last
//! rounds go to near neighbours.
//!
//! Reduce is the mirror image: a rank receives from its children in increasing
//! k (the smallest subtree is ready first), reducing each on arrival, then
//! sends to its parent. The first reduction reads Input (`accumulator = Input ⊕
//! child`), so Input is never copied.
//!
//! ceil(log2 n) latencies of whole-buffer messages: for small buffers.

use super::ir::Span;
use super::plan::Plan;
use super::topology::{Chain, Topology};

/// The rounds of a tree on n ranks: 0, 1, … while 2^k < n.
fn rounds(n: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS as usize).take_while(move |&k| (1usize << k) < n)
}

/// The chain from `root` and this rank's virtual rank in it.
fn virtual_ranks<'t>(plan: &Plan, topo: &'t Topology, root: usize) -> (Chain<'t>, usize) {
    let chain = topo.chain(root);
    let v = chain.pos(plan.rank);
    (chain, v)
}

pub(crate) fn broadcast(plan: &mut Plan, topo: &Topology, count: usize, root: usize) {
    let n = plan.nranks;
    let (chain, v) = virtual_ranks(plan, topo, root);
    let data = Span::output(0, count);
    let all: Vec<usize> = rounds(n).collect();
    for &k in all.iter().rev() {
        let bit = 1 << k;
        let low = v & ((bit << 1) - 1);
        if low == 0 {
            if v + bit < n {
                plan.phase().send(chain.at(v + bit), data);
            }
        } else if low == bit {
            plan.phase().recv(chain.at(v - bit), data);
        }
    }
}

pub(crate) fn reduce(plan: &mut Plan, topo: &Topology, count: usize, root: usize) {
    let n = plan.nranks;
    let (chain, v) = virtual_ranks(plan, topo, root);
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
            plan.phase().send(chain.at(v - bit), current);
            break;
        }
        if v + bit < n {
            plan.phase().recv_reduce(chain.at(v + bit), acc, current);
            started = true;
        }
    }
    if started && v != 0 {
        plan.need_scratch(count);
    }
}
