//! The checks on one rank's phases that need no run: bounds, writes to
//! Input (and to a reduce's Output off the root), operand lengths, peers,
//! and overlaps within a phase, on physical memory: in place Input *is*
//! Output. The transfers of a phase run at the same time, so no two may
//! conflict by the rule of `schedule::hazard`, the one the engine's
//! lookahead applies across phases.

use super::fault::{At, Fault};
use super::world::World;
use super::Layout;
use crate::schedule::hazard::{Operand, Region};
use crate::schedule::ir::{Buf, Span, Step};

impl World<'_> {
    /// Bounds, writes to Input, operand lengths, peers, and overlaps within a
    /// phase, on physical memory.
    pub(super) fn check_structure(&self, layout: Layout) -> Result<(), Fault> {
        let n = self.schedules.len();
        for (r, sched) in self.schedules.iter().enumerate() {
            let (input_len, output_len) = self.lens[r];
            let buf_len = |buf: Buf| match buf {
                Buf::Input => input_len,
                Buf::Output => output_len,
                Buf::Scratch => sched.scratch_len,
            };
            for (q, phase) in sched.phases.iter().enumerate() {
                // The phase's transfer spans: (step, span, written).
                let mut transfers: Vec<(usize, Span, bool)> = Vec::new();
                // The phase's folds: (step, src, dst).
                let mut folds: Vec<(usize, Span, Span)> = Vec::new();
                for (i, step) in phase.steps.iter().enumerate() {
                    let at = At {
                        rank: r,
                        phase: q,
                        step: i,
                    };
                    let in_bounds = |span: &Span| {
                        let len = buf_len(span.buf);
                        match span.off.checked_add(span.len) {
                            Some(end) if end <= len => Ok(()),
                            _ => Err(Fault::OutOfBounds {
                                at,
                                span: *span,
                                buf_len: len,
                            }),
                        }
                    };
                    let non_root_reduce = self.reduce_root.is_some_and(|root| root != r);
                    let writable = |span: &Span| {
                        if span.buf == Buf::Input {
                            Err(Fault::WritesInput { at })
                        } else if span.buf == Buf::Output && non_root_reduce && span.len > 0 {
                            Err(Fault::WritesNonRootOutput { at })
                        } else {
                            Ok(())
                        }
                    };
                    let same_len = |a: &Span, b: &Span| {
                        if a.len == b.len {
                            Ok(())
                        } else {
                            Err(Fault::LenMismatch {
                                at,
                                a: a.len,
                                b: b.len,
                            })
                        }
                    };
                    let overlap = |what: &str, a: &Span, b: &Span| Fault::Overlap {
                        at,
                        what: format!("{what}: {a:?} and {b:?} overlap ({layout})"),
                    };
                    match step {
                        Step::Send { peer, src } => {
                            check_peer(at, *peer, n)?;
                            in_bounds(src)?;
                            transfers.push((i, *src, false));
                        }
                        Step::Recv {
                            peer,
                            dst,
                            reduce_with,
                        } => {
                            check_peer(at, *peer, n)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            transfers.push((i, *dst, true));
                            if let Some(a) = reduce_with {
                                in_bounds(a)?;
                                same_len(a, dst)?;
                                let (pa, pd) = (phys(a, layout), phys(dst, layout));
                                if pa != pd && pa.overlaps(&pd) {
                                    return Err(overlap(
                                        "reduce_with partly overlaps the destination",
                                        a,
                                        dst,
                                    ));
                                }
                                transfers.push((i, *a, false));
                            }
                        }
                        Step::Copy { src, dst } => {
                            in_bounds(src)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            same_len(src, dst)?;
                            let (ps, pd) = (phys(src, layout), phys(dst, layout));
                            // In place, copying Input[i] to Output[i] is
                            // copying memory onto itself: a no-op the engine
                            // must skip, not an overlap.
                            let aliased_noop = src.buf != dst.buf && ps == pd;
                            if ps.overlaps(&pd) && !aliased_noop {
                                return Err(overlap("copy", src, dst));
                            }
                        }
                        Step::Reduce { src, dst } => {
                            in_bounds(src)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            same_len(src, dst)?;
                            if phys(src, layout).overlaps(&phys(dst, layout)) {
                                return Err(overlap("reduce", src, dst));
                            }
                        }
                        Step::Fold { src, dst } => {
                            in_bounds(src)?;
                            in_bounds(dst)?;
                            writable(dst)?;
                            same_len(src, dst)?;
                            if phys(src, layout).overlaps(&phys(dst, layout)) {
                                return Err(overlap("fold", src, dst));
                            }
                            folds.push((i, *src, *dst));
                        }
                    }
                }
                check_folds(r, q, &phase.steps, &folds, &transfers, layout)?;
                // The phase's transfers all run at the same time: a span
                // written by a Recv conflicts with no span of another one.
                for &(i, written, is_write) in &transfers {
                    if !is_write {
                        continue;
                    }
                    let w = operand(&written, true, layout);
                    if let Some(&(j, other, _)) =
                        transfers.iter().find(|&&(j, other, other_written)| {
                            j != i && w.conflicts(&operand(&other, other_written, layout))
                        })
                    {
                        return Err(Fault::Overlap {
                            at: At {
                                rank: r,
                                phase: q,
                                step: i,
                            },
                            what: format!(
                                "Recv into {written:?} overlaps {other:?} of step {j}, \
                                 which runs at the same time ({layout})"
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// The rules on a phase's folds (`ir.rs`): each reads the whole landing
/// span of one non-reducing `Recv` of the phase, no two read the same one,
/// and each writes a span that no transfer of the phase touches except the
/// one reducing `Recv` into exactly that span, and that no other fold reads
/// and every other fold writes exactly or not at all.
fn check_folds(
    rank: usize,
    phase: usize,
    steps: &[Step],
    folds: &[(usize, Span, Span)],
    transfers: &[(usize, Span, bool)],
    layout: Layout,
) -> Result<(), Fault> {
    let fault = |step: usize, what: String| Fault::Overlap {
        at: At { rank, phase, step },
        what: format!("{what} ({layout})"),
    };
    for (k, &(i, src, dst)) in folds.iter().enumerate() {
        let lands = steps
            .iter()
            .any(|s| matches!(s, Step::Recv { dst: d, reduce_with: None, .. } if *d == src));
        if !lands {
            return Err(fault(
                i,
                format!("Fold from {src:?}: no Recv of its phase lands exactly that span"),
            ));
        }
        let (ps, pd) = (phys(&src, layout), phys(&dst, layout));
        for &(j, other, _) in transfers {
            if !phys(&other, layout).overlaps(&pd) {
                continue;
            }
            let reduces_into_dst = matches!(
                steps[j],
                Step::Recv { dst: d, reduce_with: Some(_), .. } if d == dst
            );
            if !reduces_into_dst {
                return Err(fault(
                    i,
                    format!(
                        "Fold into {dst:?} overlaps {other:?} of step {j}, which runs meanwhile"
                    ),
                ));
            }
        }
        for &(j, src2, dst2) in &folds[k + 1..] {
            let (ps2, pd2) = (phys(&src2, layout), phys(&dst2, layout));
            if ps2 == ps {
                return Err(fault(j, format!("two folds read {src2:?}")));
            }
            if pd2.overlaps(&ps) || ps2.overlaps(&pd) {
                return Err(fault(
                    j,
                    format!("Fold into {dst2:?} and fold from {src:?} overlap one another"),
                ));
            }
            if pd2 != pd && pd2.overlaps(&pd) {
                return Err(fault(
                    j,
                    format!("Fold into {dst2:?} partly overlaps fold into {dst:?}"),
                ));
            }
        }
    }
    Ok(())
}

fn check_peer(at: At, peer: usize, n: usize) -> Result<(), Fault> {
    if peer < n && peer != at.rank {
        Ok(())
    } else {
        Err(Fault::BadPeer { at, peer })
    }
}

/// Which physical memory a buffer is in the layout: 0 = Input, 1 = Output,
/// 2 = Scratch, with Input mapped onto Output in place.
pub(super) fn mem_of(buf: Buf, layout: Layout) -> usize {
    match (buf, layout) {
        (Buf::Input, Layout::Distinct) => 0,
        (Buf::Input, Layout::InPlace) | (Buf::Output, _) => 1,
        (Buf::Scratch, _) => 2,
    }
}

/// A span in physical memory (see [`mem_of`]).
fn phys(span: &Span, layout: Layout) -> Region {
    Region::new(mem_of(span.buf, layout), span.off, span.len)
}

/// A transfer's span as an operand of the hazard rule.
fn operand(span: &Span, written: bool, layout: Layout) -> Operand {
    Operand {
        region: phys(span, layout),
        written,
    }
}
