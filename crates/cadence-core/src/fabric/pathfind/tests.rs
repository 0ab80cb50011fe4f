use super::grouped::{group_members, GroupTables};
use super::local_search::{route_width, HostRoute};
use super::paths::{exact_paths_from, heuristic_path, local_rates};
use super::*;
use std::time::Instant;

/// splitmix64: tiny and deterministic, so every run tests the same
/// instances.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    /// Uniform in lo..=hi.
    fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// Groups renumbered 0.. by first appearance, so every number is used.
fn compact(raw: &[usize]) -> (Vec<usize>, usize) {
    let mut seen: Vec<usize> = Vec::new();
    let group_of = raw
        .iter()
        .map(|g| match seen.iter().position(|s| s == g) {
            Some(i) => i,
            None => {
                seen.push(*g);
                seen.len() - 1
            }
        })
        .collect();
    (group_of, seen.len())
}

/// How a group cap is drawn, given the cluster's smallest NIC rate.
type CapRule = fn(&mut SplitMix, f64) -> f64;

/// The rack model: hosts dealt at random to 1..=max_groups racks, a NIC
/// rate per host, uplink caps per rack; a pair gets the least of its
/// NICs (and, across racks, of the caps), times a jitter in [0.95, 1).
fn rack_fabric(rng: &mut SplitMix, group_of: Vec<usize>, ngroups: usize, cap: CapRule) -> Fabric {
    let n = group_of.len();
    let nic: Vec<f64> = (0..n).map(|_| rng.uniform(0.5, 1.0) * 1e8).collect();
    let nic_min = nic.iter().copied().fold(f64::INFINITY, f64::min);
    let group_out: Vec<f64> = (0..ngroups).map(|_| cap(rng, nic_min)).collect();
    let group_in: Vec<f64> = (0..ngroups).map(|_| cap(rng, nic_min)).collect();
    let rate = (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    let (ga, gb) = (group_of[a], group_of[b]);
                    let mut base = nic[a].min(nic[b]);
                    if ga != gb {
                        base = base.min(group_out[ga]).min(group_in[gb]);
                    }
                    if a == b {
                        0.0
                    } else {
                        base * rng.uniform(0.95, 1.0)
                    }
                })
                .collect()
        })
        .collect();
    Fabric {
        rate,
        group_of,
        group_out,
        group_in,
    }
}

fn random_racks(rng: &mut SplitMix, n: usize, max_groups: usize, cap: CapRule) -> Fabric {
    let target = rng.int(1, max_groups);
    let raw: Vec<usize> = (0..n).map(|_| rng.int(0, target - 1)).collect();
    let (group_of, ngroups) = compact(&raw);
    let f = rack_fabric(rng, group_of, ngroups, cap);
    assert_eq!(f.check(), Ok(()));
    f
}

/// No structure: every rate drawn on its own (half the time from four
/// values, so ties abound), 1-3 groups with caps that may be unlimited.
fn arbitrary_fabric(rng: &mut SplitMix, n: usize) -> Fabric {
    let target = rng.int(1, 3);
    let raw: Vec<usize> = (0..n).map(|_| rng.int(0, target - 1)).collect();
    let (group_of, ngroups) = compact(&raw);
    let coarse = rng.next().is_multiple_of(2);
    let rate = (0..n)
        .map(|_| {
            (0..n)
                .map(|_| {
                    if coarse {
                        rng.int(0, 3) as f64 * 2.5e7
                    } else {
                        rng.uniform(0.0, 1e8)
                    }
                })
                .collect()
        })
        .collect();
    let cap = |rng: &mut SplitMix| {
        if rng.int(0, 3) == 0 {
            f64::INFINITY
        } else {
            rng.uniform(0.05, 2.0) * 1e8
        }
    };
    let group_out = (0..ngroups).map(|_| cap(rng)).collect();
    let group_in = (0..ngroups).map(|_| cap(rng)).collect();
    let f = Fabric {
        rate,
        group_of,
        group_out,
        group_in,
    };
    assert_eq!(f.check(), Ok(()));
    f
}

