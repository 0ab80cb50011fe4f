//! One verification problem ([`World`]): the schedules, every rank's
//! initial memory, what its Output must hold at the end, and the order in
//! which the checks run on it.

use super::fault::Fault;
use super::symbolic::{Sim, Val};
use super::Layout;
use crate::schedule::ir::{CollArgs, Schedule};
use crate::types::CollKind;
use std::fmt;

/// What an Output element must hold at the end.
#[derive(Clone, Copy, Debug)]
pub(super) enum Expect {
    Data {
        rank: usize,
        index: usize,
    },
    /// Element `index` reduced over all ranks, each exactly once.
    Total {
        index: usize,
    },
}

impl Expect {
    pub(super) fn holds(self, v: Val, all: u64) -> bool {
        match (self, v) {
            (Expect::Data { rank, index }, Val::Data { rank: r, index: i }) => {
                rank == r && index == i
            }
            (Expect::Total { index }, Val::Partial { mask, index: i, .. }) => {
                mask == all && index == i
            }
            _ => false,
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Expect::Data { rank, index } => write!(f, "rank {rank}'s element {index}"),
            Expect::Total { index } => {
                write!(f, "element {index} reduced over all ranks once each")
            }
        }
    }
}

/// One verification problem: the schedules, the initial memory and what must
/// come out.
pub(super) struct World<'a> {
    pub(super) schedules: &'a [Schedule],
    /// Per rank, the logical (Input, Output) lengths.
    pub(super) lens: Vec<(usize, usize)>,
    pub(super) input: Vec<Vec<Val>>,
    pub(super) output: Vec<Vec<Val>>,
    /// Per rank, its expected Output, or `None` when it is not checked.
    pub(super) expect: Vec<Option<Vec<Expect>>>,
    /// Every rank's Output must carry the same expressions (allreduce).
    pub(super) same_bits: bool,
    /// Every rank must hear from every other (barrier).
    pub(super) barrier: bool,
    /// The call may be in place (allreduce, reduce).
    pub(super) in_place: bool,
    /// For reduce: the root (the only rank allowed to write Output).
    pub(super) reduce_root: Option<usize>,
}

impl<'a> World<'a> {
    pub(super) fn collective(args: &CollArgs, schedules: &'a [Schedule]) -> World<'a> {
        let n = schedules.len();
        let kind = args.kind;
        let lens: Vec<(usize, usize)> = (0..n).map(|r| args.buffer_lens(r, n)).collect();
        let input = (0..n)
            .map(|r| {
                (0..lens[r].0)
                    .map(|i| {
                        if kind.reduces() {
                            Val::leaf(r, i)
                        } else {
                            Val::Data { rank: r, index: i }
                        }
                    })
                    .collect()
            })
            .collect();
        let output = (0..n)
            .map(|r| {
                (0..lens[r].1)
                    .map(|i| {
                        if kind == CollKind::Broadcast && r == args.root {
                            Val::Data { rank: r, index: i }
                        } else {
                            Val::Uninit
                        }
                    })
                    .collect()
            })
            .collect();
        World {
            schedules,
            lens,
            input,
            output,
            expect: (0..n).map(|r| expected_output(args, n, r)).collect(),
            same_bits: kind == CollKind::AllReduce,
            barrier: kind == CollKind::Barrier,
            in_place: matches!(kind, CollKind::AllReduce | CollKind::Reduce),
            reduce_root: (kind == CollKind::Reduce).then_some(args.root),
        }
    }

    pub(super) fn p2p(
        count: usize,
        src: usize,
        dst: usize,
        schedules: &'a [Schedule],
    ) -> World<'a> {
        let n = schedules.len();
        let lens: Vec<(usize, usize)> = (0..n)
            .map(|r| match r {
                _ if r == src => (count, 0),
                _ if r == dst => (0, count),
                _ => (0, 0),
            })
            .collect();
        World {
            schedules,
            input: (0..n)
                .map(|r| {
                    (0..lens[r].0)
                        .map(|i| Val::Data { rank: r, index: i })
                        .collect()
                })
                .collect(),
            output: lens.iter().map(|&(_, o)| vec![Val::Uninit; o]).collect(),
            expect: (0..n)
                .map(|r| {
                    (r == dst).then(|| {
                        (0..count)
                            .map(|index| Expect::Data { rank: src, index })
                            .collect()
                    })
                })
                .collect(),
            lens,
            same_bits: false,
            barrier: false,
            in_place: false,
            reduce_root: None,
        }
    }

    /// Runs every check in every layout that applies.
    pub(super) fn check(&self) -> Result<(), (Option<Layout>, Fault)> {
        let n = self.schedules.len();
        let algo = self.schedules.first().map(|s| s.algo);
        for (index, s) in self.schedules.iter().enumerate() {
            if s.rank != index || s.nranks != n {
                return Err((
                    None,
                    Fault::WrongRank {
                        index,
                        rank: s.rank,
                        nranks: s.nranks,
                    },
                ));
            }
            if Some(s.algo) != algo {
                return Err((None, Fault::MixedAlgos));
            }
        }
        // Out of place first, completely, so that a fault shows up in the
        // simplest layout that has it. Matching needs the peers in range,
        // which the first structure check made sure of.
        let in_layout = |layout| move |f| (Some(layout), f);
        self.check_structure(Layout::Distinct)
            .map_err(in_layout(Layout::Distinct))?;
        let partner = self.match_channels().map_err(|f| (None, f))?;
        Sim::new(self, Layout::Distinct, &partner)
            .run()
            .map_err(in_layout(Layout::Distinct))?;
        if self.in_place {
            self.check_structure(Layout::InPlace)
                .map_err(in_layout(Layout::InPlace))?;
            Sim::new(self, Layout::InPlace, &partner)
                .run()
                .map_err(in_layout(Layout::InPlace))?;
        }
        Ok(())
    }
}

/// Expected Output of rank r (see the table on [`CollArgs`]); `None` where
/// the collective leaves it undefined.
fn expected_output(args: &CollArgs, n: usize, r: usize) -> Option<Vec<Expect>> {
    let c = &args.counts;
    let root = args.root;
    let count = c.first().copied().unwrap_or(0);
    let displ = |b: usize| -> usize { c[..b].iter().sum() };
    let totals = |from: usize, len: usize| {
        (from..from + len)
            .map(|index| Expect::Total { index })
            .collect()
    };
    let gathered = || {
        (0..n)
            .flat_map(|s| (0..c[s]).map(move |index| Expect::Data { rank: s, index }))
            .collect()
    };
    Some(match args.kind {
        CollKind::AllReduce => totals(0, count),
        CollKind::Reduce if r == root => totals(0, count),
        CollKind::Broadcast => (0..count)
            .map(|index| Expect::Data { rank: root, index })
            .collect(),
        CollKind::AllGather => gathered(),
        CollKind::Gather if r == root => gathered(),
        CollKind::ReduceScatter => totals(displ(r), c[r]),
        CollKind::AllToAll => (0..n)
            .flat_map(|s| {
                let off: usize = (0..r).map(|d| args.alltoall_block(s, d, n)).sum();
                (0..args.alltoall_block(s, r, n)).map(move |j| Expect::Data {
                    rank: s,
                    index: off + j,
                })
            })
            .collect(),
        CollKind::Scatter => {
            let off = displ(r);
            (0..c[r])
                .map(|j| Expect::Data {
                    rank: root,
                    index: off + j,
                })
                .collect()
        }
        CollKind::Barrier => Vec::new(),
        CollKind::Reduce | CollKind::Gather | CollKind::Send | CollKind::Recv => return None,
    })
}
