//! What a rank tells its same-host peers through the inbox header rather
//! than through a ring: the abort notice (first one wins), stall notices
//! (one slot per sender) and where the owner stands in its collectives.

use super::layout::{
    ABORT_MSG_MAX, OFF_ABORT_BLAMED_SIG, OFF_ABORT_DETECTOR, OFF_ABORT_DETECTOR_SIG,
    OFF_ABORT_FLAG, OFF_ABORT_LEN, OFF_ABORT_MISMATCH, OFF_ABORT_MSG, OFF_ABORT_ORIGIN,
    OFF_PROGRESS, OFF_STALL, STALL_CHAIN, STALL_LEN, STALL_SEQ, STALL_SLOT,
};
use super::{Inbox, Region};
use crate::transport::{AbortNotice, StallNotice, STALL_CHAIN_MAX};
use std::sync::atomic::Ordering;

/// Where a rank stands in its collectives, as its inbox tells same-host
/// peers: which one (its sequence number, 0 before the first), whether it is
/// inside it, and in which phase. A peer that times out waiting for this
/// rank reads it to say whether the rank is in the same operation, still in
/// an earlier one, or has not started it (busy outside the library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub seq: u64,
    pub running: bool,
    pub phase: u32,
}

impl Progress {
    const PHASE_MAX: u32 = (1 << 23) - 1;

    /// `seq` in the top 40 bits, the phase (saturated) in the next 23,
    /// `running` in bit 0.
    fn encode(self) -> u64 {
        (self.seq << 24) | ((self.phase.min(Self::PHASE_MAX) as u64) << 1) | self.running as u64
    }

    fn decode(w: u64) -> Progress {
        Progress {
            seq: w >> 24,
            running: w & 1 == 1,
            phase: ((w >> 1) as u32) & Self::PHASE_MAX,
        }
    }

    /// How `peer` stands toward this rank's collective `seq`, as a clause
    /// for the error of a wait on it.
    pub fn describe(self, peer: usize, seq: u64) -> String {
        use std::cmp::Ordering::*;
        match (self.seq.cmp(&seq), self.running) {
            (Equal, true) => format!("rank {peer} is in it too, in its phase {}", self.phase),
            (Equal, false) => format!("rank {peer} has finished it"),
            (Less, _) if self.seq == 0 => {
                format!("rank {peer} has not started it: it has run no collective yet")
            }
            (Less, true) => format!(
                "rank {peer} is still in an earlier collective (#{}, its phase {})",
                self.seq, self.phase
            ),
            (Less, false) => format!(
                "rank {peer} has not started it: its last collective (#{}{}) is done, \
                 so it is busy outside cadence",
                self.seq,
                // Every communicator's set-up ends with a barrier, its #1.
                if self.seq == 1 {
                    ", the set-up's barrier"
                } else {
                    ""
                }
            ),
            (Greater, _) => format!("rank {peer} is past it, in collective #{}", self.seq),
        }
    }
}

/// Where the owner of `inbox` stands (what it last published).
pub(super) fn read_progress(inbox: &Region) -> Progress {
    Progress::decode(inbox.atomic_u64(OFF_PROGRESS).load(Ordering::Relaxed))
}

impl Inbox {
    /// Says where this rank stands in its collectives, for peers that time
    /// out waiting for it (one relaxed store to a line only this rank
    /// writes: nobody reads it while things go well).
    #[inline]
    pub fn publish_progress(&self, p: Progress) {
        self.region
            .atomic_u64(OFF_PROGRESS)
            .store(p.encode(), Ordering::Relaxed);
    }

    /// The abort notice another rank left here, if any.
    pub fn abort_notice(&self) -> Option<AbortNotice> {
        read_abort(&self.region)
    }

    /// Cheap check used in every wait loop.
    #[inline]
    pub fn aborted(&self) -> bool {
        self.region
            .atomic_u32(OFF_ABORT_FLAG)
            .load(Ordering::Relaxed)
            == 2
    }
}

/// The abort notice left in an inbox, if any.
pub(super) fn read_abort(r: &Region) -> Option<AbortNotice> {
    if r.atomic_u32(OFF_ABORT_FLAG).load(Ordering::Acquire) != 2 {
        return None;
    }
    let origin = r.atomic_u32(OFF_ABORT_ORIGIN).load(Ordering::Relaxed) as usize;
    let len = (r.atomic_u32(OFF_ABORT_LEN).load(Ordering::Relaxed) as usize).min(ABORT_MSG_MAX);
    let detail = String::from_utf8_lossy(r.read(OFF_ABORT_MSG, len)).into_owned();
    let mismatch = (r.atomic_u32(OFF_ABORT_MISMATCH).load(Ordering::Relaxed) == 1).then(|| {
        (
            r.atomic_u64(OFF_ABORT_BLAMED_SIG).load(Ordering::Relaxed),
            r.atomic_u32(OFF_ABORT_DETECTOR).load(Ordering::Relaxed) as usize,
            r.atomic_u64(OFF_ABORT_DETECTOR_SIG).load(Ordering::Relaxed),
        )
    });
    Some(AbortNotice {
        origin,
        detail,
        mismatch,
    })
}

