//! When two transfers may be in flight at the same time: one rule, kept
//! here for its three users.
//!
//! - The **verifier** requires it of the transfers of one phase, which all
//!   run at once: no transfer writes memory that another one touches.
//! - The **engine's lookahead** admits the phase after the current one
//!   *held* and starts each of its transfers as soon as it conflicts with
//!   no unfinished transfer of the current phase ([`may_start_ahead`]).
//! - The **simulator** holds and releases the next phase's transfers by
//!   the same rule, so that its timings follow the engine's.
//!
//! Terms:
//! - **region**: a range of one memory, `[off, off+len)`. What a memory is
//!   and what the unit is belong to the caller: the verifier numbers its
//!   physical buffers and counts elements, the simulator names buffers and
//!   counts elements, the engine has one memory (the address space) and
//!   counts bytes.
//! - **operand**: a region a transfer reads or writes. A send reads its
//!   source; a receive writes its destination and, when it reduces with a
//!   separate operand, reads that too (a receive that reduces into its own
//!   destination touches only the destination).
//! - two operands **conflict** when they overlap and at least one is
//!   written; two transfers conflict when any of their operands do.
//!
//! Why the lookahead keeps what the verifier proves: the engine admits the
//! next phase early only when it has no local steps and neither it nor the
//! current phase folds, so until it becomes current its memory changes only
//! by transfers. A held transfer starts only when it conflicts with no
//! unfinished transfer of the current phase, so a send reads what it would
//! read once its phase began, a receive's write is seen by no transfer of
//! the current phase, and every two transfers in flight together are as
//! disjoint as the verifier requires of one phase's. The results are those
//! of the phases run one after another, which is what the verifier runs.
//!
//! Where the three differ, on purpose:
//! - The engine compares addresses, so in an in-place call (Input *is*
//!   Output) it sees Input and Output overlap; the verifier maps them onto
//!   one memory in its in-place layout. The simulator names buffers by kind
//!   and so models separate Input and Output: in an in-place call it may
//!   release a transfer the engine still holds (timing only).
//! - The simulator counts a phase as having local steps by the elements
//!   they touch, the engine by their presence, so a hand-made schedule with
//!   an empty `Copy` or `Reduce` may be run ahead in the simulator only (the
//!   generators never emit one).

/// A range of one memory (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Which memory: a buffer's number, or 0 where there is only one.
    pub mem: usize,
    pub off: usize,
    pub len: usize,
}

impl Region {
    pub const fn new(mem: usize, off: usize, len: usize) -> Region {
        Region { mem, off, len }
    }

    /// Whether the two share at least one unit of the same memory (an empty
    /// region overlaps nothing).
    pub fn overlaps(&self, other: &Region) -> bool {
        self.mem == other.mem
            && self.len > 0
            && other.len > 0
            && self.off < other.off + other.len
            && other.off < self.off + self.len
    }
}

/// A region one transfer reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub region: Region,
    pub written: bool,
}

impl Operand {
    pub const fn read(region: Region) -> Operand {
        Operand {
            region,
            written: false,
        }
    }

    pub const fn written(region: Region) -> Operand {
        Operand {
            region,
            written: true,
        }
    }

    /// Whether the two may not be in use at the same time: they overlap
    /// and one of them is written (two reads never conflict).
    pub fn conflicts(&self, other: &Operand) -> bool {
        (self.written || other.written) && self.region.overlaps(&other.region)
    }
}

/// The memory one transfer touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A send reads its source.
    Send { src: Region },
    /// A receive writes its destination and reads `with`, the other operand
    /// of its reduction when that is not the destination itself.
    Recv { dst: Region, with: Option<Region> },
}

impl Access {
    /// The transfer's operands: the one it moves data from or to first,
    /// then a reducing receive's other operand.
    pub fn operands(&self) -> [Option<Operand>; 2] {
        match *self {
            Access::Send { src } => [Some(Operand::read(src)), None],
            Access::Recv { dst, with } => [Some(Operand::written(dst)), with.map(Operand::read)],
        }
    }

    /// Whether the transfer carries data. One that carries none carries
    /// only order (a barrier's signal must not leave before the previous
    /// round's arrived), so it never starts ahead of its phase.
    pub fn carries_data(&self) -> bool {
        match *self {
            Access::Send { src: r } | Access::Recv { dst: r, .. } => r.len > 0,
        }
    }

    /// Whether the transfer writes memory (a receive). One that only reads
    /// can conflict only with one that writes, so a caller checking a send
    /// may skip the other sends.
    pub fn writes(&self) -> bool {
        matches!(self, Access::Recv { .. })
    }

    /// Whether the two transfers may not be in flight at the same time:
    /// one writes memory the other reads or writes.
    pub fn conflicts(&self, other: &Access) -> bool {
        let theirs = other.operands();
        self.operands()
            .iter()
            .flatten()
            .any(|a| theirs.iter().flatten().any(|b| a.conflicts(b)))
    }
}

