//! Channel order: the k-th Send a→b pairs with the k-th Recv at b from a,
//! and both carry the same number of elements.

use super::fault::{At, Fault};
use super::world::World;
use crate::schedule::ir::Step;

/// `partner[rank][phase][step]`: the step a transfer pairs with.
pub(super) type Partners = Vec<Vec<Vec<Option<At>>>>;

impl World<'_> {
    /// Pairs the k-th Send a→b with the k-th Recv at b from a. Returns, for
    /// every transfer step, the step it pairs with.
    pub(super) fn match_channels(&self) -> Result<Partners, Fault> {
        let n = self.schedules.len();
        // Per channel from*n + to: (step, length) of its sends and of its recvs.
        let mut sends: Vec<Vec<(At, usize)>> = vec![Vec::new(); n * n];
        let mut recvs: Vec<Vec<(At, usize)>> = vec![Vec::new(); n * n];
        let mut partner: Partners = Vec::with_capacity(n);
        for (r, sched) in self.schedules.iter().enumerate() {
            let mut of_rank = Vec::with_capacity(sched.phases.len());
            for (q, phase) in sched.phases.iter().enumerate() {
                for (i, step) in phase.steps.iter().enumerate() {
                    let at = At {
                        rank: r,
                        phase: q,
                        step: i,
                    };
                    match step {
                        Step::Send { peer, src } => sends[r * n + peer].push((at, src.len)),
                        Step::Recv { peer, dst, .. } => recvs[peer * n + r].push((at, dst.len)),
                        Step::Copy { .. } | Step::Reduce { .. } | Step::Fold { .. } => {}
                    }
                }
                of_rank.push(vec![None; phase.steps.len()]);
            }
            partner.push(of_rank);
        }
        for channel in 0..n * n {
            let (from, to) = (channel / n, channel % n);
            let (ss, rs) = (&sends[channel], &recvs[channel]);
            let unmatched = |at: At, is_send: bool| Fault::Unmatched {
                at,
                from,
                to,
                sends: ss.len(),
                recvs: rs.len(),
                is_send,
            };
            for k in 0..ss.len().max(rs.len()) {
                match (ss.get(k), rs.get(k)) {
                    (Some(&(send, send_len)), Some(&(recv, recv_len))) => {
                        if send_len != recv_len {
                            return Err(Fault::TransferLenMismatch {
                                send,
                                recv,
                                send_len,
                                recv_len,
                            });
                        }
                        partner[send.rank][send.phase][send.step] = Some(recv);
                        partner[recv.rank][recv.phase][recv.step] = Some(send);
                    }
                    (Some(&(send, _)), None) => return Err(unmatched(send, true)),
                    (None, Some(&(recv, _))) => return Err(unmatched(recv, false)),
                    (None, None) => {}
                }
            }
        }
        Ok(partner)
    }
}
