//! The widest ring through the hosts of a measured network, in the manner of
//! TCCL's path finder: groups (racks) first, then hosts inside them.
//!
//! Terms:
//! - **width** of a ring or chain: the rate each of its flows gets when all
//!   its edges carry traffic at once ([`Fabric::ring_score`]).
//! - **contiguous** ring: one that visits the hosts of every group one after
//!   another, so it leaves and enters each group once. No ring shares an
//!   uplink less, so when uplinks are oversubscribed enough the widest ring
//!   is contiguous (the tests give a condition).
//! - **entry / exit**: the first and the last host a contiguous ring visits
//!   in a group; **W(u, v)**: the width of the widest path from entry u to
//!   exit v through all hosts of the group.
//!
//! [`widest_ring`] builds the widest contiguous ring it can find:
//! - W(u, v) inside each group: exact (Held–Karp over subsets, min in place
//!   of +) for groups of up to 12 hosts; beyond that, for 4 candidate
//!   endpoints (the hosts that reach outside best), a greedy widest-next
//!   path improved by 2-opt and or-opt moves on its narrowest link, plus a
//!   fixed number of seeded double-bridge kicks.
//! - the group order and each group's entry and exit: exact over every
//!   order (a subset search) for up to 8 groups; beyond that greedy orders
//!   improved by the same local search, with the best entries and exits for
//!   each order found exactly.
//!
//! For up to 9 hosts it also searches every ring (branch and bound) and
//! keeps the wider, so small inputs get the true optimum. Everything is
//! deterministic: every rank runs it and they must agree, so ties go to the
//! first candidate in a fixed order, random choices come from a fixed seed,
//! and widths are only ever combined by `min` and `max` (no sums whose
//! rounding could vary).

/// Up to this many hosts, [`widest_ring`] also searches every ring exactly.
const EXACT_RING_MAX_HOSTS: usize = 9;
/// Groups of up to this many hosts get exact widest paths (Held–Karp over
/// subsets), budget permitting (see [`EXACT_GROUP_WORK`]).
const EXACT_GROUP_MAX_HOSTS: usize = 12;
/// Most inner-loop steps spent on exact group paths (about 0.1 s); past it
/// the largest groups fall back to the heuristic.
const EXACT_GROUP_WORK: u64 = 1 << 26;
/// Up to this many groups, every group order is searched (over subsets).
const EXACT_ORDER_MAX_GROUPS: usize = 8;
/// Candidate entry/exit hosts of a group too large for exact paths: the
/// heuristic path is built for each ordered pair of them (12 pairs).
const HEURISTIC_ENDPOINTS: usize = 4;
/// Greedy group orders tried, one per entry host of the first group.
const GREEDY_SEEDS: usize = 4;
/// Rounds of (reorder groups, re-choose entries and exits) past the seeds.
const GROUP_ORDER_ROUNDS: usize = 4;
/// Or-opt moves runs of up to this many stops divided by the route's
/// length, and at least [`MIN_RELOCATED`]: a pass then costs O(this).
const RELOCATION_WORK: usize = 1 << 14;
/// The shortest longest run or-opt moves, however long the route.
const MIN_RELOCATED: usize = 3;
/// Kicks of the iterated local search: KICK_WORK / route length (each
/// kick costs a local search), at most [`MAX_KICKS`].
const KICK_WORK: usize = 1 << 9;
/// The most kicks on a short route.
const MAX_KICKS: usize = 32;
/// The width of a path that cannot exist (a group of two or more hosts
/// entered and left at the same host).
const NO_PATH: f64 = f64::NEG_INFINITY;

/// The network between hosts as measured: rates in bytes/s.
#[derive(Clone, Debug, PartialEq)]
pub struct Fabric {
    /// `rate[a][b]`: what one flow from host a to host b gets alone
    /// (a != b); the diagonal is ignored.
    pub rate: Vec<Vec<f64>>,
    /// `group_of[h]`: the group (e.g. rack) of host h; groups numbered
    /// 0..ngroups, every number used.
    pub group_of: Vec<usize>,
    /// What all flows from group g to hosts outside g share (an uplink),
    /// bytes/s; f64::INFINITY when unlimited.
    pub group_out: Vec<f64>,
    /// What all flows into group g from outside share.
    pub group_in: Vec<f64>,
}

impl Fabric {
    /// The number of hosts.
    pub fn nhosts(&self) -> usize {
        self.rate.len()
    }