/// Whether a held transfer of the next phase may start while `unfinished`
/// transfers of the current phase are still in flight.
pub fn may_start_ahead(held: &Access, unfinished: impl IntoIterator<Item = Access>) -> bool {
    held.carries_data() && !unfinished.into_iter().any(|e| e.conflicts(held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(off: usize, len: usize) -> Access {
        Access::Send {
            src: Region::new(0, off, len),
        }
    }

    fn recv(off: usize, len: usize) -> Access {
        Access::Recv {
            dst: Region::new(0, off, len),
            with: None,
        }
    }

    fn reducing(off: usize, len: usize, with: usize) -> Access {
        Access::Recv {
            dst: Region::new(0, off, len),
            with: Some(Region::new(0, with, len)),
        }
    }

    /// Both orders, since the rule is about a pair.
    fn conflict(a: Access, b: Access) -> bool {
        let (ab, ba) = (a.conflicts(&b), b.conflicts(&a));
        assert_eq!(ab, ba, "{a:?} and {b:?}: the rule is symmetric");
        ab
    }

    #[test]
    fn regions_overlap_only_in_the_same_memory_when_both_are_nonempty() {
        let r = Region::new(1, 4, 4);
        assert!(r.overlaps(&Region::new(1, 7, 1)));
        assert!(r.overlaps(&Region::new(1, 0, 5)));
        assert!(!r.overlaps(&Region::new(1, 8, 4)), "touching ends");
        assert!(!r.overlaps(&Region::new(1, 0, 4)), "touching starts");
        assert!(!r.overlaps(&Region::new(2, 4, 4)), "another memory");
        assert!(!r.overlaps(&Region::new(1, 5, 0)), "empty inside");
        assert!(!Region::new(1, 5, 0).overlaps(&Region::new(1, 5, 0)));
    }

    /// A send's source: only a receive writing it holds the send back
    /// (the engine's held send; the simulator's `blocks` for a send).
    #[test]
    fn a_send_conflicts_only_with_a_receive_into_its_source() {
        assert!(!conflict(send(0, 4), send(2, 4)), "two reads");
        assert!(!send(0, 4).writes() && recv(0, 4).writes() && reducing(0, 4, 8).writes());
        assert!(conflict(send(0, 4), recv(3, 4)));
        assert!(!conflict(send(0, 4), recv(4, 4)));
        // A reducing receive reads its other operand: no conflict with a
        // send reading the same memory.
        assert!(!conflict(send(0, 4), reducing(8, 4, 0)));
        assert!(conflict(send(0, 4), reducing(2, 4, 8)));
    }

    /// Two receives: either's destination against everything the other
    /// touches (the engine's held receive against the current receives).
    #[test]
    fn a_receive_conflicts_with_what_touches_its_destination() {
        assert!(conflict(recv(0, 4), recv(2, 4)), "two writes");
        assert!(!conflict(recv(0, 4), recv(4, 4)));
        assert!(
            conflict(recv(0, 4), reducing(8, 4, 2)),
            "it writes what the other reads"
        );
        assert!(
            conflict(reducing(8, 4, 0), recv(2, 4)),
            "the other writes what it reads"
        );
        assert!(
            !conflict(reducing(8, 4, 0), reducing(12, 4, 0)),
            "both read the operand"
        );
        // Reducing into its own destination: the engine records no separate
        // operand, the simulator the destination again; both mean the same.
        let into_itself = Access::Recv {
            dst: Region::new(0, 0, 4),
            with: Some(Region::new(0, 0, 4)),
        };
        for other in [send(2, 1), recv(3, 1), send(4, 4), reducing(8, 4, 4)] {
            assert_eq!(conflict(into_itself, other), conflict(recv(0, 4), other));
        }
    }

    /// The verifier's in-place layout maps Input onto Output: the same
    /// element range then conflicts, in separate memories it does not.
    #[test]
    fn memories_keep_regions_apart() {
        let src = Access::Send {
            src: Region::new(0, 0, 4),
        };
        let dst = |mem| Access::Recv {
            dst: Region::new(mem, 0, 4),
            with: None,
        };
        assert!(!conflict(src, dst(1)));
        assert!(conflict(src, dst(0)));
    }

    /// What the lookahead asks: a held transfer waits for every unfinished
    /// conflicting one, and an empty one for its own phase.
    #[test]
    fn a_held_transfer_starts_once_nothing_unfinished_conflicts() {
        let current = [recv(0, 4), send(4, 4), recv(8, 4)];
        assert!(
            may_start_ahead(&send(4, 4), current),
            "reads what a send reads"
        );
        assert!(
            !may_start_ahead(&send(2, 4), current),
            "reads what a receive writes"
        );
        assert!(
            !may_start_ahead(&recv(6, 1), current),
            "writes what a send reads"
        );
        assert!(may_start_ahead(&recv(12, 4), current));
        assert!(!may_start_ahead(&reducing(12, 4, 9), current));
        // Once the receive into 0..4 is done, a send from there may go.
        assert!(may_start_ahead(&send(0, 4), [send(4, 4), recv(8, 4)]));
        assert!(may_start_ahead(&send(0, 4), []));
        // An empty message carries order only: never ahead of its phase.
        assert!(!may_start_ahead(&send(20, 0), []));
        assert!(!may_start_ahead(&recv(20, 0), []));
        assert!(!send(20, 0).carries_data() && send(20, 1).carries_data());
    }
}
