//! The widest ring through the hosts of a measured network, in the manner of
//! TCCL's path finder: groups (racks) first, then hosts inside them.
//!
//! Terms:
//! - **width** of a ring or chain: the rate each of its flows gets when all
//!   its edges carry traffic at once ([`Fabric::ring_score`]).
//! - **contiguous** ring: one that visits the hosts of every group one after
//!   another, so it leaves and enters each group once. No ring shares an
//!   uplink less, so when uplinks are oversubscribed enough the widest ring
//!   is contiguous (the tests give a condition).
//! - **entry / exit**: the first and the last host a contiguous ring visits
//!   in a group; **W(u, v)**: the width of the widest path from entry u to
//!   exit v through all hosts of the group.
//!
//! [`widest_ring`] builds the widest contiguous ring it can find:
//! - W(u, v) inside each group: exact (Held–Karp over subsets, min in place
//!   of +) for groups of up to 12 hosts; beyond that, for 4 candidate
//!   endpoints (the hosts that reach outside best), a greedy widest-next
//!   path improved by 2-opt and or-opt moves on its narrowest link, plus a
//!   fixed number of seeded double-bridge kicks.
//! - the group order and each group's entry and exit: exact over every
//!   order (a subset search) for up to 8 groups; beyond that greedy orders
//!   improved by the same local search, with the best entries and exits for
//!   each order found exactly.
//!
//! For up to 9 hosts it also searches every ring (branch and bound) and
//! keeps the wider, so small inputs get the true optimum. Everything is
//! deterministic: every rank runs it and they must agree, so ties go to the
//! first candidate in a fixed order, random choices come from a fixed seed,
//! and widths are only ever combined by `min` and `max` (no sums whose
//! rounding could vary).
//!
//! Files: `grouped.rs` (contiguous rings: the group order, each group's
//! entry and exit), `paths.rs` (the widest paths through one group),
//! `local_search.rs` (the moves that widen a route, and the kicks); the
//! model itself is [`crate::fabric::model`].

mod grouped;
mod local_search;
mod paths;

pub use super::model::Fabric;

use grouped::grouped_ring;

/// Up to this many hosts, [`widest_ring`] also searches every ring exactly.
const EXACT_RING_MAX_HOSTS: usize = 9;
/// The width of a path that cannot exist (a group of two or more hosts
/// entered and left at the same host).
const NO_PATH: f64 = f64::NEG_INFINITY;

/// The host order of the widest ring (maximizes ring_score), starting with
/// host 0. Deterministic (same input -> same output on every machine: every
/// rank runs it and they must agree; ties go to the first candidate in a
/// fixed order, never to hash-map iteration order or floating-point sums
/// whose order could vary).
///
/// The widest ring that visits every group contiguously (the one that
/// shares uplinks least), exact up to 8 groups of up to 12 hosts,
/// heuristic beyond; with at most 9 hosts every ring is also searched and
/// the wider kept (the contiguous one on ties), so small inputs get the
/// true optimum.
///
/// Precondition: `f.check()` passed (this panics on malformed shapes).
pub fn widest_ring(f: &Fabric) -> Vec<usize> {
    let n = f.nhosts();
    if n <= 2 {
        // One ring up to rotation.
        return (0..n).collect();
    }
    let grouped = grouped_ring(f);
    if n <= EXACT_RING_MAX_HOSTS {
        let exact = exact_ring(f);
        if f.ring_score(&exact) > f.ring_score(&grouped) {
            return exact;
        }
    }
    grouped
}

/// The chain for a pipelined broadcast from `root`: the widest ring rotated
/// to start at root, and reversed if that gives a higher chain_score. The
/// reversed chain still starts at root (root, then the ring's hosts
/// backwards); on a tie the forward one is kept. Its chain_score is at
/// least the ring's ring_score: a chain drops an edge and shares uplinks
/// with no more edges than the ring.
///
/// Precondition: `f.check()` passed.
///
/// # Panics
/// If `root` is not a host.
pub fn widest_chain(f: &Fabric, root: usize) -> Vec<usize> {
    assert!(
        root < f.nhosts(),
        "root {root} is not a host (the fabric has {} hosts)",
        f.nhosts()
    );
    let forward = rotated_to(widest_ring(f), root);
    let mut backward = forward.clone();
    backward[1..].reverse();
    if f.chain_score(&backward) > f.chain_score(&forward) {
        backward
    } else {
        forward
    }
}

/// `ring` rotated so that it starts at `host` (unchanged if absent).
fn rotated_to(mut ring: Vec<usize>, host: usize) -> Vec<usize> {
    if let Some(at) = ring.iter().position(|&h| h == host) {
        ring.rotate_left(at);
    }
    ring
}

/// The first item with the largest width; later ties lose (a fixed rule,
/// so every rank picks the same).
fn widest<T>(items: impl IntoIterator<Item = (f64, T)>) -> Option<(f64, T)> {
    let mut best: Option<(f64, T)> = None;
    for (width, item) in items {
        if best.as_ref().is_none_or(|(w, _)| width > *w) {
            best = Some((width, item));
        }
    }
    best
}

// ---------------------------------------------------------------------------
// Exact search over all rings (small inputs).

/// The widest ring of all, by branch and bound over every order with host 0
/// first. Exponential: only for up to [`EXACT_RING_MAX_HOSTS`] hosts.
fn exact_ring(f: &Fabric) -> Vec<usize> {
    let n = f.nhosts();
    if n <= 2 {
        return (0..n).collect();
    }
    let mut search = ExactRingSearch {
        fabric: f,
        path: vec![0],
        used: (0..n).map(|h| h == 0).collect(),
        best_width: NO_PATH,
        best: (0..n).collect(),
    };
    search.extend();
    search.best
}

struct ExactRingSearch<'a> {
    fabric: &'a Fabric,
    path: Vec<usize>,
    used: Vec<bool>,
    best_width: f64,
    best: Vec<usize>,
}

impl ExactRingSearch<'_> {
    fn extend(&mut self) {
        let n = self.used.len();
        if self.path.len() == n {
            let width = self.fabric.ring_score(&self.path);
            if width > self.best_width {
                self.best_width = width;
                self.best.clone_from(&self.path);
            }
            return;
        }
        // More edges only narrow a route, and more crossings only shrink each
        // one's share of an uplink: the chain so far bounds every completion.
        if self.fabric.chain_score(&self.path) <= self.best_width {
            return;
        }
        for host in 1..n {
            if !self.used[host] {
                self.used[host] = true;
                self.path.push(host);
                self.extend();
                self.path.pop();
                self.used[host] = false;
            }
        }
    }
}

#[cfg(test)]
mod tests;
