//! The symbolic run of one world in one layout: values instead of numbers,
//! phases entered and completed as the module comment says, a deadlock
//! when no rank can move, and the results checked against the world's
//! expectations at the end.

use super::channels::Partners;
use super::fault::{ranks_text, At, Elem, Fault, Wait};
use super::structure::mem_of;
use super::world::World;
use super::{Layout, MAX_RANKS};
use crate::schedule::ir::{Span, Step};
use std::collections::HashMap;
use std::fmt;

/// What one element holds (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Val {
    Uninit,
    Data { rank: usize, index: usize },
    Partial { mask: u64, index: usize, expr: u32 },
}

/// Expression ids below this are leaves (the rank); interned nodes follow.
const FIRST_NODE: u32 = MAX_RANKS as u32;

impl Val {
    pub(super) fn leaf(rank: usize, index: usize) -> Val {
        Val::Partial {
            mask: 1 << rank,
            index,
            expr: rank as u32,
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Val::Uninit => write!(f, "uninitialized memory"),
            Val::Data { rank, index } => write!(f, "rank {rank}'s element {index}"),
            Val::Partial { mask, index, .. } => {
                write!(
                    f,
                    "element {index} reduced over rank(s) {}",
                    ranks_text(&mask)
                )
            }
        }
    }
}

/// The symbolic run of one world in one layout.
pub(super) struct Sim<'w> {
    world: &'w World<'w>,
    layout: Layout,
    partner: &'w Partners,
    /// Per rank: Input, Output, Scratch (Input unused in place).
    mem: Vec<[Vec<Val>; 3]>,
    exprs: HashMap<(u32, u32), u32>,
    clock: Vec<u64>,
    /// Captured sends by (rank, phase, step): values and the sender's clock.
    captured: HashMap<(usize, usize, usize), (Vec<Val>, u64)>,
    /// Each rank's current phase (= its phase count when finished).
    pc: Vec<usize>,
    /// Whether the rank has entered its current phase.
    started: Vec<bool>,
}

