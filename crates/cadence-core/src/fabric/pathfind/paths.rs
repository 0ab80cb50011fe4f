//! The widest Hamiltonian paths through the hosts of one group, between
//! candidate entry and exit hosts: exact (Held–Karp over subsets, min in
//! place of +) for small groups, greedy plus local search beyond.

use super::local_search::{improve_route, kicked, route_width, HostRoute};
use super::{widest, Fabric, NO_PATH};

/// Groups of up to this many hosts get exact widest paths (Held–Karp over
/// subsets), budget permitting (see [`EXACT_GROUP_WORK`]).
pub(super) const EXACT_GROUP_MAX_HOSTS: usize = 12;
/// Most inner-loop steps spent on exact group paths (about 0.1 s); past it
/// the largest groups fall back to the heuristic.
const EXACT_GROUP_WORK: u64 = 1 << 26;

/// The rates among `hosts`, row-major: `local[i * k + j]` is the rate from
/// `hosts[i]` to `hosts[j]`.
pub(super) fn local_rates(rate: &[Vec<f64>], hosts: &[usize]) -> Vec<f64> {
    hosts
        .iter()
        .flat_map(|&a| hosts.iter().map(move |&b| rate[a][b]))
        .collect()
}

/// The widest Hamiltonian path from `start` to every other host of a small
/// group, exactly: Held–Karp over subsets with min in place of +, O(k^2 2^k).
/// `local` as from [`local_rates`]. Entry j: (width, local indices from
/// start to j); (NO_PATH, empty) for j == start unless k == 1.
pub(super) fn exact_paths_from(local: &[f64], k: usize, start: usize) -> Vec<(f64, Vec<usize>)> {
    let states = 1usize << k;
    let mut width = vec![NO_PATH; states * k];
    // k <= EXACT_GROUP_MAX_HOSTS, so a host index fits a byte.
    let mut came_from = vec![u8::MAX; states * k];
    width[(1 << start) * k + start] = f64::INFINITY;
    for mask in (1..states).filter(|m| m & (1 << start) != 0) {
        for last in (0..k).filter(|&l| mask & (1 << l) != 0) {
            let here = width[mask * k + last];
            if here <= NO_PATH {
                continue;
            }
            for next in (0..k).filter(|&x| mask & (1 << x) == 0) {
                let through = here.min(local[last * k + next]);
                let at = (mask | 1 << next) * k + next;
                if through > width[at] {
                    width[at] = through;
                    came_from[at] = last as u8;
                }
            }
        }
    }
    let full = states - 1;
    (0..k)
        .map(|end| {
            if end == start && k > 1 {
                return (NO_PATH, Vec::new());
            }
            let mut path = vec![end];
            let (mut mask, mut at) = (full, end);
            for _ in 1..k {
                let prev = usize::from(came_from[mask * k + at]);
                mask &= !(1 << at);
                at = prev;
                path.push(at);
            }
            path.reverse();
            (width[full * k + end], path)
        })
        .collect()
}

/// A wide Hamiltonian path from `from` to `to` (equal: a cycle, listed with
/// `from` at both ends) through all `hosts`: greedy widest next host, then
/// [`improve_route`]. O(k^2) for the greedy part.
pub(super) fn heuristic_path(
    rate: &[Vec<f64>],
    hosts: &[usize],
    from: usize,
    to: usize,
) -> Vec<usize> {
    let mut left: Vec<usize> = hosts
        .iter()
        .copied()
        .filter(|&h| h != from && h != to)
        .collect();
    let mut path = Vec::with_capacity(hosts.len() + 1);
    path.push(from);
    let mut last = from;
    while let Some((_, at)) = widest(left.iter().enumerate().map(|(i, &h)| (rate[last][h], i))) {
        last = left.remove(at);
        path.push(last);
    }
    path.push(to);
    let route = HostRoute { rate };
    improve_route(&route, &mut path);
    kicked(&route, path)
}

