//! What every generator shares: a phase-by-phase builder for one rank's
//! schedule, and the arithmetic of blocks and virtual ranks.
//!
//! Terms:
//! - **block**: a contiguous piece of a buffer, one per rank. [`Blocks`] holds
//!   the displacements: `Blocks::of_counts` for the v-collectives (rank r's
//!   block has `counts[r]` elements), `Blocks::balanced` for a buffer of
//!   `count` elements cut into n **chunks**, chunk i = `[i*count/n,
//!   (i+1)*count/n)`, so lengths differ by at most one and a count below n
//!   gives some empty chunks.
//! - **virtual rank**: a rank renumbered so that the root is 0,
//!   `v = (rank - root) mod n`. Rooted algorithms are written for root 0.
//!
//! Empty transfers are dropped when they are added: both sides of a message
//! compute its length from the same global counts, so both drop it, and an
//! empty message carries no data. Phases left empty are dropped at the end
//! (phases are per rank; nothing aligns them across ranks). Barrier and
//! point-to-point push their zero-length steps with [`PhaseBuilder::step`],
//! because there the message itself is the point.

use super::ir::{Algo, Buf, Phase, Schedule, Span, Step};

/// One rank's schedule under construction.
pub(crate) struct Plan {
    pub rank: usize,
    pub nranks: usize,
    phases: Vec<Phase>,
    scratch_len: usize,
}

impl Plan {
    pub fn new(rank: usize, nranks: usize) -> Plan {
        Plan {
            rank,
            nranks,
            phases: Vec::new(),
            scratch_len: 0,
        }
    }

    /// Opens the next phase.
    pub fn phase(&mut self) -> PhaseBuilder<'_> {
        let i = self.phases.len();
        self.phases.push(Phase::default());
        PhaseBuilder {
            phase: &mut self.phases[i],
        }
    }

    /// Makes sure the schedule asks for at least `len` elements of scratch.
    pub fn need_scratch(&mut self, len: usize) {
        self.scratch_len = self.scratch_len.max(len);
    }

    /// Lays `other`'s phases over this plan's from phase `at` on: phase i
    /// of `other` joins phase at+i (created if needed), its steps after the
    /// ones already there. For software pipelines of independent pieces of
    /// one call (disjoint memory); the caller makes every rank lay alike, so
    /// both ends of a message still meet in the same phase and order.
    pub fn overlay(&mut self, other: Plan, at: usize) {
        for (i, phase) in other.phases.into_iter().enumerate() {
            if self.phases.len() <= at + i {
                self.phases.resize_with(at + i + 1, Phase::default);
            }
            self.phases[at + i].steps.extend(phase.steps);
        }
        self.need_scratch(other.scratch_len);
    }

    pub fn finish(mut self, algo: Algo) -> Schedule {
        self.phases.retain(|p| !p.steps.is_empty());
        Schedule {
            rank: self.rank,
            nranks: self.nranks,
            algo,
            phases: self.phases,
            scratch_len: self.scratch_len,
        }
    }
}

/// Adds steps to one phase. Zero-length steps are skipped (see the module
/// comment); [`PhaseBuilder::step`] adds a step unconditionally.
pub(crate) struct PhaseBuilder<'a> {
    phase: &'a mut Phase,
}

impl PhaseBuilder<'_> {
    pub fn step(&mut self, step: Step) -> &mut Self {
        self.phase.steps.push(step);
        self
    }

    pub fn send(&mut self, peer: usize, src: Span) -> &mut Self {
        if src.len > 0 {
            self.step(Step::Send { peer, src });
        }
        self
    }

    /// `dst = incoming`.
    pub fn recv(&mut self, peer: usize, dst: Span) -> &mut Self {
        if dst.len > 0 {
            self.step(Step::Recv {
                peer,
                dst,
                reduce_with: None,
            });
        }
        self
    }

    /// `dst = with ⊕ incoming`.
    pub fn recv_reduce(&mut self, peer: usize, dst: Span, with: Span) -> &mut Self {
        if dst.len > 0 {
            self.step(Step::Recv {
                peer,
                dst,
                reduce_with: Some(with),
            });
        }
        self
    }

    pub fn copy(&mut self, src: Span, dst: Span) -> &mut Self {
        if src.len > 0 {
            self.step(Step::Copy { src, dst });
        }
        self
    }

    /// `dst = dst ⊕ src`, a local step (before the phase's transfers).
    pub fn reduce(&mut self, src: Span, dst: Span) -> &mut Self {
        if src.len > 0 {
            self.step(Step::Reduce { src, dst });
        }
        self
    }

    /// `dst = dst ⊕ src` as the phase's receive into `src` lands (after the
    /// folds into `dst` listed before it).
    pub fn fold(&mut self, src: Span, dst: Span) -> &mut Self {
        if src.len > 0 {
            self.step(Step::Fold { src, dst });
        }
        self
    }
}

/// Displacements of n contiguous blocks (see the module comment).
pub(crate) struct Blocks {
    /// `displ[b]` is where block b starts; `displ[n]` is the total.
    displ: Vec<usize>,
}

impl Blocks {
    /// n chunks of a buffer of `count` elements.
    pub fn balanced(count: usize, n: usize) -> Blocks {
        // u128 so that `i * count` cannot overflow for any realistic count.
        let split = |i: usize| (i as u128 * count as u128 / n as u128) as usize;
        Blocks {
            displ: (0..=n).map(split).collect(),
        }
    }

    /// n chunks of the `len` elements starting at `off`.
    pub fn balanced_in(off: usize, len: usize, n: usize) -> Blocks {
        let mut b = Blocks::balanced(len, n);
        b.displ.iter_mut().for_each(|d| *d += off);
        b
    }

    /// Block b has `counts[b]` elements.
    pub fn of_counts(counts: &[usize]) -> Blocks {
        let mut displ = Vec::with_capacity(counts.len() + 1);
        let mut at = 0;
        displ.push(0);
        for &c in counts {
            at += c;
            displ.push(at);
        }
        Blocks { displ }
    }

    pub fn off(&self, b: usize) -> usize {
        self.displ[b]
    }

    pub fn len(&self, b: usize) -> usize {
        self.displ[b + 1] - self.displ[b]
    }

    pub fn total(&self) -> usize {
        self.displ[self.displ.len() - 1]
    }

    pub fn max_len(&self) -> usize {
        (0..self.displ.len() - 1)
            .map(|b| self.len(b))
            .max()
            .unwrap_or(0)
    }

    /// Block b of `buf`.
    pub fn span(&self, buf: Buf, b: usize) -> Span {
        Span::new(buf, self.off(b), self.len(b))
    }

    /// Blocks `first..end` of `buf`, which are contiguous.
    pub fn range(&self, buf: Buf, first: usize, end: usize) -> Span {
        Span::new(buf, self.displ[first], self.displ[end] - self.displ[first])
    }
}

/// Virtual rank of `rank` when `root` is renumbered 0.
pub(crate) fn to_virtual(rank: usize, root: usize, n: usize) -> usize {
    (rank + n - root) % n
}

/// Real rank of virtual rank `v`.
pub(crate) fn to_real(v: usize, root: usize, n: usize) -> usize {
    (v + root) % n
}
