//! What a rank past its deadline does: it tells its peers whom it waits on
//! (a stall notice), learns whom they wait on, and after a short grace
//! fails, blaming the end of the wait-for chain rather than an innocent
//! peer in the middle.

use super::wait::Wait;
use super::{internal, Engine, LinkUse};
use crate::error::ErrorKind;
use crate::transport::{RecvJob, SendJob, StallNotice, STALL_CHAIN_MAX};
use std::time::Instant;

impl Engine {
    /// Called on each idle round past the deadline: publishes this rank's
    /// wait-for chain when it changed (else flushes what is queued of it),
    /// and fails once the diagnosis grace has run out.
    pub(super) fn past_deadline(
        &mut self,
        wait: &mut Wait,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        my_seq: u64,
        now: Instant,
    ) -> Result<(), ErrorKind> {
        let stalled_at = *wait.stalled_at.get_or_insert(now);
        // A receive waits for the sender to make the link; stuck, it asks
        // for one itself, so that stall notices travel between the two (the
        // peer may wait on a third rank: the chain must say so).
        if self.links.makes_links() {
            for (peer, _) in recvs.iter().filter(|(_, j)| j.active()) {
                if self.links.get(*peer).is_none() {
                    self.links.request(*peer, LinkUse::Light);
                }
            }
        }
        let chain = self.wait_chain(sends, recvs, my_seq);
        // Published again when a link came up since: its peer has not heard.
        if chain != wait.published || self.links.len() != wait.published_to {
            let notice = StallNotice {
                seq: my_seq,
                comm: self.comm_tag,
                chain: chain.clone(),
            };
            self.links.post_stall(&notice);
            if self.multipath {
                // What the links could not write at once, upkeep writes.
                self.links.stir_all();
            }
            wait.published = chain.clone();
            wait.published_to = self.links.len();
        } else {
            self.links.flush_control();
        }
        if now.duration_since(stalled_at) > self.diagnosis_grace {
            return Err(self.timeout_error(sends, recvs, wait.t0, &chain));
        }
        Ok(())
    }

    /// `[self, the peer we wait on, whom that peer waits on, ...]`, from the
    /// stall notices received so far (cycles cut, bounded length).
    fn wait_chain(
        &self,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        my_seq: u64,
    ) -> Vec<u32> {
        let first = recvs
            .iter()
            .find(|(_, j)| j.active())
            .map(|(p, _)| *p)
            .or_else(|| sends.iter().find(|(_, j)| j.active()).map(|(p, _)| *p));
        let mut chain = vec![self.rank as u32];
        let mut cur = first.map(|p| p as u32);
        // Follow each hop's own notice; a notice carries its sender's whole
        // known chain, so ranks we do not read from are covered too.
        while let Some(r) = cur.take() {
            if chain.contains(&r) || chain.len() >= STALL_CHAIN_MAX {
                break;
            }
            chain.push(r);
            let notice = self
                .links
                .read_stall(r as usize, self.comm_tag)
                .filter(|n| n.seq == my_seq && n.chain.first() == Some(&r));
            if let Some(n) = notice {
                for &next in &n.chain[1..] {
                    if chain.contains(&next) || chain.len() >= STALL_CHAIN_MAX {
                        break;
                    }
                    chain.push(next);
                }
                // Continue from the end of what it knew.
                if let Some(&last) = chain.last() {
                    if last != r {
                        chain.pop();
                        cur = Some(last);
                    }
                }
            }
        }
        chain
    }

    fn timeout_error(
        &self,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        t0: Instant,
        chain: &[u32],
    ) -> ErrorKind {
        let secs = t0.elapsed().as_secs_f64();
        if chain.len() > 2 {
            // We wait on a peer that itself waits: blame the end of the chain.
            let hops: Vec<String> = chain
                .windows(2)
                .map(|w| format!("rank {} waits on rank {}", w[0], w[1]))
                .collect();
            return ErrorKind::Timeout {
                peer: *chain.last().expect("non-empty") as usize,
                secs,
                what: hops.join(", "),
            };
        }
        // Blame whom we wait on for data first: a missing sender is the usual
        // culprit; a send that cannot drain means the receiver is not reading.
        if let Some((peer, j)) = recvs.iter().find(|(_, j)| j.active()) {
            return ErrorKind::Timeout {
                peer: *peer,
                secs,
                what: format!("receive of {} bytes, {} bytes arrived", j.sink.len(), j.got),
            };
        }
        if let Some((peer, j)) = sends.iter().find(|(_, j)| j.active()) {
            return ErrorKind::Timeout {
                peer: *peer,
                secs,
                what: format!("send of {} bytes, peer took {}", j.src.len(), j.sent),
            };
        }
        internal("timeout with nothing pending")
    }

    /// A schedule's timeout, with the phase it happened in and, where the
    /// link can tell, what the peer says of itself: that tells a rank busy
    /// outside the library (it has not started this operation) from one
    /// stuck in it.
    pub(super) fn in_phase(
        &self,
        e: ErrorKind,
        phase: usize,
        collective: bool,
        seq: u64,
    ) -> ErrorKind {
        match e {
            ErrorKind::Timeout { peer, secs, what } => {
                let peer_state = self
                    .links
                    .get(peer)
                    .filter(|_| collective)
                    .and_then(|l| l.describe_peer_progress(peer, seq))
                    .map(|s| format!("; {s}"))
                    .unwrap_or_default();
                ErrorKind::Timeout {
                    peer,
                    secs,
                    what: format!("{what}, in phase {phase}{peer_state}"),
                }
            }
            e => e,
        }
    }
}
