//! From measured rates to the model the path finder reads: groups of hosts
//! that share a bottleneck, and what each group's bottleneck carries.
//!
//! Pure functions over numbers (no network), so they are tested on
//! synthetic measurements here and on the emulated cluster by the profiler
//! (`comm/profile.rs`).
//!
//! - **Alone rates** `rates[a][b]`: bytes/s of one flow a → b with nothing
//!   else on the network.
//! - **NIC estimate** of a host: the fastest it sent (received) alone to
//!   (from) any partner. A pair whose alone rate is well below what both
//!   ends' NICs did elsewhere ([`FAST`]) is held back by something between
//!   them: an uplink.
//! - **Groups**: hosts that reach each other at their NICs' speed: cliques
//!   of the "fast" relation. A host alone in its rack is indistinguishable,
//!   by any flow, from a host with a slower NIC, and the path finder treats
//!   both alike.
//! - **Group capacity**: what concurrent flows out of (into) a group carried
//!   together, measured under load, when that is below the sum of the same
//!   flows alone ([`SHARED`]): a shared bottleneck. Otherwise `None` (not a
//!   bottleneck at the load a ring puts on it).

/// A pair at or above this fraction of its ends' NIC estimates is "fast".
pub const FAST: f64 = 0.8;
/// Flows measured together that reach less than this fraction of their
/// alone rates share a bottleneck.
pub const SHARED: f64 = 0.85;

/// An n × n rate matrix from `rate(a, b)` for every ordered pair a ≠ b;
/// the diagonal is 0 (a host does not send to itself).
pub fn pair_rates(n: usize, mut rate: impl FnMut(usize, usize) -> f64) -> Vec<Vec<f64>> {
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| if a == b { 0.0 } else { rate(a, b) })
                .collect()
        })
        .collect()
}

/// (out, in) per host: the fastest alone rate it sent and received.
pub fn nic_estimates(rates: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
    let n = rates.len();
    let best = |it: &mut dyn Iterator<Item = f64>| it.fold(0.0f64, f64::max);
    let out = (0..n)
        .map(|a| best(&mut (0..n).filter(|&b| b != a).map(|b| rates[a][b])))
        .collect();
    let inn = (0..n)
        .map(|b| best(&mut (0..n).filter(|&a| a != b).map(|a| rates[a][b])))
        .collect();
    (out, inn)
}

/// `fast[a][b]`: both directions of the pair run at (near) NIC speed.
pub fn fast_pairs(rates: &[Vec<f64>]) -> Vec<Vec<bool>> {
    let n = rates.len();
    let (out, inn) = nic_estimates(rates);
    let fast = |a: usize, b: usize| {
        let limit = out[a].min(inn[b]);
        limit > 0.0 && rates[a][b] >= FAST * limit
    };
    (0..n)
        .map(|a| (0..n).map(|b| a != b && fast(a, b) && fast(b, a)).collect())
        .collect()
}

/// Hosts that reach each other at NIC speed, as groups (each sorted,
/// ordered by their lowest host). Greedy: the lowest host left starts a
/// group, and every later host fast with all of the group's members joins
/// it. A set where a reaches b and b reaches c fast, but not a and c, is
/// split into cliques: its hosts share no single bottleneck.
pub fn groups_from_rates(rates: &[Vec<f64>]) -> Vec<Vec<usize>> {
    let fast = fast_pairs(rates);
    let mut left: Vec<usize> = (0..rates.len()).collect();
    let mut groups = Vec::new();
    while let Some(&seed) = left.first() {
        let mut group = vec![seed];
        for &h in &left[1..] {
            if group.iter().all(|&g| fast[h][g]) {
                group.push(h);
            }
        }
        left.retain(|h| !group.contains(h));
        groups.push(group);
    }
    groups
}

/// One flow from each of min(len) senders to a distinct receiver, so no
/// host's NIC carries two flows of the round: what slows them is shared
/// further in.
pub fn spread_flows(src: &[usize], dst: &[usize]) -> Vec<(usize, usize)> {
    src.iter().copied().zip(dst.iter().copied()).collect()
}

/// A group's bottleneck from one round of its k flows together (equal
/// sizes): k times the slowest flow's rate, i.e. all their bytes over the
/// time the last one took, when that falls short of their alone rates' sum
/// ([`SHARED`]); else `None`. (The sum of the flows' own rates overstates a
/// shared link: TCP does not share it fairly, and a flow that finishes early
/// leaves it to the others.) A flow under half the flows' median rate is
/// left out of "slowest": a bottleneck shares alike, so that flow was
/// stalled by a loss (a retransmission timeout is hundreds of ms, a flow
/// tens), and the link sat idle meanwhile. A single flow cannot tell an
/// uplink from a NIC: `None`.
pub fn capacity(measured: &[f64], alone: &[f64]) -> Option<f64> {
    if measured.len() < 2 {
        return None;
    }
    let mut sorted = measured.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let slowest = sorted
        .iter()
        .copied()
        .find(|&r| r >= median / 2.0)
        .unwrap_or(median);
    let total = measured.len() as f64 * slowest;
    let ideal: f64 = alone.iter().sum();
    (total < SHARED * ideal).then_some(total)
}

