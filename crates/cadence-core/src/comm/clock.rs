//! How far each rank's wall clock is from rank 0's, measured at start-up so
//! that records of different hosts line up (`cadence doctor` compares when
//! ranks entered and left an operation).
//!
//! Ranks of one host read one clock: their offset is 0 by construction. On
//! a job across hosts, rank 0 plays [`ROUNDS`] ping-pongs of 8 bytes with the
//! first rank of every other host over the existing links; the leader
//! answers with its wall clock, and of the rounds the one with the shortest
//! round trip gives the estimate `theirs − (sent + received) / 2`, good to
//! half that round trip (the error bound recorded with it). Rank 0 then
//! broadcasts every rank's offset (its host leader's). Cost: `ROUNDS + 1`
//! round trips per other host and one broadcast of 16 bytes per rank, a few
//! milliseconds on 1 Gbit/s; clocks that drift apart later (hours, without
//! NTP) are not followed.

use super::calibrate::{broadcast, recv, send};
use super::Comm;
use crate::error::Result;
use crate::monitor::unix_ns;
use serde::Serialize;

/// Timed ping-pongs per host (one more is played first, untimed).
const ROUNDS: usize = 5;

/// This rank's clock against rank 0's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClockOffset {
    /// This rank's wall clock minus rank 0's, in nanoseconds: subtract it
    /// from this rank's times to put them on rank 0's clock.
    pub offset_ns: i64,
    /// Half the best round trip: the estimate is within this of the truth
    /// (0 for ranks on rank 0's host).
    pub error_ns: u64,
    /// "same host" (one clock, nothing to measure) or "ping-pong".
    pub method: &'static str,
}

impl ClockOffset {
    pub const SAME_HOST: ClockOffset = ClockOffset {
        offset_ns: 0,
        error_ns: 0,
        method: "same host",
    };
}

/// Collective: every rank's offset to rank 0's clock.
pub(super) fn measure(comm: &Comm) -> Result<ClockOffset> {
    let topo = comm.topology().clone();
    if topo.nhosts() < 2 {
        return Ok(ClockOffset::SAME_HOST);
    }
    let (me, n) = (comm.rank(), comm.nranks());
    let home = topo.host_of(0);
    // (offset, error) per rank, as rank 0 measured them.
    let mut table = vec![0u8; 16 * n];
    for h in (0..topo.nhosts()).filter(|&h| h != home) {
        let leader = topo.ranks_on(h)[0];
        if me == 0 {
            let (offset, error) = ping(comm, leader)?;
            for &r in topo.ranks_on(h) {
                table[16 * r..16 * r + 8].copy_from_slice(&offset.to_le_bytes());
                table[16 * r + 8..16 * r + 16].copy_from_slice(&error.to_le_bytes());
            }
        } else if me == leader {
            pong(comm, 0)?;
        }
    }
    comm.run(broadcast(&mut table))?;
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&table[i..i + 8]);
        b
    };
    if topo.host_of(me) == home {
        return Ok(ClockOffset::SAME_HOST);
    }
    Ok(ClockOffset {
        offset_ns: i64::from_le_bytes(word(16 * me)),
        error_ns: u64::from_le_bytes(word(16 * me + 8)),
        method: "ping-pong",
    })
}

/// Rank 0's side: (the peer's clock minus ours, half the best round trip).
fn ping(comm: &Comm, peer: usize) -> Result<(i64, u64)> {
    let mut best: Option<(u64, i64)> = None;
    let mut buf = [0u8; 8];
    for i in 0..=ROUNDS {
        let sent = unix_ns();
        comm.run(send(&sent.to_le_bytes(), peer))?;
        comm.run(recv(&mut buf, peer))?;
        let got = unix_ns();
        if i == 0 {
            continue; // warm-up: first touch of buffers and code
        }
        let theirs = u64::from_le_bytes(buf);
        let (offset, rtt) = estimate(sent, theirs, got);
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    let (rtt, offset) = best.expect("at least one timed round");
    Ok((offset, rtt / 2))
}

/// The leader's side of [`ping`]: answers each ping with its clock.
fn pong(comm: &Comm, lead: usize) -> Result<()> {
    let mut buf = [0u8; 8];
    for _ in 0..=ROUNDS {
        comm.run(recv(&mut buf, lead))?;
        comm.run(send(&unix_ns().to_le_bytes(), lead))?;
    }
    Ok(())
}

/// The offset of a clock that read `theirs` between our `sent` and `got`
/// (ns since the epoch), assuming equal delays both ways, and the round trip.
fn estimate(sent: u64, theirs: u64, got: u64) -> (i64, u64) {
    let rtt = got.saturating_sub(sent);
    let mid = sent as i128 + rtt as i128 / 2;
    ((theirs as i128 - mid) as i64, rtt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_is_the_midpoint_offset() {
        // Peer 5 s ahead, 100 µs each way.
        let sent = 1_000_000_000_000u64;
        let theirs = sent + 100_000 + 5_000_000_000;
        let got = sent + 200_000;
        assert_eq!(estimate(sent, theirs, got), (5_000_000_000, 200_000));
        // Behind, and an asymmetric path: the error stays within rtt / 2.
        let theirs = sent + 150_000 - 2_000_000_000;
        let (off, rtt) = estimate(sent, theirs, got);
        assert!((off + 2_000_000_000).unsigned_abs() <= rtt / 2, "{off}");
    }
}
