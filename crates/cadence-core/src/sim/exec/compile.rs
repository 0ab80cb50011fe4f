//! A rank's schedule compiled for the executor: per phase the work of its
//! local steps and its transfers, in a compact form (so thousands of
//! ranks' schedules fit in memory), and the look-ahead's hazard rule on it.

use crate::schedule::hazard::{Access, Region};
use crate::schedule::{Buf, Schedule, Span, Step};

/// One transfer of a compiled schedule. Offsets are in elements within a
/// buffer (`buf`: Input 0, Output 1, Scratch 2), for the hazard check.
#[derive(Clone, Copy, Debug)]
pub(super) struct Xfer {
    pub(super) peer: u32,
    pub(super) off: u32,
    pub(super) len: u32,
    pub(super) with_off: u32,
    pub(super) send: bool,
    pub(super) reduce: bool,
    pub(super) buf: u8,
    pub(super) with_buf: u8,
}

/// A rank's schedule as the executor needs it: per phase the elements its
/// local steps touch and where its transfers start in `xfers`.
pub(super) struct Compiled {
    pub(super) first: Vec<u32>,
    pub(super) local: Vec<f64>,
    /// Per phase: whether it folds (`Step::Fold`), so that neither it nor
    /// the phase after it is admitted ahead, as in the engine.
    pub(super) folds: Vec<bool>,
    pub(super) xfers: Vec<Xfer>,
}

impl Compiled {
    pub(super) fn nphases(&self) -> usize {
        self.first.len()
    }

    /// The schedules of `units` one after another (a rank's calls in
    /// order), and the phase index at which each unit ends.
    pub(super) fn sequence(units: &[&Compiled]) -> (Compiled, Vec<usize>) {
        let mut out = Compiled {
            first: Vec::new(),
            local: Vec::new(),
            folds: Vec::new(),
            xfers: Vec::new(),
        };
        let mut ends = Vec::with_capacity(units.len());
        for u in units {
            let base = out.xfers.len() as u32;
            out.first.extend(u.first.iter().map(|&f| f + base));
            out.local.extend(&u.local);
            out.folds.extend(&u.folds);
            out.xfers.extend(&u.xfers);
            ends.push(out.first.len());
        }
        (out, ends)
    }
    pub(super) fn span(&self, p: usize) -> std::ops::Range<usize> {
        let end = self
            .first
            .get(p + 1)
            .map_or(self.xfers.len(), |&e| e as usize);
        self.first[p] as usize..end
    }
}

fn buf_id(b: Buf) -> u8 {
    match b {
        Buf::Input => 0,
        Buf::Output => 1,
        Buf::Scratch => 2,
    }
}

fn small(x: usize, what: &str) -> Result<u32, String> {
    u32::try_from(x).map_err(|_| format!("{what} {x} is beyond what the simulator indexes (2^32)"))
}

pub(super) fn compile(s: &Schedule) -> Result<Compiled, String> {
    let mut c = Compiled {
        first: Vec::with_capacity(s.phases.len()),
        local: Vec::with_capacity(s.phases.len()),
        folds: Vec::with_capacity(s.phases.len()),
        xfers: Vec::new(),
    };
    for phase in &s.phases {
        c.first.push(small(c.xfers.len(), "transfer count")?);
        let mut local = 0usize;
        // A receive that a fold reduces as it lands costs the CPU what a
        // reducing receive does, and is modeled as one (its operand the
        // fold's destination).
        let folded = |span: Span| {
            phase.steps.iter().find_map(|st| match *st {
                Step::Fold { src, dst } if src == span => Some(dst),
                _ => None,
            })
        };
        for step in &phase.steps {
            let (peer, span, send, with) = match *step {
                Step::Send { peer, src } => (peer, src, true, None),
                Step::Recv {
                    peer,
                    dst,
                    reduce_with,
                } => (peer, dst, false, reduce_with.or_else(|| folded(dst))),
                Step::Copy { src, .. } | Step::Reduce { src, .. } => {
                    local += src.len;
                    continue;
                }
                Step::Fold { .. } => continue,
            };
            c.xfers.push(Xfer {
                peer: small(peer, "rank")?,
                off: small(span.off, "offset")?,
                len: small(span.len, "length")?,
                with_off: small(with.map_or(0, |w| w.off), "offset")?,
                send,
                reduce: with.is_some(),
                buf: buf_id(span.buf),
                with_buf: with.map_or(0, |w| buf_id(w.buf)),
            });
        }
        c.local.push(local as f64);
        c.folds
            .push(phase.steps.iter().any(|st| matches!(st, Step::Fold { .. })));
    }
    Ok(c)
}