    /// Checks shapes (square matrix, group_of len, groups 0..G all used, caps
    /// len G, rates finite and >= 0 off the diagonal, caps > 0); Err(String)
    /// describing the first problem. Everything else in this module assumes
    /// it passed.
    pub fn check(&self) -> Result<(), String> {
        let n = self.nhosts();
        if let Some((a, row)) = self.rate.iter().enumerate().find(|(_, r)| r.len() != n) {
            return Err(format!(
                "rate row {a} has {} entries; expected {n} (one per host)",
                row.len()
            ));
        }
        if self.group_of.len() != n {
            return Err(format!(
                "group_of has {} entries; expected {n} (one per host)",
                self.group_of.len()
            ));
        }
        let ngroups = self.group_out.len();
        if self.group_in.len() != ngroups {
            return Err(format!(
                "group_in has {} entries but group_out has {ngroups}; expected one per group",
                self.group_in.len()
            ));
        }
        let mut used = vec![false; ngroups];
        for (h, &g) in self.group_of.iter().enumerate() {
            match used.get_mut(g) {
                Some(u) => *u = true,
                None => {
                    return Err(format!(
                        "host {h} is in group {g}, but caps are given for {ngroups} groups"
                    ))
                }
            }
        }
        if let Some(g) = used.iter().position(|&u| !u) {
            return Err(format!(
                "group {g} has no hosts; groups must be numbered 0..{ngroups}, every number used"
            ));
        }
        for (a, row) in self.rate.iter().enumerate() {
            for (b, &r) in row.iter().enumerate() {
                if a != b && (!r.is_finite() || r < 0.0) {
                    return Err(format!(
                        "rate[{a}][{b}] is {r}; rates must be finite and >= 0"
                    ));
                }
            }
        }
        for (name, caps) in [("group_out", &self.group_out), ("group_in", &self.group_in)] {
            if let Some((g, c)) = caps
                .iter()
                .enumerate()
                .find(|(_, c)| c.is_nan() || **c <= 0.0)
            {
                return Err(format!("{name}[{g}] is {c}; caps must be > 0"));
            }
        }
        Ok(())
    }

    /// Per-flow rate of the ring visiting hosts in `order` (a permutation of
    /// 0..n; edge `order[i] -> order[i+1]`, plus `order[n-1] -> order[0]`)
    /// when all its edges carry traffic at once: the minimum over edges
    /// e=(a->b) of
    ///   `rate[a][b]`, and when `group_of[a] != group_of[b]` also
    ///   `group_out[ga]/k_out(ga)` and `group_in[gb]/k_in(gb)`,
    /// where k_out(g) counts the ring's edges leaving g and k_in(g) the edges
    /// entering g. One host (or zero): f64::INFINITY. Two hosts: edges a->b
    /// and b->a.
    ///
    /// # Panics
    /// If an entry of `order` is not a host (>= [`Fabric::nhosts`]), or the
    /// fabric fails [`Fabric::check`].
    pub fn ring_score(&self, order: &[usize]) -> f64 {
        self.route_score(order, true)
    }

    /// Same for a chain (no closing edge `order[n-1] -> order[0]`).
    ///
    /// # Panics
    /// As [`Fabric::ring_score`].
    pub fn chain_score(&self, order: &[usize]) -> f64 {
        self.route_score(order, false)
    }