/// The flows of a ring through `order` (none for fewer than two hosts).
pub fn ring_flows(order: &[usize]) -> Vec<(usize, usize)> {
    let n = order.len();
    if n < 2 {
        return Vec::new();
    }
    (0..n).map(|i| (order[i], order[(i + 1) % n])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GBIT: f64 = 1e9 / 8.0;
    const UPLINK: f64 = 250e6 / 8.0;

    /// A small deterministic generator (xorshift), so the tests need no
    /// dependency and always see the same placements.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Alone rates of a leaf/spine model: NIC speed inside a rack, the
    /// uplink across, each with up to 3 % measurement noise.
    fn rack_rates(rack_of: &[usize], nic: &[f64], uplink: f64, rng: &mut Rng) -> Vec<Vec<f64>> {
        pair_rates(rack_of.len(), |a, b| {
            let mut r = nic[a].min(nic[b]);
            if rack_of[a] != rack_of[b] {
                r = r.min(uplink);
            }
            r * (1.0 - 0.03 * rng.unit())
        })
    }

    fn as_groups(rack_of: &[usize]) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (h, &r) in rack_of.iter().enumerate() {
            match groups.iter_mut().find(|g| rack_of[g[0]] == r) {
                Some(g) => g.push(h),
                None => groups.push(vec![h]),
            }
        }
        groups
    }

    #[test]
    fn groups_are_recovered_from_alone_rates_of_random_placements() {
        let mut rng = Rng(14);
        for _ in 0..500 {
            let n = 4 + rng.below(5);
            let racks = if n >= 6 { 2 + rng.below(2) } else { 2 };
            // Every rack used, hosts scattered at random.
            let mut rack_of: Vec<usize> = (0..n).map(|h| h % racks).collect();
            for i in (1..n).rev() {
                rack_of.swap(i, rng.below(i + 1));
            }
            let nic: Vec<f64> = (0..n)
                .map(|_| GBIT * [1.0, 1.0, 0.5][rng.below(3)])
                .collect();
            let slowest = nic.iter().copied().fold(f64::INFINITY, f64::min);
            let uplink = slowest * (0.1 + 0.4 * rng.unit());
            let rates = rack_rates(&rack_of, &nic, uplink, &mut rng);
            assert_eq!(
                groups_from_rates(&rates),
                as_groups(&rack_of),
                "{rack_of:?} {nic:?}"
            );
        }
    }

    #[test]
    fn without_a_slower_uplink_there_is_one_group() {
        let rates = rack_rates(&[0, 1, 0, 1], &[GBIT; 4], 2.0 * GBIT, &mut Rng(1));
        assert_eq!(groups_from_rates(&rates), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn a_chain_of_fast_pairs_is_split_into_cliques() {
        // 0-1 and 1-2 fast, 0-2 slow: no single group holds all three.
        let f = GBIT;
        let s = UPLINK;
        let rates = vec![vec![0.0, f, s], vec![f, 0.0, f], vec![s, f, 0.0]];
        assert_eq!(groups_from_rates(&rates), vec![vec![0, 1], vec![2]]);
    }

    #[test]
    fn a_shared_bottleneck_is_a_total_below_the_flows_alone() {
        assert_eq!(
            capacity(&[UPLINK / 2.0, UPLINK / 2.0], &[UPLINK, UPLINK]),
            Some(UPLINK)
        );
        assert_eq!(capacity(&[GBIT, 0.97 * GBIT], &[GBIT, GBIT]), None);
        // Unfair sharing: the slowest flow sets the total.
        assert_eq!(
            capacity(&[0.7 * UPLINK, 0.5 * UPLINK], &[UPLINK, UPLINK]),
            Some(UPLINK)
        );
        assert_eq!(capacity(&[UPLINK], &[UPLINK]), None);
        // A stalled flow (a retransmission timeout) is not the bottleneck's
        // share: the others are.
        assert_eq!(
            capacity(
                &[UPLINK / 3.0, 0.04 * UPLINK, UPLINK / 3.0],
                &[GBIT, GBIT, GBIT]
            ),
            Some(UPLINK)
        );
        assert_eq!(spread_flows(&[0, 2], &[1, 3, 5]), vec![(0, 1), (2, 3)]);
        assert_eq!(ring_flows(&[0, 2, 1]), vec![(0, 2), (2, 1), (1, 0)]);
        assert!(ring_flows(&[4]).is_empty());
    }
}