/// Writes an abort notice into an inbox unless one is already there.
pub fn post_abort(inbox: &Region, n: &AbortNotice) {
    let flag = inbox.atomic_u32(OFF_ABORT_FLAG);
    if flag
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        let text = n.wire_text();
        let bytes = text.as_bytes();
        inbox.write(OFF_ABORT_MSG, bytes);
        inbox
            .atomic_u32(OFF_ABORT_ORIGIN)
            .store(n.origin as u32, Ordering::Relaxed);
        inbox
            .atomic_u32(OFF_ABORT_LEN)
            .store(bytes.len() as u32, Ordering::Relaxed);
        if let Some((blamed_sig, detector, detector_sig)) = n.mismatch {
            inbox
                .atomic_u64(OFF_ABORT_BLAMED_SIG)
                .store(blamed_sig, Ordering::Relaxed);
            inbox
                .atomic_u64(OFF_ABORT_DETECTOR_SIG)
                .store(detector_sig, Ordering::Relaxed);
            inbox
                .atomic_u32(OFF_ABORT_DETECTOR)
                .store(detector as u32, Ordering::Relaxed);
            inbox
                .atomic_u32(OFF_ABORT_MISMATCH)
                .store(1, Ordering::Relaxed);
        }
        flag.store(2, Ordering::Release);
    }
}

/// Writes a stall notice into `inbox`'s stall slot `slot` (the sender's
/// local index).
pub(super) fn write_stall(inbox: &Region, slot: usize, n: &StallNotice) {
    let base = OFF_STALL + slot * STALL_SLOT;
    let len = n.chain.len().min(STALL_CHAIN_MAX);
    // Seqlock-style: readers ignore the slot while `len` is 0.
    inbox
        .atomic_u32(base + STALL_LEN)
        .store(0, Ordering::Release);
    inbox
        .atomic_u64(base + STALL_SEQ)
        .store(n.seq, Ordering::Relaxed);
    for (i, v) in n.chain.iter().take(len).enumerate() {
        inbox
            .atomic_u32(base + STALL_CHAIN + 4 * i)
            .store(*v, Ordering::Relaxed);
    }
    inbox
        .atomic_u32(base + STALL_LEN)
        .store(len as u32, Ordering::Release);
}

/// The stall notice in `inbox`'s stall slot `slot`, if one is there.
pub(super) fn read_stall(inbox: &Region, slot: usize) -> Option<StallNotice> {
    let base = OFF_STALL + slot * STALL_SLOT;
    let len =
        (inbox.atomic_u32(base + STALL_LEN).load(Ordering::Acquire) as usize).min(STALL_CHAIN_MAX);
    if len == 0 {
        return None;
    }
    let seq = inbox.atomic_u64(base + STALL_SEQ).load(Ordering::Relaxed);
    let chain = (0..len)
        .map(|i| {
            inbox
                .atomic_u32(base + STALL_CHAIN + 4 * i)
                .load(Ordering::Relaxed)
        })
        .collect();
    // An inbox serves one communicator: no tag is kept.
    Some(StallNotice {
        seq,
        comm: 0,
        chain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_and_says_where_the_peer_stands() {
        for p in [
            Progress {
                seq: 0,
                running: false,
                phase: 0,
            },
            Progress {
                seq: 7,
                running: true,
                phase: 3,
            },
            Progress {
                seq: (1 << 40) - 1,
                running: false,
                phase: Progress::PHASE_MAX,
            },
        ] {
            assert_eq!(Progress::decode(p.encode()), p);
        }
        let big = Progress {
            seq: 2,
            running: true,
            phase: u32::MAX,
        };
        assert_eq!(Progress::decode(big.encode()).phase, Progress::PHASE_MAX);
        let at = |seq, running, phase| {
            Progress {
                seq,
                running,
                phase,
            }
            .describe(1, 5)
        };
        assert_eq!(at(5, true, 2), "rank 1 is in it too, in its phase 2");
        assert_eq!(at(5, false, 0), "rank 1 has finished it");
        assert!(at(0, false, 0).contains("has run no collective yet"));
        assert!(at(4, true, 1).contains("still in an earlier collective (#4, its phase 1)"));
        assert!(at(4, false, 0).contains("has not started it"));
        assert!(at(6, true, 0).contains("past it, in collective #6"));
    }
}