    fn route_score(&self, order: &[usize], closed: bool) -> f64 {
        let n = order.len();
        if n < 2 {
            return f64::INFINITY;
        }
        let closing = closed.then(|| (order[n - 1], order[0]));
        let edges: Vec<(usize, usize)> = order
            .windows(2)
            .map(|w| (w[0], w[1]))
            .chain(closing)
            .collect();
        let ngroups = self.group_out.len();
        let (mut k_out, mut k_in) = (vec![0u32; ngroups], vec![0u32; ngroups]);
        for &(a, b) in &edges {
            let (ga, gb) = (self.group_of[a], self.group_of[b]);
            if ga != gb {
                k_out[ga] += 1;
                k_in[gb] += 1;
            }
        }
        edges
            .iter()
            .map(|&(a, b)| {
                let (ga, gb) = (self.group_of[a], self.group_of[b]);
                let alone = self.rate[a][b];
                if ga == gb {
                    alone
                } else {
                    let out = self.group_out[ga] / f64::from(k_out[ga]);
                    let into = self.group_in[gb] / f64::from(k_in[gb]);
                    alone.min(out).min(into)
                }
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// The width of edge a -> b in a contiguous ring (each uplink carries
    /// one of its flows); the plain rate inside a group.
    fn contiguous_rate(&self, a: usize, b: usize) -> f64 {
        let (ga, gb) = (self.group_of[a], self.group_of[b]);
        let alone = self.rate[a][b];
        if ga == gb {
            alone
        } else {
            alone.min(self.group_out[ga]).min(self.group_in[gb])
        }
    }
}

/// The host order of the widest ring (maximizes ring_score), starting with
/// host 0. Deterministic (same input -> same output on every machine: every
/// rank runs it and they must agree; ties go to the first candidate in a
/// fixed order, never to hash-map iteration order or floating-point sums
/// whose order could vary).
///
/// The widest ring that visits every group contiguously (the one that
/// shares uplinks least), exact up to 8 groups of up to 12 hosts,
/// heuristic beyond; with at most 9 hosts every ring is also searched and
/// the wider kept (the contiguous one on ties), so small inputs get the
/// true optimum.
///
/// Precondition: `f.check()` passed (this panics on malformed shapes).
pub fn widest_ring(f: &Fabric) -> Vec<usize> {
    let n = f.nhosts();
    if n <= 2 {
        // One ring up to rotation.
        return (0..n).collect();
    }
    let grouped = grouped_ring(f);
    if n <= EXACT_RING_MAX_HOSTS {
        let exact = exact_ring(f);
        if f.ring_score(&exact) > f.ring_score(&grouped) {
            return exact;
        }
    }
    grouped
}

/// The chain for a pipelined broadcast from `root`: the widest ring rotated
/// to start at root, and reversed if that gives a higher chain_score. The
/// reversed chain still starts at root (root, then the ring's hosts
/// backwards); on a tie the forward one is kept. Its chain_score is at
/// least the ring's ring_score: a chain drops an edge and shares uplinks
/// with no more edges than the ring.
///
/// Precondition: `f.check()` passed.
///
/// # Panics
/// If `root` is not a host.
pub fn widest_chain(f: &Fabric, root: usize) -> Vec<usize> {
    assert!(
        root < f.nhosts(),
        "root {root} is not a host (the fabric has {} hosts)",
        f.nhosts()
    );
    let forward = rotated_to(widest_ring(f), root);
    let mut backward = forward.clone();
    backward[1..].reverse();
    if f.chain_score(&backward) > f.chain_score(&forward) {
        backward
    } else {
        forward
    }
}

/// `ring` rotated so that it starts at `host` (unchanged if absent).
fn rotated_to(mut ring: Vec<usize>, host: usize) -> Vec<usize> {
    if let Some(at) = ring.iter().position(|&h| h == host) {
        ring.rotate_left(at);
    }
    ring
}

/// The first item with the largest width; later ties lose (a fixed rule,
/// so every rank picks the same).
fn widest<T>(items: impl IntoIterator<Item = (f64, T)>) -> Option<(f64, T)> {
    let mut best: Option<(f64, T)> = None;
    for (width, item) in items {
        if best.as_ref().is_none_or(|(w, _)| width > *w) {
            best = Some((width, item));
        }
    }
    best
}

// ---------------------------------------------------------------------------
// Exact search over all rings (small inputs).

/// The widest ring of all, by branch and bound over every order with host 0
/// first. Exponential: only for up to [`EXACT_RING_MAX_HOSTS`] hosts.
fn exact_ring(f: &Fabric) -> Vec<usize> {
    let n = f.nhosts();
    if n <= 2 {
        return (0..n).collect();
    }
    let mut search = ExactRingSearch {
        fabric: f,
        path: vec![0],
        used: (0..n).map(|h| h == 0).collect(),
        best_width: NO_PATH,
        best: (0..n).collect(),
    };
    search.extend();
    search.best
}

struct ExactRingSearch<'a> {
    fabric: &'a Fabric,
    path: Vec<usize>,
    used: Vec<bool>,
    best_width: f64,
    best: Vec<usize>,
}

impl ExactRingSearch<'_> {
    fn extend(&mut self) {
        let n = self.used.len();
        if self.path.len() == n {
            let width = self.fabric.ring_score(&self.path);
            if width > self.best_width {
                self.best_width = width;
                self.best.clone_from(&self.path);
            }
            return;
        }
        // More edges only narrow a route, and more crossings only shrink each
        // one's share of an uplink: the chain so far bounds every completion.
        if self.fabric.chain_score(&self.path) <= self.best_width {
            return;
        }
        for host in 1..n {
            if !self.used[host] {
                self.used[host] = true;
                self.path.push(host);
                self.extend();
                self.path.pop();
                self.used[host] = false;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Contiguous (grouped) rings.

/// The widest ring found among those that visit every group contiguously,
/// starting with host 0.
fn grouped_ring(f: &Fabric) -> Vec<usize> {
    let members = group_members(f);
    if members.len() <= 1 {
        return single_group_ring(f);
    }
    let tables = GroupTables::new(f, &members);
    let stops = if members.len() <= EXACT_ORDER_MAX_GROUPS {
        tables.best_ring_by_subsets()
    } else {
        tables.best_ring_by_search()
    };
    rotated_to(tables.expand(&stops), 0)
}

/// The hosts of each group, ascending.
fn group_members(f: &Fabric) -> Vec<Vec<usize>> {
    let mut members = vec![Vec::new(); f.group_out.len()];
    for (h, &g) in f.group_of.iter().enumerate() {
        members[g].push(h);
    }
    members
}

/// All hosts in one group: the widest Hamiltonian cycle through them.
fn single_group_ring(f: &Fabric) -> Vec<usize> {
    let n = f.nhosts();
    if n <= 2 {
        return (0..n).collect();
    }
    let hosts: Vec<usize> = (0..n).collect();
    if n > EXACT_GROUP_MAX_HOSTS {
        // A cycle is a path from host 0 back to host 0.
        let mut cycle = heuristic_path(&f.rate, &hosts, 0, 0);
        cycle.pop();
        return cycle;
    }
    let local = local_rates(&f.rate, &hosts);
    let closed = exact_paths_from(&local, n, 0)
        .into_iter()
        .enumerate()
        .skip(1)
        .map(|(end, (width, path))| (width.min(local[end * n]), path));
    widest(closed).map_or(hosts, |(_, path)| path)
}

/// The rates among `hosts`, row-major: `local[i * k + j]` is the rate from
/// `hosts[i]` to `hosts[j]`.
fn local_rates(rate: &[Vec<f64>], hosts: &[usize]) -> Vec<f64> {
    hosts
        .iter()
        .flat_map(|&a| hosts.iter().map(move |&b| rate[a][b]))
        .collect()
}

/// The widest Hamiltonian path from `start` to every other host of a small
/// group, exactly: Held–Karp over subsets with min in place of +, O(k^2 2^k).
/// `local` as from [`local_rates`]. Entry j: (width, local indices from
/// start to j); (NO_PATH, empty) for j == start unless k == 1.
fn exact_paths_from(local: &[f64], k: usize, start: usize) -> Vec<(f64, Vec<usize>)> {
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
fn heuristic_path(rate: &[Vec<f64>], hosts: &[usize], from: usize, to: usize) -> Vec<usize> {
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

/// Iterated local search: a fixed number of double-bridge kicks (the run
/// between two random cuts swapped with the next run, orientation kept),
/// each followed by [`improve_route`]; a kicked route is kept only if
/// strictly wider. The cuts come from a fixed-seed generator, so every
/// rank gets the same route. Kicks are fewer on long routes (each costs a
/// local search): about KICK_WORK / len of them.
fn kicked<R: Route>(route: &R, mut best: Vec<R::Stop>) -> Vec<R::Stop> {
    let len = best.len();
    if len < 5 {
        return best;
    }
    let mut best_width = route_width(route, &best);
    let mut seed = 0x5eed_u64;
    let mut below = |n: usize| (split_mix(&mut seed) % n as u64) as usize;
    for _ in 0..(KICK_WORK / len).min(MAX_KICKS) {
        // Cuts 1 <= a < b < c <= len - 1: runs a..b and b..c swap.
        let a = 1 + below(len - 3);
        let b = a + 1 + below(len - 2 - a);
        let c = b + 1 + below(len - 1 - b);
        let mut trial = best.clone();
        trial[a..c].rotate_left(b - a);
        improve_route(route, &mut trial);
        let width = route_width(route, &trial);
        if width > best_width {
            (best, best_width) = (trial, width);
        }
    }
    best
}

/// splitmix64: a fixed, portable sequence.
fn split_mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The most exact-path work per group size that fits the budget: the
/// largest limit L <= 12 such that exact paths for every group of at most
/// L hosts cost at most [`EXACT_GROUP_WORK`] steps (k^3 2^(k-1) each: k
/// starts, 2^(k-1) subsets, k^2 moves). Depends on the group sizes only,
/// so every rank gets the same.
fn exact_group_limit(members: &[Vec<usize>]) -> usize {
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
fn outside_reach(f: &Fabric) -> Vec<f64> {
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
struct GroupPaths {
    /// Candidates, best reach first (ties: lower host first).
    cands: Vec<usize>,
    /// `width[i * c + j]`: `W(cands[i], cands[j])`; NO_PATH when i == j unless
    /// the group has one host.
    width: Vec<f64>,
    /// The paths themselves (hosts, `cands[i]` first and `cands[j]` last).
    paths: Vec<Vec<usize>>,
    /// `widest_from[i]`: the widest path from `cands[i]` to any candidate.
    widest_from: Vec<f64>,
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
    fn exact(rate: &[Vec<f64>], cands: Vec<usize>) -> GroupPaths {
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
    fn heuristic(rate: &[Vec<f64>], hosts: &[usize], cands: Vec<usize>) -> GroupPaths {
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

    fn width(&self, entry: usize, exit: usize) -> f64 {
        self.width[entry * self.cands.len() + exit]
    }
}

/// One group's place in a contiguous ring: entered at host `entry`, left at
/// host `exit`. `closing` marks the sentinel that stands for returning to
/// the first group's entry (its own width is unlimited).
#[derive(Clone, Copy, Debug, PartialEq)]
struct GroupStop {
    group: usize,
    entry: usize,
    exit: usize,
    closing: bool,
}

/// How one group order step was taken: from which exit of the previous
/// group (an index into its candidates, or into the flattened candidates in
/// the subset search), into which entry of this one.
#[derive(Clone, Copy)]
struct Step {
    prev_exit: usize,
    entry: usize,
}

/// Everything the search over contiguous rings needs: per-group paths, and
/// where each candidate sits among its group's candidates.
struct GroupTables<'a> {
    fabric: &'a Fabric,
    groups: Vec<GroupPaths>,
    /// `slot[h]`: h's index among its group's candidates (usize::MAX if none).
    slot: Vec<usize>,
}

impl<'a> GroupTables<'a> {
    fn new(fabric: &'a Fabric, members: &[Vec<usize>]) -> GroupTables<'a> {
        let reach = outside_reach(fabric);
        let exact_limit = exact_group_limit(members);
        let groups: Vec<GroupPaths> = members
            .iter()
            .map(|hosts| {
                let mut ranked = hosts.clone();
                ranked.sort_by(|&a, &b| reach[b].total_cmp(&reach[a]).then(a.cmp(&b)));
                if hosts.len() <= exact_limit {
                    GroupPaths::exact(&fabric.rate, ranked)
                } else {
                    ranked.truncate(HEURISTIC_ENDPOINTS);
                    GroupPaths::heuristic(&fabric.rate, hosts, ranked)
                }
            })
            .collect();
        let mut slot = vec![usize::MAX; fabric.nhosts()];
        for group in &groups {
            for (i, &h) in group.cands.iter().enumerate() {
                slot[h] = i;
            }
        }
        GroupTables {
            fabric,
            groups,
            slot,
        }
    }

    /// W(entry, exit) of `group`; both must be candidates.
    fn stop_width(&self, stop: GroupStop) -> f64 {
        self.groups[stop.group].width(self.slot[stop.entry], self.slot[stop.exit])
    }

    /// The ring's hosts, group after group.
    fn expand(&self, stops: &[GroupStop]) -> Vec<usize> {
        stops
            .iter()
            .flat_map(|s| {
                let group = &self.groups[s.group];
                let at = self.slot[s.entry] * group.cands.len() + self.slot[s.exit];
                group.paths[at].iter().copied()
            })
            .collect()
    }

    /// The ring's first stop: host 0's group, entered at its candidate
    /// `first_entry` and left at its candidate `exit`.
    fn first_stop(&self, first_entry: usize, exit: usize) -> GroupStop {
        let group = self.fabric.group_of[0];
        let cands = &self.groups[group].cands;
        GroupStop {
            group,
            entry: cands[first_entry],
            exit: cands[exit],
            closing: false,
        }
    }

    // --- Few groups: exact over every group order. ---

    /// The widest contiguous ring over the candidates: for each entry u0 of
    /// host 0's group, Held–Karp over sets of groups, state (groups visited,
    /// exit of the last one). Exact when every group is (all hosts
    /// candidates, exact paths). O(2^G G C c) per u0, C candidates in all.
    fn best_ring_by_subsets(&self) -> Vec<GroupStop> {
        let first = self.fabric.group_of[0];
        let rings = (0..self.groups[first].cands.len()).map(|u0| self.subset_ring_from(u0));
        widest(rings).map_or_else(Vec::new, |(_, stops)| stops)
    }

    fn subset_ring_from(&self, u0: usize) -> (f64, Vec<GroupStop>) {
        let ngroups = self.groups.len();
        let g0 = self.fabric.group_of[0];
        // Every group's candidates in one list: (group, slot) each.
        let flat: Vec<(usize, usize)> = self
            .groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| (0..group.cands.len()).map(move |i| (g, i)))
            .collect();
        let offset: Vec<usize> = self
            .groups
            .iter()
            .scan(0, |at, group| {
                let here = *at;
                *at += group.cands.len();
                Some(here)
            })
            .collect();
        let host = |v: usize| self.groups[flat[v].0].cands[flat[v].1];
        let nflat = flat.len();
        let full = (1usize << ngroups) - 1;
        let start = 1usize << g0;
        let mut width = vec![NO_PATH; (full + 1) * nflat];
        let mut came = vec![
            Step {
                prev_exit: usize::MAX,
                entry: usize::MAX
            };
            (full + 1) * nflat
        ];
        for x in 0..self.groups[g0].cands.len() {
            width[start * nflat + offset[g0] + x] = self.groups[g0].width(u0, x);
        }
        for set in (start..=full).filter(|s| s & start != 0) {
            let live: Vec<usize> = (0..nflat)
                .filter(|&v| width[set * nflat + v] > NO_PATH)
                .collect();
            for g in (0..ngroups).filter(|&g| set & (1 << g) == 0) {
                let next = set | 1 << g;
                let group = &self.groups[g];
                for (e, &entry) in group.cands.iter().enumerate() {
                    let ways_in = live.iter().map(|&v| {
                        let w =
                            width[set * nflat + v].min(self.fabric.contiguous_rate(host(v), entry));
                        (w, v)
                    });
                    let Some((enter, from)) = widest(ways_in) else {
                        continue;
                    };
                    for x in 0..group.cands.len() {
                        let w = enter.min(group.width(e, x));
                        let at = next * nflat + offset[g] + x;
                        if w > width[at] {
                            width[at] = w;
                            came[at] = Step {
                                prev_exit: from,
                                entry: e,
                            };
                        }
                    }
                }
            }
        }
        let u0_host = self.groups[g0].cands[u0];
        let closes = (0..nflat).map(|v| {
            let w = width[full * nflat + v].min(self.fabric.contiguous_rate(host(v), u0_host));
            (w, v)
        });
        let Some((score, mut v)) = widest(closes) else {
            return (NO_PATH, Vec::new());
        };
        // Walk the choices back from the last group to the first.
        let mut stops = Vec::with_capacity(ngroups);
        let mut set = full;
        for _ in 0..ngroups {
            let (g, x) = flat[v];
            if set == start {
                stops.push(self.first_stop(u0, x));
                break;
            }
            let step = came[set * nflat + v];
            let cands = &self.groups[g].cands;
            stops.push(GroupStop {
                group: g,
                entry: cands[step.entry],
                exit: cands[x],
                closing: false,
            });
            set &= !(1 << g);
            v = step.prev_exit;
        }
        stops.reverse();
        (score, stops)
    }

    // --- Many groups: greedy orders, then local search. ---

    /// The widest contiguous ring found by: greedy group orders (widest
    /// next group, from each of the first few entries of host 0's group)
    /// and the plain ascending order as seeds; the best entries and exits
    /// for the best seed's order; then rounds of reordering groups
    /// ([`improve_route`] on the group ring, entries and exits held) and
    /// re-choosing entries and exits for the new order.
    fn best_ring_by_search(&self) -> Vec<GroupStop> {
        let g0 = self.fabric.group_of[0];
        let ngroups = self.groups.len();
        let seeds = self.groups[g0].cands.len().min(GREEDY_SEEDS);
        let ascending: Vec<usize> = std::iter::once(g0)
            .chain((0..ngroups).filter(|&g| g != g0))
            .collect();
        let orders = (0..seeds)
            .map(|u0| self.greedy_order(u0))
            .chain(std::iter::once(ascending));
        let Some((mut width, mut stops)) = widest(orders.map(|o| self.best_endpoints(&o))) else {
            return Vec::new();
        };
        for _ in 0..GROUP_ORDER_ROUNDS {
            let order = self.reordered(&stops);
            if order.iter().copied().eq(stops.iter().map(|s| s.group)) {
                break;
            }
            let (w, s) = self.best_endpoints(&order);
            if w < width {
                break;
            }
            (width, stops) = (w, s);
        }
        stops
    }

    /// From the widths at each exit of group `from`, the widths at each exit
    /// of group `to` when it comes next, and how each was reached.
    fn advance(&self, from: usize, exits: &[f64], to: usize) -> (Vec<f64>, Vec<Step>) {
        let (prev, next) = (&self.groups[from], &self.groups[to]);
        let entries: Vec<(f64, usize)> = next
            .cands
            .iter()
            .map(|&entry| {
                let ways_in = exits
                    .iter()
                    .zip(&prev.cands)
                    .enumerate()
                    .map(|(v, (&w, &exit))| (w.min(self.fabric.contiguous_rate(exit, entry)), v));
                widest(ways_in).unwrap_or((NO_PATH, 0))
            })
            .collect();
        (0..next.cands.len())
            .map(|x| {
                let through = entries.iter().enumerate().map(|(e, &(w, v))| {
                    (
                        w.min(next.width(e, x)),
                        Step {
                            prev_exit: v,
                            entry: e,
                        },
                    )
                });
                widest(through).unwrap_or((
                    NO_PATH,
                    Step {
                        prev_exit: 0,
                        entry: 0,
                    },
                ))
            })
            .unzip()
    }

    /// The best entries and exits for a fixed group order (`order[0]` is
    /// host 0's group): for each entry u0 of the first group, a pass around
    /// the ring over the exit of each group. O(G c^3).
    fn best_endpoints(&self, order: &[usize]) -> (f64, Vec<GroupStop>) {
        let first = &self.groups[order[0]];
        let last = order[order.len() - 1];
        let rings = (0..first.cands.len()).map(|u0| {
            let mut exits: Vec<f64> = (0..first.cands.len()).map(|x| first.width(u0, x)).collect();
            let mut steps = Vec::with_capacity(order.len());
            for pair in order.windows(2) {
                let (next, how) = self.advance(pair[0], &exits, pair[1]);
                exits = next;
                steps.push(how);
            }
            let entry = first.cands[u0];
            let closes = exits
                .iter()
                .zip(&self.groups[last].cands)
                .enumerate()
                .map(|(x, (&w, &exit))| (w.min(self.fabric.contiguous_rate(exit, entry)), x));
            let (width, exit) = widest(closes).unwrap_or((NO_PATH, 0));
            (width, self.trace(order, u0, exit, &steps))
        });
        widest(rings).unwrap_or((NO_PATH, Vec::new()))
    }

    /// The stops that [`GroupTables::best_endpoints`]'s choices describe.
    fn trace(
        &self,
        order: &[usize],
        u0: usize,
        last_exit: usize,
        steps: &[Vec<Step>],
    ) -> Vec<GroupStop> {
        let mut stops = Vec::with_capacity(order.len());
        let mut exit = last_exit;
        for (p, how) in steps.iter().enumerate().rev() {
            let group = order[p + 1];
            let cands = &self.groups[group].cands;
            let step = how[exit];
            stops.push(GroupStop {
                group,
                entry: cands[step.entry],
                exit: cands[exit],
                closing: false,
            });
            exit = step.prev_exit;
        }
        stops.push(self.first_stop(u0, exit));
        stops.reverse();
        stops
    }

    /// A group order built greedily from entry `u0` of host 0's group: next
    /// comes the group that keeps the ring so far widest, ties broken by the
    /// widest step on its own, then by the lower group number.
    fn greedy_order(&self, u0: usize) -> Vec<usize> {
        let ngroups = self.groups.len();
        let g0 = self.fabric.group_of[0];
        let first = &self.groups[g0];
        let mut placed = vec![false; ngroups];
        placed[g0] = true;
        let mut order = vec![g0];
        let mut current = g0;
        let mut exits: Vec<f64> = (0..first.cands.len()).map(|x| first.width(u0, x)).collect();
        while order.len() < ngroups {
            let mut pick: Option<(f64, f64, usize)> = None;
            for g in (0..ngroups).filter(|&g| !placed[g]) {
                let (through, step) = self.next_group_value(current, &exits, g);
                if pick.is_none_or(|(t, s, _)| (through, step) > (t, s)) {
                    pick = Some((through, step, g));
                }
            }
            let Some((_, _, g)) = pick else { break };
            exits = self.advance(current, &exits, g).0;
            placed[g] = true;
            order.push(g);
            current = g;
        }
        order
    }

    /// How wide the ring so far stays if group `to` comes next after `from`
    /// (exits' widths as given), and how wide that step alone is (entering
    /// and crossing `to`). O(c_from c_to).
    fn next_group_value(&self, from: usize, exits: &[f64], to: usize) -> (f64, f64) {
        let (prev, next) = (&self.groups[from], &self.groups[to]);
        let (mut through, mut step) = (NO_PATH, NO_PATH);
        for (&entry, &crossing) in next.cands.iter().zip(&next.widest_from) {
            for (&w, &exit) in exits.iter().zip(&prev.cands).filter(|(&w, _)| w > NO_PATH) {
                let edge = self.fabric.contiguous_rate(exit, entry).min(crossing);
                through = through.max(edge.min(w));
                step = step.max(edge);
            }
        }
        (through, step)
    }

    /// The group order after local search on the ring of `stops` with their
    /// entries and exits held (a group may be flipped: exit and entry swap).
    fn reordered(&self, stops: &[GroupStop]) -> Vec<usize> {
        let mut ring = stops.to_vec();
        if let Some(first) = stops.first() {
            ring.push(GroupStop {
                exit: first.entry,
                closing: true,
                ..*first
            });
        }
        let route = GroupRoute { tables: self };
        improve_route(&route, &mut ring);
        let ring = kicked(&route, ring);
        ring.iter()
            .filter(|s| !s.closing)
            .map(|s| s.group)
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Local search on routes (paths inside a group, rings of groups).

/// A route under local search: stops in order, the first and the last held
/// in place (a cycle is a path from a stop back to a copy of it). Its width
/// is the least of every stop's own width and every link between
/// neighbours.
trait Route {
    type Stop: Copy;
    /// The width of the link from one stop's exit to the next one's entry.
    fn link(&self, from: Self::Stop, to: Self::Stop) -> f64;
    /// The width of a stop itself (a group's inner path).
    fn inner(&self, stop: Self::Stop) -> f64;
    /// The stop traversed the other way.
    fn flip(&self, stop: Self::Stop) -> Self::Stop;
}

/// Hosts of one group, linked by their measured rates.
struct HostRoute<'a> {
    rate: &'a [Vec<f64>],
}

impl Route for HostRoute<'_> {
    type Stop = usize;
    fn link(&self, from: usize, to: usize) -> f64 {
        self.rate[from][to]
    }
    fn inner(&self, _: usize) -> f64 {
        f64::INFINITY
    }
    fn flip(&self, stop: usize) -> usize {
        stop
    }
}

/// Groups of a contiguous ring, each with its entry and exit.
struct GroupRoute<'t, 'f> {
    tables: &'t GroupTables<'f>,
}

impl Route for GroupRoute<'_, '_> {
    type Stop = GroupStop;
    fn link(&self, from: GroupStop, to: GroupStop) -> f64 {
        self.tables.fabric.contiguous_rate(from.exit, to.entry)
    }
    fn inner(&self, stop: GroupStop) -> f64 {
        if stop.closing {
            f64::INFINITY
        } else {
            self.tables.stop_width(stop)
        }
    }
    fn flip(&self, stop: GroupStop) -> GroupStop {
        GroupStop {
            entry: stop.exit,
            exit: stop.entry,
            ..stop
        }
    }
}

/// Where a route is narrowest: a stop itself, or the link after stop i.
#[derive(Clone, Copy)]
enum Narrowest {
    Stop(usize),
    Link(usize),
}

/// The route's narrowest element (the first of equals) and its width; None
/// when nothing limits it.
fn narrowest<R: Route>(route: &R, stops: &[R::Stop]) -> Option<(f64, Narrowest)> {
    let mut found: Option<(f64, Narrowest)> = None;
    let mut consider = |width: f64, at: Narrowest| {
        if width < found.map_or(f64::INFINITY, |(w, _)| w) {
            found = Some((width, at));
        }
    };
    for (i, &stop) in stops.iter().enumerate() {
        consider(route.inner(stop), Narrowest::Stop(i));
        if let Some(&next) = stops.get(i + 1) {
            consider(route.link(stop, next), Narrowest::Link(i));
        }
    }
    found
}

fn route_width<R: Route>(route: &R, stops: &[R::Stop]) -> f64 {
    narrowest(route, stops).map_or(f64::INFINITY, |(w, _)| w)
}

/// A change to a route: reverse stops lo..=hi (flipping each), or move
/// stops first..=end to just after stop `after`, reversed if `flipped`.
#[derive(Clone, Copy)]
enum Move {
    Reverse {
        lo: usize,
        hi: usize,
    },
    Relocate {
        first: usize,
        end: usize,
        after: usize,
        flipped: bool,
    },
}

/// Improves a route by 2-opt (segment reversal) and or-opt (moving a run
/// of stops elsewhere, as it is or reversed) moves that take out its
/// narrowest element. A move is taken only if everything it adds is wider
/// than the route's width m, so each one either widens the route or leaves
/// fewer elements at m: the search ends. Among such moves the one whose
/// added elements are widest wins (first of equals). Runs of up to
/// RELOCATION_WORK / len stops move (at least [`MIN_RELOCATED`]), so each
/// pass is O(len + RELOCATION_WORK); at most 4 len + 16 passes.
fn improve_route<R: Route>(route: &R, stops: &mut Vec<R::Stop>) {
    let longest_run = (RELOCATION_WORK / stops.len().max(1)).max(MIN_RELOCATED);
    for _ in 0..4 * stops.len() + 16 {
        let Some((floor, weak)) = narrowest(route, stops) else {
            return;
        };
        let mut search = MoveSearch {
            route,
            stops,
            floor,
            best: None,
        };
        match weak {
            Narrowest::Stop(i) => {
                search.reversals_from(i);
                search.reversals_to(i);
            }
            Narrowest::Link(i) => {
                search.reversals_from(i + 1);
                search.reversals_to(i);
                search.relocations_from(i + 1, longest_run);
                search.relocations_to(i, longest_run);
            }
        }
        let Some((_, chosen)) = search.best else {
            return;
        };
        apply_move(route, stops, chosen);
    }
}

fn apply_move<R: Route>(route: &R, stops: &mut Vec<R::Stop>, chosen: Move) {
    match chosen {
        Move::Reverse { lo, hi } => {
            stops[lo..=hi].reverse();
            for stop in &mut stops[lo..=hi] {
                *stop = route.flip(*stop);
            }
        }
        Move::Relocate {
            first,
            end,
            after,
            flipped,
        } => {
            let mut run: Vec<R::Stop> = stops.drain(first..=end).collect();
            if flipped {
                run.reverse();
                for stop in &mut run {
                    *stop = route.flip(*stop);
                }
            }
            let at = if after < first {
                after + 1
            } else {
                after + 1 - run.len()
            };
            stops.splice(at..at, run);
        }
    }
}

/// The moves that take out one narrow element, scored by the narrowest
/// element each adds. Only interior stops (not the first or the last) move.
struct MoveSearch<'a, R: Route> {
    route: &'a R,
    stops: &'a [R::Stop],
    floor: f64,
    best: Option<(f64, Move)>,
}

impl<R: Route> MoveSearch<'_, R> {
    fn offer(&mut self, width: f64, candidate: Move) {
        if width > self.floor && self.best.is_none_or(|(w, _)| width > w) {
            self.best = Some((width, candidate));
        }
    }

    /// Reversals of lo..=hi for every hi, lo fixed.
    fn reversals_from(&mut self, lo: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if lo == 0 || lo >= last {
            return;
        }
        let mut inside = f64::INFINITY;
        for hi in lo..last {
            inside = inside.min(r.inner(r.flip(s[hi])));
            if hi > lo {
                inside = inside.min(r.link(r.flip(s[hi]), r.flip(s[hi - 1])));
            }
            if inside <= self.floor {
                return; // every longer segment holds this element too
            }
            let ends = r
                .link(s[lo - 1], r.flip(s[hi]))
                .min(r.link(r.flip(s[lo]), s[hi + 1]));
            self.offer(inside.min(ends), Move::Reverse { lo, hi });
        }
    }

    /// Reversals of lo..=hi for every lo, hi fixed.
    fn reversals_to(&mut self, hi: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if hi == 0 || hi >= last {
            return;
        }
        let mut inside = f64::INFINITY;
        for lo in (1..=hi).rev() {
            inside = inside.min(r.inner(r.flip(s[lo])));
            if lo < hi {
                inside = inside.min(r.link(r.flip(s[lo + 1]), r.flip(s[lo])));
            }
            if inside <= self.floor {
                return;
            }
            let ends = r
                .link(s[lo - 1], r.flip(s[hi]))
                .min(r.link(r.flip(s[lo]), s[hi + 1]));
            self.offer(inside.min(ends), Move::Reverse { lo, hi });
        }
    }

    /// Runs first..=end for every end (up to `longest` stops), first fixed.
    fn relocations_from(&mut self, first: usize, longest: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if first == 0 || first >= last {
            return;
        }
        let mut flipped_inside = f64::INFINITY;
        for end in first..last.min(first + longest) {
            flipped_inside = flipped_inside.min(r.inner(r.flip(s[end])));
            if end > first {
                flipped_inside = flipped_inside.min(r.link(r.flip(s[end]), r.flip(s[end - 1])));
            }
            self.relocations(first, end, flipped_inside);
        }
    }

    /// Runs first..=end for every first (up to `longest` stops), end fixed.
    fn relocations_to(&mut self, end: usize, longest: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if end == 0 || end >= last {
            return;
        }
        let mut flipped_inside = f64::INFINITY;
        for first in (1.max((end + 1).saturating_sub(longest))..=end).rev() {
            flipped_inside = flipped_inside.min(r.inner(r.flip(s[first])));
            if first < end {
                flipped_inside = flipped_inside.min(r.link(r.flip(s[first + 1]), r.flip(s[first])));
            }
            self.relocations(first, end, flipped_inside);
        }
    }

    /// Moving stops first..=end to every other gap, as they are or reversed
    /// (`flipped_inside`: the narrowest element inside the reversed run).
    fn relocations(&mut self, first: usize, end: usize, flipped_inside: f64) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        let bridge = r.link(s[first - 1], s[end + 1]);
        if bridge <= self.floor {
            return;
        }
        let may_flip = flipped_inside > self.floor;
        for after in (0..first - 1).chain(end + 1..last) {
            let (before, behind) = (s[after], s[after + 1]);
            let moved = |flipped| Move::Relocate {
                first,
                end,
                after,
                flipped,
            };
            let kept = r.link(before, s[first]).min(r.link(s[end], behind));
            self.offer(bridge.min(kept), moved(false));
            if may_flip {
                let turned = r
                    .link(before, r.flip(s[end]))
                    .min(r.link(r.flip(s[first]), behind));
                self.offer(bridge.min(flipped_inside).min(turned), moved(true));
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
    fn rack_fabric(
        rng: &mut SplitMix,
        group_of: Vec<usize>,
        ngroups: usize,
        cap: CapRule,
    ) -> Fabric {
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
}