fn for_each_permutation(items: &mut [usize], k: usize, visit: &mut impl FnMut(&[usize])) {
    if k == items.len() {
        visit(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        for_each_permutation(items, k + 1, visit);
        items.swap(k, i);
    }
}

/// The widest ring's width by trying every order with host 0 first.
fn brute_force_width(f: &Fabric) -> f64 {
    let n = f.nhosts();
    let mut rest: Vec<usize> = (1..n).collect();
    let mut best = NO_PATH;
    let mut order = Vec::with_capacity(n);
    for_each_permutation(&mut rest, 0, &mut |p| {
        order.clear();
        order.push(0);
        order.extend_from_slice(p);
        best = best.max(f.ring_score(&order));
    });
    best
}

fn assert_permutation(order: &[usize], n: usize) {
    let mut sorted = order.to_vec();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "not a permutation: {order:?}"
    );
}

/// Every group's hosts one after another around the ring.
fn assert_contiguous(f: &Fabric, ring: &[usize]) {
    let n = ring.len();
    let mut leaves = vec![0; f.group_out.len()];
    for i in 0..n {
        let (a, b) = (ring[i], ring[(i + 1) % n]);
        if f.group_of[a] != f.group_of[b] {
            leaves[f.group_of[a]] += 1;
        }
    }
    let expected = if f.group_out.len() > 1 { 1 } else { 0 };
    assert!(
        leaves.iter().all(|&k| k == expected),
        "not contiguous: {leaves:?}"
    );
}

#[test]
fn interleaved_racks_need_reordering() {
    // Hosts 0, 2 in rack 0 and 1, 3 in rack 1, as a scheduler deals them.
    let (inside, across) = (1e9 / 8.0, 250e6 / 8.0);
    let cap = 250e6 / 8.0;
    let group_of = vec![0, 1, 0, 1];
    let rate = (0..4)
        .map(|a| {
            (0..4)
                .map(|b: usize| {
                    if group_of[a] == group_of[b] {
                        inside
                    } else {
                        across
                    }
                })
                .collect()
        })
        .collect();
    let f = Fabric {
        rate,
        group_of,
        group_out: vec![cap; 2],
        group_in: vec![cap; 2],
    };
    assert_eq!(f.check(), Ok(()));
    // Rank order crosses the uplinks four times: two flows share each.
    assert_eq!(f.ring_score(&[0, 1, 2, 3]), cap / 2.0);
    let ring = widest_ring(&f);
    assert_eq!(ring[..2], [0, 2]);
    assert_permutation(&ring, 4);
    assert_eq!(f.ring_score(&ring), cap);
    // Degenerate sizes; two hosts make edges both ways.
    assert_eq!(f.ring_score(&[3]), f64::INFINITY);
    assert_eq!(f.ring_score(&[]), f64::INFINITY);
    assert_eq!(f.ring_score(&[0, 2]), inside);
    assert_eq!(f.ring_score(&[0, 1]), across);
    assert_eq!(f.chain_score(&[0, 1, 2, 3]), cap / 2.0);
    assert_eq!(f.chain_score(&[0, 2, 1]), cap);
}

#[test]
fn widest_ring_matches_brute_force_on_racks() {
    let mut rng = SplitMix(1);
    for _ in 0..300 {
        let n = rng.int(2, 8);
        let f = random_racks(&mut rng, n, 4, |rng, _| rng.uniform(0.1, 3.0) * 1e8);
        let ring = widest_ring(&f);
        assert_permutation(&ring, n);
        assert_eq!(ring[0], 0);
        assert_eq!(f.ring_score(&ring), brute_force_width(&f), "{f:?}");
    }
}