/// The most exact-path work per group size that fits the budget: the
/// largest limit L <= 12 such that exact paths for every group of at most
/// L hosts cost at most [`EXACT_GROUP_WORK`] steps (k^3 2^(k-1) each: k
/// starts, 2^(k-1) subsets, k^2 moves). Depends on the group sizes only,
/// so every rank gets the same.
pub(super) fn exact_group_limit(members: &[Vec<usize>]) -> usize {
    let work = |k: usize| (k as u64).pow(3) << k.saturating_sub(1);
    (2..=EXACT_GROUP_MAX_HOSTS)
        .rev()
        .find(|&limit| {
            let total: u64 = members
                .iter()
                .map(Vec::len)
                .filter(|&k| k <= limit)
                .map(work)
                .sum();
            total <= EXACT_GROUP_WORK
        })
        .unwrap_or(1)
}

/// Per host: how well it reaches outside its group, the lesser of its
/// widest contiguous edge out and its widest one in. Hosts that reach out
/// well make good entries and exits. O(n^2).
pub(super) fn outside_reach(f: &Fabric) -> Vec<f64> {
    let n = f.nhosts();
    (0..n)
        .map(|h| {
            let outside = (0..n).filter(|&x| f.group_of[x] != f.group_of[h]);
            let (mut out, mut into) = (NO_PATH, NO_PATH);
            for x in outside {
                out = out.max(f.contiguous_rate(h, x));
                into = into.max(f.contiguous_rate(x, h));
            }
            out.min(into)
        })
        .collect()
}

/// One group's candidate entry/exit hosts and the widest paths between them.
pub(super) struct GroupPaths {
    /// Candidates, best reach first (ties: lower host first).
    pub(super) cands: Vec<usize>,
    /// `width[i * c + j]`: `W(cands[i], cands[j])`; NO_PATH when i == j unless
    /// the group has one host.
    pub(super) width: Vec<f64>,
    /// The paths themselves (hosts, `cands[i]` first and `cands[j]` last).
    pub(super) paths: Vec<Vec<usize>>,
    /// `widest_from[i]`: the widest path from `cands[i]` to any candidate.
    pub(super) widest_from: Vec<f64>,
}

impl GroupPaths {
    fn new(cands: Vec<usize>, width: Vec<f64>, paths: Vec<Vec<usize>>) -> GroupPaths {
        let c = cands.len();
        let widest_from = (0..c)
            .map(|i| {
                width[i * c..(i + 1) * c]
                    .iter()
                    .copied()
                    .fold(NO_PATH, f64::max)
            })
            .collect();
        GroupPaths {
            cands,
            width,
            paths,
            widest_from,
        }
    }

    /// Every host a candidate, every path exact.
    pub(super) fn exact(rate: &[Vec<f64>], cands: Vec<usize>) -> GroupPaths {
        let k = cands.len();
        let local = local_rates(rate, &cands);
        let mut width = Vec::with_capacity(k * k);
        let mut paths = Vec::with_capacity(k * k);
        for start in 0..k {
            for (w, path) in exact_paths_from(&local, k, start) {
                width.push(w);
                paths.push(path.into_iter().map(|i| cands[i]).collect());
            }
        }
        GroupPaths::new(cands, width, paths)
    }

    /// Heuristic paths between each ordered pair of the given candidates.
    pub(super) fn heuristic(rate: &[Vec<f64>], hosts: &[usize], cands: Vec<usize>) -> GroupPaths {
        let route = HostRoute { rate };
        let mut width = Vec::new();
        let mut paths = Vec::new();
        for &u in &cands {
            for &v in &cands {
                if u == v {
                    width.push(NO_PATH);
                    paths.push(Vec::new());
                } else {
                    let path = heuristic_path(rate, hosts, u, v);
                    width.push(route_width(&route, &path));
                    paths.push(path);
                }
            }
        }
        GroupPaths::new(cands, width, paths)
    }

    pub(super) fn width(&self, entry: usize, exit: usize) -> f64 {
        self.width[entry * self.cands.len() + exit]
    }
}
