//! Contiguous rings: those that visit the hosts of every group one after
//! another. The widest paths through each group come from `paths.rs`; this
//! file picks the group order and each group's entry and exit, exactly over
//! subsets for few groups, by greedy orders and local search for many.

use super::local_search::{improve_route, kicked, GroupRoute};
use super::paths::{
    exact_group_limit, exact_paths_from, heuristic_path, local_rates, outside_reach, GroupPaths,
    EXACT_GROUP_MAX_HOSTS,
};
use super::{rotated_to, widest, Fabric, NO_PATH};

/// Candidate entry/exit hosts of a group too large for exact paths: the
/// heuristic path is built for each ordered pair of them (12 pairs).
const HEURISTIC_ENDPOINTS: usize = 4;
/// Up to this many groups, every group order is searched (over subsets).
const EXACT_ORDER_MAX_GROUPS: usize = 8;
/// Greedy group orders tried, one per entry host of the first group.
const GREEDY_SEEDS: usize = 4;
/// Rounds of (reorder groups, re-choose entries and exits) past the seeds.
const GROUP_ORDER_ROUNDS: usize = 4;

/// The widest ring found among those that visit every group contiguously,
/// starting with host 0.
pub(super) fn grouped_ring(f: &Fabric) -> Vec<usize> {
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
pub(super) fn group_members(f: &Fabric) -> Vec<Vec<usize>> {
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

/// One group's place in a contiguous ring: entered at host `entry`, left at
/// host `exit`. `closing` marks the sentinel that stands for returning to
/// the first group's entry (its own width is unlimited).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GroupStop {
    pub(super) group: usize,
    pub(super) entry: usize,
    pub(super) exit: usize,
    pub(super) closing: bool,
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
pub(super) struct GroupTables<'a> {
    pub(super) fabric: &'a Fabric,
    pub(super) groups: Vec<GroupPaths>,
    /// `slot[h]`: h's index among its group's candidates (usize::MAX if none).
    pub(super) slot: Vec<usize>,
}

impl<'a> GroupTables<'a> {
    pub(super) fn new(fabric: &'a Fabric, members: &[Vec<usize>]) -> GroupTables<'a> {
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
    pub(super) fn stop_width(&self, stop: GroupStop) -> f64 {
        self.groups[stop.group].width(self.slot[stop.entry], self.slot[stop.exit])
    }

    /// The ring's hosts, group after group.
    pub(super) fn expand(&self, stops: &[GroupStop]) -> Vec<usize> {
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
    pub(super) fn best_ring_by_subsets(&self) -> Vec<GroupStop> {
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
    pub(super) fn best_ring_by_search(&self) -> Vec<GroupStop> {
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