#[test]
fn grouped_ring_alone_is_optimal_under_oversubscribed_uplinks() {
    // Caps drawn in [0.3, 0.5] x the smallest NIC rate m. A ring that is
    // not contiguous leaves some group g twice: width <= cap_g / 2 <=
    // 0.25 m. Every contiguous ring has width >= 0.95 min(m, min cap)
    // >= 0.285 m (jitter >= 0.95; each uplink carries one flow). So the
    // widest ring is contiguous, and the grouped search (exact at these
    // sizes) finds it. (Caps <= 0.5 m alone would not do: with one cap
    // over about 1.9x another, a ring leaving the wide-uplink group
    // twice can dodge a badly jittered pair and win.)
    let mut rng = SplitMix(2);
    for _ in 0..200 {
        let n = rng.int(2, 8);
        let f = random_racks(&mut rng, n, 4, |rng, m| rng.uniform(0.3, 0.5) * m);
        let ring = grouped_ring(&f);
        assert_permutation(&ring, n);
        assert_eq!(ring[0], 0);
        assert_contiguous(&f, &ring);
        assert_eq!(f.ring_score(&ring), brute_force_width(&f), "{f:?}");
    }
}

#[test]
fn exact_ring_alone_matches_brute_force_on_arbitrary_matrices() {
    let mut rng = SplitMix(3);
    for _ in 0..100 {
        let n = rng.int(2, 8);
        let f = arbitrary_fabric(&mut rng, n);
        let ring = exact_ring(&f);
        assert_permutation(&ring, n);
        assert_eq!(ring[0], 0);
        assert_eq!(f.ring_score(&ring), brute_force_width(&f), "{f:?}");
    }
}

/// `ngroups` racks of `per_group` consecutive hosts.
fn blocked_racks(seed: u64, ngroups: usize, per_group: usize) -> Fabric {
    let mut rng = SplitMix(seed);
    let group_of = (0..ngroups * per_group).map(|h| h / per_group).collect();
    rack_fabric(&mut rng, group_of, ngroups, |rng, _| {
        rng.uniform(0.3, 1.5) * 1e8
    })
}

#[test]
fn a_thousand_hosts_in_under_a_second() {
    for (ngroups, per_group) in [(32, 32), (1, 1024), (1024, 1)] {
        let f = blocked_racks(5, ngroups, per_group);
        assert_eq!(f.check(), Ok(()));
        let started = Instant::now();
        let ring = widest_ring(&f);
        let took = started.elapsed();
        let natural: Vec<usize> = (0..f.nhosts()).collect();
        let (width, plain) = (f.ring_score(&ring), f.ring_score(&natural));
        println!(
            "{ngroups} groups of {per_group}: {took:?}, width {width:.4e} \
             (host order {plain:.4e})"
        );
        assert_permutation(&ring, f.nhosts());
        assert_eq!(ring[0], 0);
        if ngroups == 32 {
            // Host order visits every rack contiguously too.
            assert!(width >= plain, "{width} < {plain}");
        }
        if !cfg!(debug_assertions) {
            assert!(took.as_secs_f64() < 1.0, "took {took:?}");
        }
    }
}

#[test]
fn grouped_ring_is_contiguous_in_every_regime() {
    // Few groups with heuristic paths, many small groups, many mixed
    // groups with host 0 not in group 0.
    let mut rng = SplitMix(7);
    let cases: Vec<Vec<usize>> = vec![
        (0..60).map(|h| h % 3).collect(),
        (0..36).map(|h| h / 3).collect(),
        (0..90).map(|_| rng.int(0, 14)).collect(),
        (0..40).map(|h| (h + 5) % 10).collect(),
    ];
    for raw in cases {
        let (group_of, ngroups) = compact(&raw);
        let f = rack_fabric(&mut rng, group_of, ngroups, |rng, _| {
            rng.uniform(0.3, 1.5) * 1e8
        });
        assert_eq!(f.check(), Ok(()));
        let ring = widest_ring(&f);
        assert_permutation(&ring, f.nhosts());
        assert_eq!(ring[0], 0);
        assert_contiguous(&f, &ring);
        assert_eq!(ring, widest_ring(&f), "deterministic");
    }
}

