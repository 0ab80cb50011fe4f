//! How far each rank's wall clock is from rank 0's, measured at start-up so
//! that records of different hosts line up (`cadence doctor` compares when
//! ranks entered and left an operation).
//!
//! Ranks of one host read one clock: their offset is 0 by construction, and
//! so is that of emulated hosts on rank 0's machine (one wall clock). On a
//! job across hosts, the other hosts' first ranks form a binary tree rooted
//! at rank 0 (hosts in order, rank 0's first): each parent plays [`ROUNDS`]
//! ping-pongs of 8 bytes with each child; the child answers with its wall
//! clock, and of the rounds the one with the shortest round trip gives the
//! estimate `theirs − (sent + received) / 2`, good to half that round trip.
//! The parent sends the child its offset to rank 0 (the parent's own plus
//! that estimate) with the error bound (the parent's plus half the round
//! trip: errors add along the path, ⌈log₂ hosts⌉ hops at most). Each leader
//! then tells its host's ranks. Cost per rank: at most three links and
//! 2 · (`ROUNDS` + 1) round trips, whatever the number of hosts (rank 0 once
//! played them with every host, and held a link to each); a few
//! milliseconds per tree level on 1 Gbit/s. Clocks that drift apart later
//! (hours, without NTP) are not followed.

use super::calibrate::{recv, send};
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
    /// "same host" or "same machine" (one clock, nothing to measure), or
    /// "ping-pong".
    pub method: &'static str,
}

impl ClockOffset {
    pub const SAME_HOST: ClockOffset = ClockOffset {
        offset_ns: 0,
        error_ns: 0,
        method: "same host",
    };
    /// An emulated host on rank 0's machine (its boot id).
    pub const SAME_MACHINE: ClockOffset = ClockOffset {
        offset_ns: 0,
        error_ns: 0,
        method: "same machine",
    };
}

/// Collective: every rank's offset to rank 0's clock.
pub(super) fn measure(comm: &Comm) -> Result<ClockOffset> {
    let topo = comm.topology().clone();
    if topo.nhosts() < 2 {
        return Ok(ClockOffset::SAME_HOST);
    }
    let me = comm.rank();
    let home = topo.host_of(0);
    // Emulated hosts on rank 0's machine read its clock (the wall clock is
    // not namespaced): nothing to measure for them.
    let peers = &comm.shared.peers;
    let on_home_machine = |r: usize| !peers.machine(0).is_empty() && peers.same_machine(r, 0);
    if topo.host_of(me) != home && on_home_machine(me) {
        return Ok(ClockOffset::SAME_MACHINE);
    }
    // Hosts in tree order: rank 0's first, then the others in order.
    let hosts: Vec<usize> = std::iter::once(home)
        .chain((0..topo.nhosts()).filter(|&h| h != home && !on_home_machine(topo.leader(h))))
        .collect();
    if hosts.len() < 2 {
        return Ok(ClockOffset::SAME_HOST);
    }
    let leader = |i: usize| {
        if i == 0 {
            0
        } else {
            topo.leader(hosts[i])
        }
    };
    let my_host = topo.host_of(me);
    let i = hosts
        .iter()
        .position(|&h| h == my_host)
        .expect("every host listed");
    let mine = if me == leader(i) {
        // (offset, error) against rank 0: 0 at the root, else the parent's
        // plus what the parent measured of this leader.
        let mut at = (0i64, 0u64);
        if i > 0 {
            let parent = leader((i - 1) / 2);
            pong(comm, parent)?;
            let mut buf = [0u8; 16];
            comm.run(recv(&mut buf, parent))?;
            at = (
                i64::from_le_bytes(buf[..8].try_into().unwrap()),
                u64::from_le_bytes(buf[8..].try_into().unwrap()),
            );
        }
        for child in [2 * i + 1, 2 * i + 2]
            .into_iter()
            .filter(|&c| c < hosts.len())
        {
            let (offset, error) = ping(comm, leader(child))?;
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&at.0.wrapping_add(offset).to_le_bytes());
            buf[8..].copy_from_slice(&(at.1 + error).to_le_bytes());
            comm.run(send(&buf, leader(child)))?;
        }
        // The host's other ranks read the same clock.
        let mut buf = [0u8; 16];
        buf[..8].copy_from_slice(&at.0.to_le_bytes());
        buf[8..].copy_from_slice(&at.1.to_le_bytes());
        for &r in topo.ranks_on(my_host).iter().filter(|&&r| r != me) {
            comm.run(send(&buf, r))?;
        }
        at
    } else {
        let mut buf = [0u8; 16];
        comm.run(recv(&mut buf, leader(i)))?;
        (
            i64::from_le_bytes(buf[..8].try_into().unwrap()),
            u64::from_le_bytes(buf[8..].try_into().unwrap()),
        )
    };
    if my_host == home {
        return Ok(ClockOffset::SAME_HOST);
    }
    Ok(ClockOffset {
        offset_ns: mine.0,
        error_ns: mine.1,
        method: "ping-pong",
    })
}

/// The parent's side: (the child's clock minus ours, half the best round
/// trip).
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

/// The child's side of [`ping`]: answers each ping with its clock.
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