impl<'w> Sim<'w> {
    pub(super) fn new(world: &'w World<'w>, layout: Layout, partner: &'w Partners) -> Sim<'w> {
        let n = world.schedules.len();
        let mem = (0..n)
            .map(|r| {
                let scratch = vec![Val::Uninit; world.schedules[r].scratch_len];
                match layout {
                    Layout::Distinct => [world.input[r].clone(), world.output[r].clone(), scratch],
                    // The user's one buffer holds the input.
                    Layout::InPlace => [Vec::new(), world.input[r].clone(), scratch],
                }
            })
            .collect();
        Sim {
            world,
            layout,
            partner,
            mem,
            exprs: HashMap::new(),
            clock: (0..n).map(|r| 1 << r).collect(),
            captured: HashMap::new(),
            pc: vec![0; n],
            started: vec![false; n],
        }
    }

    pub(super) fn run(mut self) -> Result<(), Fault> {
        let n = self.pc.len();
        let schedules = self.world.schedules;
        let finished = |sim: &Sim<'_>, r: usize| sim.pc[r] >= schedules[r].phases.len();
        loop {
            let mut progress = false;
            for r in 0..n {
                if !finished(&self, r) && !self.started[r] {
                    self.start(r)?;
                    progress = true;
                }
            }
            for r in 0..n {
                if self.started[r] && self.can_complete(r) {
                    self.complete(r)?;
                    progress = true;
                }
            }
            if (0..n).all(|r| finished(&self, r)) {
                break;
            }
            if !progress {
                return Err(Fault::Deadlock {
                    waits: self.waits(),
                });
            }
        }
        self.check_results()
    }

    fn read(&self, r: usize, span: &Span) -> Vec<Val> {
        self.mem[r][mem_of(span.buf, self.layout)][span.off..span.end()].to_vec()
    }

    fn write(&mut self, r: usize, span: &Span, vals: &[Val]) {
        self.mem[r][mem_of(span.buf, self.layout)][span.off..span.end()].copy_from_slice(vals);
    }

    /// `a ⊕ b`, where the result goes to `elem`.
    fn combine(&mut self, a: Val, b: Val, at: At, elem: Elem) -> Result<Val, Fault> {
        match (a, b) {
            (
                Val::Partial {
                    mask: ma,
                    index: ia,
                    expr: ea,
                },
                Val::Partial {
                    mask: mb,
                    index: ib,
                    expr: eb,
                },
            ) => {
                if ia != ib {
                    return Err(Fault::Misaligned {
                        at,
                        elem,
                        a: ia,
                        b: ib,
                    });
                }
                if ma & mb != 0 {
                    return Err(Fault::DoubleCount {
                        at,
                        elem,
                        both: ma & mb,
                    });
                }
                let next = FIRST_NODE + self.exprs.len() as u32;
                let expr = *self.exprs.entry((ea.min(eb), ea.max(eb))).or_insert(next);
                Ok(Val::Partial {
                    mask: ma | mb,
                    index: ia,
                    expr,
                })
            }
            (Val::Partial { .. }, other) | (other, _) => Err(Fault::NotReducible {
                at,
                elem,
                value: other.to_string(),
            }),
        }
    }

    /// `dst[j] = a[j] ⊕ b[j]` element by element.
    fn combine_into(
        &mut self,
        r: usize,
        dst: &Span,
        a: &[Val],
        b: &[Val],
        at: At,
    ) -> Result<(), Fault> {
        let mut out = Vec::with_capacity(a.len());
        for (j, (&x, &y)) in a.iter().zip(b).enumerate() {
            let elem = Elem {
                buf: dst.buf,
                index: dst.off + j,
            };
            out.push(self.combine(x, y, at, elem)?);
        }
        self.write(r, dst, &out);
        Ok(())
    }

    /// Enters rank r's current phase: local steps in order, then captures.
    fn start(&mut self, r: usize) -> Result<(), Fault> {
        let q = self.pc[r];
        let phase = &self.world.schedules[r].phases[q];
        for (i, step) in phase.steps.iter().enumerate() {
            let at = At {
                rank: r,
                phase: q,
                step: i,
            };
            match step {
                Step::Copy { src, dst } => {
                    let vals = self.read(r, src);
                    self.write(r, dst, &vals);
                }
                Step::Reduce { src, dst } => {
                    let (old, add) = (self.read(r, dst), self.read(r, src));
                    self.combine_into(r, dst, &old, &add, at)?;
                }
                Step::Send { .. } | Step::Recv { .. } | Step::Fold { .. } => {}
            }
        }
        for (i, step) in phase.steps.iter().enumerate() {
            if let Step::Send { src, .. } = step {
                let vals = self.read(r, src);
                self.captured.insert((r, q, i), (vals, self.clock[r]));
            }
        }
        self.started[r] = true;
        Ok(())
    }

    /// Whether rank `r` has entered or passed phase `q`.
    fn reached(&self, r: usize, q: usize) -> bool {
        self.pc[r] > q || (self.pc[r] == q && self.started[r])
    }

    fn can_complete(&self, r: usize) -> bool {
        let q = self.pc[r];
        let steps = &self.world.schedules[r].phases[q].steps;
        steps.iter().enumerate().all(|(i, step)| {
            !step.is_transfer()
                || self.partner[r][q][i].is_some_and(|p| self.reached(p.rank, p.phase))
        })
    }

    /// Completes rank r's current phase: its Recvs take effect.
    fn complete(&mut self, r: usize) -> Result<(), Fault> {
        let q = self.pc[r];
        let phase = &self.world.schedules[r].phases[q];
        for (i, step) in phase.steps.iter().enumerate() {
            let Step::Recv {
                dst, reduce_with, ..
            } = step
            else {
                continue;
            };
            let at = At {
                rank: r,
                phase: q,
                step: i,
            };
            let from = self.partner[r][q][i].expect("every transfer is matched before the run");
            let (incoming, clock) = self
                .captured
                .remove(&(from.rank, from.phase, from.step))
                .expect("a sender that reached its phase has captured its sends");
            match reduce_with {
                None => self.write(r, dst, &incoming),
                Some(a) => {
                    let base = self.read(r, a);
                    self.combine_into(r, dst, &base, &incoming, at)?;
                }
            }
            self.clock[r] |= clock;
        }
        // Folds take effect after every receive, in step order: element by
        // element that is the order the engine's chains keep.
        for (i, step) in phase.steps.iter().enumerate() {
            let Step::Fold { src, dst } = step else {
                continue;
            };
            let at = At {
                rank: r,
                phase: q,
                step: i,
            };
            let (old, add) = (self.read(r, dst), self.read(r, src));
            self.combine_into(r, dst, &old, &add, at)?;
        }
        self.pc[r] += 1;
        self.started[r] = false;
        Ok(())
    }

    /// Every transfer that cannot complete, for a deadlock report.
    fn waits(&self) -> Vec<Wait> {
        let schedules = self.world.schedules;
        let mut waits = Vec::new();
        for (r, sched) in schedules.iter().enumerate() {
            let q = self.pc[r];
            let Some(phase) = sched.phases.get(q) else {
                continue;
            };
            for i in 0..phase.steps.len() {
                let Some(p) = self.partner[r][q][i] else {
                    continue;
                };
                if !self.reached(p.rank, p.phase) {
                    waits.push(Wait {
                        at: At {
                            rank: r,
                            phase: q,
                            step: i,
                        },
                        peer: p.rank,
                        peer_phase: p.phase,
                        peer_now: (self.pc[p.rank] < schedules[p.rank].phases.len())
                            .then_some(self.pc[p.rank]),
                    });
                }
            }
        }
        waits
    }

    fn check_results(&self) -> Result<(), Fault> {
        let n = self.pc.len();
        let all = if n == MAX_RANKS {
            u64::MAX
        } else {
            (1 << n) - 1
        };
        let output = |r: usize| &self.mem[r][1];
        for (r, expect) in self.world.expect.iter().enumerate() {
            let Some(expect) = expect else { continue };
            for (index, (&e, &got)) in expect.iter().zip(output(r)).enumerate() {
                if !e.holds(got, all) {
                    return Err(Fault::WrongResult {
                        rank: r,
                        index,
                        expected: e.to_string(),
                        got: got.to_string(),
                    });
                }
            }
        }
        if self.world.same_bits {
            let expr = |v: &Val| match *v {
                Val::Partial { expr, .. } => Some(expr),
                _ => None,
            };
            for (index, first) in output(0).iter().enumerate() {
                if let Some(b) = (1..n).find(|&b| expr(&output(b)[index]) != expr(first)) {
                    return Err(Fault::NotBitwiseIdentical { index, a: 0, b });
                }
            }
        }
        if self.world.barrier {
            if let Some(r) = (0..n).find(|&r| self.clock[r] != all) {
                return Err(Fault::BarrierIncomplete {
                    rank: r,
                    missing: all & !self.clock[r],
                });
            }
        }
        Ok(())
    }
}