impl Xfer {
    /// The memory the transfer touches: buffers by kind (Input, Output and
    /// Scratch are separate memories here, see `schedule::hazard`), offsets
    /// and lengths in elements.
    fn access(&self) -> Access {
        let region = |buf: u8, off: u32| Region::new(buf.into(), off as usize, self.len as usize);
        if self.send {
            Access::Send {
                src: region(self.buf, self.off),
            }
        } else {
            Access::Recv {
                dst: region(self.buf, self.off),
                with: self.reduce.then(|| region(self.with_buf, self.with_off)),
            }
        }
    }

    /// Whether the transfer, held, may start ahead of its phase at all: an
    /// empty one carries only order and waits for its phase.
    pub(super) fn carries_data(&self) -> bool {
        self.access().carries_data()
    }
}

/// Whether `earlier`, unfinished, keeps the held transfer `held` of the
/// next phase from starting (the rule of `schedule::hazard`, as the engine
/// applies it).
pub(super) fn blocks(earlier: &Xfer, held: &Xfer) -> bool {
    earlier.access().conflicts(&held.access())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Algo, Phase};

    /// One phase's transfers, compiled.
    fn xfers(steps: Vec<Step>) -> Vec<Xfer> {
        let s = Schedule {
            rank: 0,
            nranks: 2,
            algo: Algo::Direct,
            phases: vec![Phase { steps }],
            scratch_len: 8,
        };
        compile(&s).unwrap().xfers
    }

    fn send(src: Span) -> Step {
        Step::Send { peer: 1, src }
    }

    fn recv(dst: Span, reduce_with: Option<Span>) -> Step {
        Step::Recv {
            peer: 1,
            dst,
            reduce_with,
        }
    }

    /// Buffers are memories, offsets elements; a reducing receive reads its
    /// operand, and a receive a fold reduces as it lands is modeled as one
    /// reducing with the fold's destination.
    #[test]
    fn a_held_transfer_is_blocked_by_the_hazard_rule_on_buffers() {
        let current = xfers(vec![
            recv(Span::output(0, 4), Some(Span::input(0, 4))),
            send(Span::scratch(0, 4)),
            recv(Span::scratch(4, 4), None),
            Step::Fold {
                src: Span::scratch(4, 4),
                dst: Span::output(4, 4),
            },
        ]);
        let blocked = |step: Step| {
            let held = xfers(vec![step])[0];
            current.iter().any(|e| blocks(e, &held))
        };
        assert!(
            blocked(send(Span::output(2, 1))),
            "reads what a receive writes"
        );
        assert!(
            !blocked(send(Span::input(0, 4))),
            "reads what a receive reads"
        );
        assert!(!blocked(send(Span::input(4, 4))));
        assert!(
            blocked(recv(Span::scratch(3, 2), None)),
            "writes what a send reads"
        );
        assert!(
            blocked(recv(Span::output(6, 1), None)),
            "writes what a fold's receive reduces into"
        );
        assert!(!blocked(recv(Span::output(8, 0), None)));
        let empty = xfers(vec![send(Span::output(0, 0))])[0];
        assert!(!empty.carries_data());
        assert!(xfers(vec![send(Span::output(0, 1))])[0].carries_data());
    }
}