#[test]
fn heuristics_come_close_to_exact() {
    let mut rng = SplitMix(8);
    // Paths inside a group: one rack with a few slow pairs (a bad cable),
    // 8..=12 hosts, against exact Held-Karp.
    for _ in 0..60 {
        let n = rng.int(8, 12);
        let mut f = random_racks(&mut rng, n, 1, |rng, _| rng.uniform(0.1, 3.0) * 1e8);
        for _ in 0..n {
            let (a, b) = (rng.int(0, n - 1), rng.int(0, n - 1));
            f.rate[a][b] *= 0.1;
        }
        let hosts: Vec<usize> = (0..n).collect();
        let cycle = heuristic_path(&f.rate, &hosts, 0, 0);
        let local = local_rates(&f.rate, &hosts);
        let exact = exact_paths_from(&local, n, 0)
            .into_iter()
            .enumerate()
            .skip(1)
            .map(|(end, (w, _))| w.min(local[end * n]))
            .fold(NO_PATH, f64::max);
        assert_eq!(route_width(&HostRoute { rate: &f.rate }, &cycle), exact);
    }
    // Group orders: the search used past 8 groups, against the exact
    // search over subsets on the same candidates.
    for _ in 0..100 {
        let n = rng.int(6, 40);
        let f = random_racks(&mut rng, n, 8, |rng, _| rng.uniform(0.1, 3.0) * 1e8);
        let members = group_members(&f);
        if members.len() < 2 {
            continue;
        }
        let tables = GroupTables::new(&f, &members);
        let exact = f.ring_score(&tables.expand(&tables.best_ring_by_subsets()));
        let found = f.ring_score(&tables.expand(&tables.best_ring_by_search()));
        assert!(
            found <= exact && found >= 0.98 * exact,
            "{found} vs {exact}"
        );
    }
}

#[test]
fn widest_chain_starts_at_root_and_is_no_narrower_than_the_ring() {
    let mut rng = SplitMix(6);
    for _ in 0..50 {
        let n = rng.int(1, 12);
        let f = random_racks(&mut rng, n, 4, |rng, _| rng.uniform(0.1, 3.0) * 1e8);
        let ring_width = f.ring_score(&widest_ring(&f));
        for root in 0..n {
            let chain = widest_chain(&f, root);
            assert_eq!(chain[0], root);
            assert_permutation(&chain, n);
            assert!(f.chain_score(&chain) >= ring_width);
        }
    }
}

#[test]
fn check_rejects_malformed_fabrics() {
    let good = Fabric {
        rate: vec![vec![0.0, 1.0], vec![1.0, 0.0]],
        group_of: vec![0, 1],
        group_out: vec![1.0, f64::INFINITY],
        group_in: vec![1.0, 1.0],
    };
    assert_eq!(good.check(), Ok(()));
    let mut ragged = good.clone();
    ragged.rate[1].push(1.0);
    assert!(ragged.check().unwrap_err().contains("rate row 1"));
    let mut unused = good.clone();
    unused.group_of = vec![0, 0];
    assert!(unused.check().unwrap_err().contains("group 1 has no hosts"));
    let mut nan = good.clone();
    nan.rate[0][1] = f64::NAN;
    assert!(nan.check().unwrap_err().contains("rate[0][1]"));
    // The diagonal is ignored; caps must be positive.
    let mut diagonal = good.clone();
    diagonal.rate[0][0] = f64::NAN;
    assert_eq!(diagonal.check(), Ok(()));
    let mut zero_cap = good;
    zero_cap.group_in[1] = 0.0;
    assert!(zero_cap.check().unwrap_err().contains("group_in[1]"));
}
