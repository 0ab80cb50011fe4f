//! The profiling procedure: which rounds of flows to run between hosts and
//! what to conclude from their rates. It does not run a round itself: the
//! caller hands it a runner, so the same procedure measures a real network
//! (`comm/profile.rs`, over TCP) and a modeled one (`sim::run`, by max-min
//! fair sharing), and the simulator finds what the library would find.
//!
//! A **round** is a set of flows started together, at most one out of and
//! one into each host; the runner returns each flow's rate (bytes/s).
//!
//! Two ways to find the groups of hosts that share a bottleneck (racks
//! behind an uplink):
//!
//! - **Pairs alone** (up to `pairs_max` hosts): every ordered pair in a
//!   round of its own, n(n−1) rounds. Finds an uplink slower than the
//!   hosts' NICs wherever the hosts sit ([`infer::groups_from_rates`]), and
//!   the groups' capacities by loading each one ([`infer::capacity`]).
//! - **Shifts** ([`probe_shifts`]): rounds in which every host i sends to
//!   i + s (mod n), for s = 1, 2, 4, … and then a binary search. A rack of
//!   g hosts in a row has min(s, g) flows leaving it at shift s; once that
//!   is more than its uplink carries at the hosts' rate, exactly the flows
//!   that leave a rack slow down, and the runs of slow senders end at the
//!   racks' last hosts. About 2·log2(n) rounds, so it scales to thousands
//!   of hosts; it finds racks whose uplinks are faster than one NIC but
//!   shared (an oversubscribed fat tree), which no pair alone shows. It
//!   assumes racks are runs of hosts in host order (as hostfiles list them)
//!   and checks what it found against every round; where that does not
//!   fit, it searches once more from the start (a stall or a burst of load
//!   misleads one search, a real bottleneck both), and where the second
//!   does not fit either, it reports one group and says why.
//!
//! Up to `pairs_max` hosts the pairs run first, and the shifts only when
//! the pairs found one group (and there are 4 hosts or more).
//!
//! TCP on a shared queue sometimes stalls a flow for a retransmission
//! timeout, which looks like a bottleneck for one flow. So a slow pair
//! whose hosts agree on the others is measured again, a shifted round with
//! slow flows runs twice (slow only if slow both times), and a group's
//! capacity leaves out flows far below their peers ([`infer::capacity`]).

use super::file::{self, HostRates};
use super::infer;

/// Hosts up to which a profile measures every pair alone by default: 16
/// hosts are 240 rounds, about 15 s at 1 Gbit/s (`cadence topo profile`).
pub const PAIRS_MAX: usize = 16;
/// The same bound for the profile a job takes at start-up: every pair of 4
/// hosts is 12 rounds; past that the shifted rounds (about 2·log2(n) + 4
/// whatever n) keep set-up short. What they miss (racks dealt out across
/// the host order) a `cadence topo profile` file gives.
pub const STARTUP_PAIRS_MAX: usize = 4;

/// A flow: (sending host, receiving host).
pub type Flow = (usize, usize);

/// Runs one round: the flows' rates (bytes/s), in order.
pub type RunRound<'r, E> = dyn FnMut(&[Flow]) -> Result<Vec<f64>, E> + 'r;

/// A round that ran: its name (for people and `cadence topo show`), its
/// flows and their rates.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    pub name: String,
    pub flows: Vec<Flow>,
    pub rates: Vec<f64>,
}

/// What the profile found.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// Bytes/s of one flow a → b alone: measured (pairs), or estimated from
    /// the hosts' best rates and the groups' capacities (shifts).
    pub rates: Vec<Vec<f64>>,
    /// Where `rates` are estimated (shifts alone): the hosts' best rates
    /// they follow from, which a topology file stores instead.
    pub host_rates: Option<HostRates>,
    pub groups: Vec<Vec<usize>>,
    pub group_out: Vec<Option<f64>>,
    pub group_in: Vec<Option<f64>>,
    pub rounds: Vec<Round>,
    /// `"pairs"`, `"pairs, then shifts"` or `"shifts"`.
    pub method: String,
}

/// How a profile runs.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Most hosts whose every pair is measured alone.
    pub pairs_max: usize,
    /// Also run the rank-order ring and the path finder's ring under load
    /// (for the record and `cadence topo show`).
    pub rings: bool,
}

/// Runs rounds and keeps them, with each host's best rate out and in.
struct Log<'r, E> {
    run: &'r mut RunRound<'r, E>,
    rounds: Vec<Round>,
    best_out: Vec<f64>,
    best_in: Vec<f64>,
}

impl<E> Log<'_, E> {
    /// Runs `flows` and notes each host's best rates; keeps nothing.
    fn measure(&mut self, flows: &[Flow]) -> Result<Vec<f64>, E> {
        let rates = if flows.is_empty() {
            Vec::new()
        } else {
            (self.run)(flows)?
        };
        for (&(a, b), &r) in flows.iter().zip(&rates) {
            self.best_out[a] = self.best_out[a].max(r);
            self.best_in[b] = self.best_in[b].max(r);
        }
        Ok(rates)
    }

    fn run(&mut self, name: String, flows: Vec<Flow>) -> Result<Vec<f64>, E> {
        let rates = self.measure(&flows)?;
        self.rounds.push(Round {
            name,
            flows,
            rates: rates.clone(),
        });
        Ok(rates)
    }

    /// What a flow a → b gets with nothing shared: the slower of its ends'
    /// best rates.
    fn reference(&self, a: usize, b: usize) -> f64 {
        self.best_out[a].min(self.best_in[b])
    }

    /// Flows that ran well below their reference: they share a
    /// bottleneck with others ([`infer::SHARED`]).
    fn slow(&self, flows: &[Flow], rates: &[f64]) -> Vec<bool> {
        flows
            .iter()
            .zip(rates)
            .map(|(&(a, b), &r)| r < infer::SHARED * self.reference(a, b))
            .collect()
    }

    /// [`Log::slow`] of a round of at most one flow per sender, by sender
    /// (hosts that did not send: false).
    fn slow_senders(&self, round: &Round) -> Vec<bool> {
        let mut by_sender = vec![false; self.best_out.len()];
        for (&(a, _), x) in round
            .flows
            .iter()
            .zip(self.slow(&round.flows, &round.rates))
        {
            by_sender[a] = x;
        }
        by_sender
    }
}

/// Every host i sends to i + s (mod n), except `skip`.
pub fn shift_flows(n: usize, s: usize, skip: Option<usize>) -> Vec<Flow> {
    (0..n)
        .filter(|&i| Some(i) != skip)
        .map(|i| (i, (i + s) % n))
        .collect()
}

/// Profiles `n` hosts with `run` doing the rounds; `say` gets a line per
/// stage.
pub fn profile<E>(
    n: usize,
    opts: Options,
    run: &mut RunRound<'_, E>,
    say: &dyn Fn(&str),
) -> Result<Found, E> {
    let mut log = Log {
        run,
        rounds: Vec::new(),
        best_out: vec![0.0; n],
        best_in: vec![0.0; n],
    };
    let mut found = Found {
        rates: vec![vec![0.0; n]; n],
        host_rates: None,
        groups: vec![(0..n).collect()],
        group_out: vec![None],
        group_in: vec![None],
        rounds: Vec::new(),
        method: String::new(),
    };
    if n < 2 {
        return Ok(found);
    }
    let pairs = n <= opts.pairs_max;
    if pairs {
        let all: Vec<Flow> = (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .collect();
        for &(a, b) in &all {
            // One round each; recorded together below.
            found.rates[a][b] = log.measure(&[(a, b)])?[0];
        }
        // A pair that is slow although its two hosts are fast or slow with
        // every other host alike looks like a TCP stall, not an uplink (an
        // uplink between them would show with the others too): once more,
        // the faster of the two.
        for _ in 0..2 {
            for (a, b) in twins_not_fast(&found.rates) {
                let r = log.measure(&[(a, b)])?[0];
                found.rates[a][b] = found.rates[a][b].max(r);
            }
        }
        let alone = all.iter().map(|&(a, b)| found.rates[a][b]).collect();
        log.rounds.push(Round {
            name: "pairs alone".into(),
            flows: all,
            rates: alone,
        });
        found.groups = infer::groups_from_rates(&found.rates);
        say(&format!("groups from the alone rates: {:?}", found.groups));
        found.method = "pairs".into();
    }
    if pairs && found.groups.len() > 1 {
        found.group_out.clear();
        found.group_in.clear();
        for (g, members) in found.groups.clone().iter().enumerate() {
            let outside: Vec<usize> = (0..n).filter(|h| !members.contains(h)).collect();
            for (dir, flows) in [
                ("out of", infer::spread_flows(members, &outside)),
                ("into", infer::spread_flows(&outside, members)),
            ] {
                let got = log.run(format!("{dir} group {g}"), flows.clone())?;
                let alone: Vec<f64> = flows.iter().map(|&(a, b)| found.rates[a][b]).collect();
                let cap = infer::capacity(&got, &alone);
                match dir {
                    "out of" => found.group_out.push(cap),
                    _ => found.group_in.push(cap),
                }
            }
        }
    } else if n >= 3 && (!pairs || n >= 4) {
        // (After the pairs, 3 hosts are not worth it: a rack of two sends
        // one flow out in every shifted round, no more than a pair alone.)
        let shifts = probe_shifts_checked(n, &mut log, say)?;
        if pairs {
            found.method = "pairs, then shifts".into();
        } else {
            found.method = "shifts".into();
            (found.rates, found.host_rates) = estimated_rates(&log, &shifts);
        }
        found.groups = shifts.groups;
        found.group_out = shifts.group_out;
        found.group_in = shifts.group_in;
    } else if !pairs {
        // Two hosts and no pairs: their one flow each way is all there is.
        found.method = "shifts".into();
        log.run("pair".into(), vec![(0, 1), (1, 0)])?;
        (found.rates, found.host_rates) = estimated_rates(&log, &Shifts::one_group(n));
    }
    if opts.rings {
        let fabric = super::pathfind::Fabric {
            rate: found.rates.clone(),
            group_of: group_of(n, &found.groups),
            group_out: cap_or_inf(&found.group_out),
            group_in: cap_or_inf(&found.group_in),
        };
        let found_ring = super::pathfind::widest_ring(&fabric);
        for (name, order) in [
            ("ring in rank order", (0..n).collect::<Vec<_>>()),
            ("ring in found order", found_ring),
        ] {
            log.run(name.into(), infer::ring_flows(&order))?;
        }
    }
    found.rounds = log.rounds;
    Ok(found)
}

/// Both directions of every pair whose hosts are not fast with each other
/// ([`infer::fast_pairs`]) but fast or not with the other hosts alike, but
/// for a quarter of them at most (or one): other stalls may touch them too.
/// Two hosts in different racks differ on every rack-mate of either.
fn twins_not_fast(rates: &[Vec<f64>]) -> Vec<Flow> {
    let n = rates.len();
    let fast = infer::fast_pairs(rates);
    let allowed = ((n.saturating_sub(2)) / 4).max(1);
    let mut out = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            let differ = (0..n)
                .filter(|&c| c != a && c != b && fast[a][c] != fast[b][c])
                .count();
            if !fast[a][b] && differ <= allowed {
                out.extend([(a, b), (b, a)]);
            }
        }
    }
    out
}

fn group_of(n: usize, groups: &[Vec<usize>]) -> Vec<usize> {
    let mut of = vec![0; n];
    for (g, members) in groups.iter().enumerate() {
        for &h in members {
            of[h] = g;
        }
    }
    of
}

fn cap_or_inf(c: &[Option<f64>]) -> Vec<f64> {
    c.iter().map(|c| c.unwrap_or(f64::INFINITY)).collect()
}

/// What the shifts found.
#[derive(Clone, Debug, PartialEq)]
struct Shifts {
    groups: Vec<Vec<usize>>,
    group_out: Vec<Option<f64>>,
    group_in: Vec<Option<f64>>,
}

impl Shifts {
    fn one_group(n: usize) -> Shifts {
        Shifts {
            groups: vec![(0..n).collect()],
            group_out: vec![None],
            group_in: vec![None],
        }
    }
}

/// Alone rates as the shifts estimate them: the slower end's best rate,
/// and across groups no more than either group's capacity; and the hosts'
/// best rates they follow from.
fn estimated_rates<E>(log: &Log<'_, E>, s: &Shifts) -> (Vec<Vec<f64>>, Option<HostRates>) {
    let host = HostRates {
        out: log.best_out.clone(),
        inn: log.best_in.clone(),
    };
    let of = group_of(log.best_out.len(), &s.groups);
    let rates = file::estimated_rates(&host, &of, &s.group_out, &s.group_in);
    (rates, Some(host))
}

/// The hosts outside group `g`, taking one from each other group in turn,
/// so that flows to (from) the first few load every other group alike.
fn round_robin(groups: &[Vec<usize>], g: usize) -> Vec<usize> {
    let longest = groups.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest)
        .flat_map(|i| {
            groups
                .iter()
                .enumerate()
                .filter(move |&(k, _)| k != g)
                .filter_map(move |(_, m)| m.get(i).copied())
        })
        .collect()
}

/// Runs shift `s` (every host i to i + s mod n, except `skip`) and returns
/// which flows slowed down, by sender.
fn shifted<E>(
    log: &mut Log<'_, E>,
    n: usize,
    s: usize,
    skip: Option<usize>,
) -> Result<Vec<bool>, E> {
    let name = match skip {
        None => format!("shift {s}"),
        Some(h) => format!("shift {s} without host {h}"),
    };
    let flows = shift_flows(n, s, skip);
    let mut rates = log.measure(&flows)?;
    if log.slow(&flows, &rates).contains(&true) {
        // TCP can stall a flow for a retransmission timeout or two when a
        // shared queue drops; a bottleneck slows a flow every time. A flow
        // counts as slow only if it is slow in both tries.
        let again = log.measure(&flows)?;
        for (r, a) in rates.iter_mut().zip(again) {
            *r = r.max(a);
        }
    }
    log.rounds.push(Round { name, flows, rates });
    Ok(log.slow_senders(log.rounds.last().expect("just ran")))
}

/// The forward shift rounds run so far, by shift, each judged with every
/// host's best rate as known now: (shift, slow by sender).
fn rejudged<E>(log: &Log<'_, E>, n: usize) -> Vec<(usize, Vec<bool>)> {
    let mut out: Vec<(usize, Vec<bool>)> = log
        .rounds
        .iter()
        .filter_map(|r| {
            let s: usize = r.name.strip_prefix("shift ")?.parse().ok()?;
            (s <= n / 2).then_some((s, r))
        })
        .map(|(s, r)| (s, log.slow_senders(r)))
        .collect();
    out.sort_by_key(|(s, _)| *s);
    out.dedup_by_key(|(s, _)| *s);
    out
}

/// [`probe_shifts`], and once more from the start when what it found
/// contradicts its own rounds: a stall in both tries of a round, or a
/// burst of load on the hosts, can make a flow inside a rack look slow,
/// where a real bottleneck contradicts the search again. The first
/// search's rounds are kept, renamed `discarded shift …`, and judged no
/// more; each host's best rates from them stay (a stall only lowers rates).
/// A second contradiction stands: one group, and the reason said.
fn probe_shifts_checked<E>(
    n: usize,
    log: &mut Log<'_, E>,
    say: &dyn Fn(&str),
) -> Result<Shifts, E> {
    let why = match probe_shifts(n, log, say)? {
        Ok(shifts) => return Ok(shifts),
        Err(why) => why,
    };
    say(&format!("{why}; measuring the shifts once more"));
    for round in log
        .rounds
        .iter_mut()
        .filter(|r| r.name.starts_with("shift"))
    {
        round.name = format!("discarded {}", round.name);
    }
    Ok(probe_shifts(n, log, say)?.unwrap_or_else(|why| {
        say(&format!(
            "{why} again: the bottlenecks are not racks of hosts in a row; one group"
        ));
        Shifts::one_group(n)
    }))
}

/// Finds racks as runs of hosts by loading them with shifted rounds (see
/// the module comment); `n` ≥ 3. `Ok(Err(why))` when the racks it finds
/// contradict a round.
fn probe_shifts<E>(
    n: usize,
    log: &mut Log<'_, E>,
    say: &dyn Fn(&str),
) -> Result<Result<Shifts, String>, E> {
    // ±1 first: every host sends to a neighbour on each side, so (racks of
    // two or more) each host's best rate is seen inside its rack. Shift 1
    // is judged again once both are in.
    shifted(log, n, 1, None)?;
    let plus_one = log.rounds.len() - 1;
    shifted(log, n, n - 1, None)?;
    let mut slow = log.slow_senders(&log.rounds[plus_one]);
    let mut s = 1;
    if !slow.contains(&true) {
        // Double until some flows slow down, then search for the smallest
        // shift that slows any.
        let (mut lo, mut hi) = (1, None);
        let mut t = 2;
        while t <= n / 2 {
            let x = shifted(log, n, t, None)?;
            if x.contains(&true) {
                hi = Some((t, x));
                break;
            }
            lo = t;
            t = if t == n / 2 { n } else { (2 * t).min(n / 2) };
        }
        if hi.is_none() {
            // A later round may have shown a host's rate that an earlier
            // one fell short of (no two hosts in a row share a rack): judge
            // every round again.
            let again = rejudged(log, n);
            if let Some(k) = again.iter().position(|(_, x)| x.contains(&true)) {
                lo = if k == 0 { 0 } else { again[k - 1].0 };
                hi = Some(again[k].clone());
            }
        }
        let Some((mut h, mut x)) = hi else {
            say(&format!(
                "shifts 1..{}: no flows slowed down: one group, no shared bottleneck",
                n / 2
            ));
            return Ok(Ok(Shifts::one_group(n)));
        };
        while h - lo > 1 {
            let mid = (lo + h) / 2;
            let m = shifted(log, n, mid, None)?;
            if m.contains(&true) {
                (h, x) = (mid, m);
            } else {
                lo = mid;
            }
        }
        (s, slow) = (h, x);
    }
    // Forward, a rack's last s hosts send out of it: the racks start after
    // each run of slow senders. Backward (shift −s), its first s: they start
    // where a run starts. Both, so that a run slowed by the rack it sends
    // into still shows the rack it leaves.
    let back = if s == n - s {
        slow.clone()
    } else {
        shifted(log, n, n - s, None)?
    };
    let mut starts: Vec<usize> = (0..n)
        .filter(|&i| slow[i] && !slow[(i + 1) % n])
        .map(|i| (i + 1) % n)
        .chain((0..n).filter(|&i| back[i] && !back[(i + n - 1) % n]))
        .collect();
    starts.sort_unstable();
    starts.dedup();
    if starts.is_empty() {
        // Every flow left its rack: s is the racks' size. Leaving host 0
        // out relieves its rack's uplink, and its rack-mates' flows speed
        // up.
        let without = shifted(log, n, s, Some(0))?;
        let fast = |h: usize| h == 0 || !without[h];
        let mut first = 0;
        let mut size = 1;
        while size < n && fast((first + n - 1) % n) {
            first = (first + n - 1) % n;
            size += 1;
        }
        while size < n && fast((first + size) % n) {
            size += 1;
        }
        if size == 1 || size == n {
            return Ok(Err(format!(
                "shift {s}: every flow slowed down, and leaving host 0 out relieved {}",
                if size == 1 {
                    "none of the others"
                } else {
                    "all of them"
                }
            )));
        }
        starts = (0..n.div_ceil(size))
            .map(|k| (first + k * size) % n)
            .collect();
        starts.sort_unstable();
        starts.dedup();
    }
    let mut groups: Vec<Vec<usize>> = (0..starts.len())
        .map(|k| {
            let (a, b) = (starts[k], starts[(k + 1) % starts.len()]);
            let len = match (b + n - a) % n {
                0 => n,
                l => l,
            };
            let mut g: Vec<usize> = (0..len).map(|j| (a + j) % n).collect();
            g.sort_unstable();
            g
        })
        .collect();
    groups.sort_by_key(|g| g[0]);
    // Check: every slow flow of every shifted round leaves its group.
    let of = group_of(n, &groups);
    for round in log.rounds.iter().filter(|r| r.name.starts_with("shift")) {
        let unexplained = round
            .flows
            .iter()
            .zip(log.slow(&round.flows, &round.rates))
            .find(|(&(a, b), slow)| *slow && of[a] == of[b]);
        if let Some((&(a, b), _)) = unexplained {
            return Ok(Err(format!(
                "{}: flow {a} -> {b} slowed down inside the group found ({groups:?})",
                round.name
            )));
        }
    }
    if groups.len() < 2 {
        return Ok(Ok(Shifts::one_group(n)));
    }
    say(&format!(
        "groups from the shifts (first slowed at shift {s}): {groups:?}"
    ));
    // Capacities. Racks of the largest size: from the round at shift s,
    // where each sends s flows into the next, which is loaded alike: the
    // fewest flows that fill an uplink (more flows into a shared queue lose
    // more packets, and TCP stalls). A smaller rack (the last one, say)
    // would be measured against its neighbour's load, so it gets rounds of
    // its own: its hosts to (from) hosts of every other rack in turn.
    // (At shift 1, an uplink slower than one NIC, one flow would not tell
    // the uplink from a NIC: then every host sends across, shift by the
    // largest rack.)
    let widest = groups.iter().map(Vec::len).max().unwrap_or(1);
    let s_cap = if s >= 2 { s } else { widest % n };
    let name = format!("shift {s_cap}");
    if !log.rounds.iter().any(|r| r.name == name) {
        shifted(log, n, s_cap, None)?;
    }
    let whole = log
        .rounds
        .iter()
        .rposition(|r| r.name == name)
        .expect("ran");
    let (mut group_out, mut group_in) = (Vec::new(), Vec::new());
    for (g, members) in groups.iter().enumerate() {
        for into in [false, true] {
            let round = if members.len() == widest {
                log.rounds[whole].clone()
            } else {
                let others = round_robin(&groups, g);
                let flows = if into {
                    infer::spread_flows(&others, members)
                } else {
                    infer::spread_flows(members, &others)
                };
                let dir = if into { "into" } else { "out of" };
                log.run(format!("{dir} group {g}"), flows)?;
                log.rounds.last().expect("just ran").clone()
            };
            let (got, alone): (Vec<f64>, Vec<f64>) = round
                .flows
                .iter()
                .zip(&round.rates)
                .filter(|(&(a, b), _)| of[a] != of[b] && (if into { of[b] } else { of[a] }) == g)
                .map(|(&(a, b), &r)| (r, log.reference(a, b)))
                .unzip();
            let cap = infer::capacity(&got, &alone);
            if into {
                group_in.push(cap);
            } else {
                group_out.push(cap);
            }
        }
    }
    Ok(Ok(Shifts {
        groups,
        group_out,
        group_in,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::file::TopoFile;
    use crate::schedule::Topology;
    use crate::sim::exec::Model;

    const NIC: f64 = 12.5e9;

    /// A leaf/spine fabric: `rack_of[h]`, each host's NIC at `NIC` both
    /// ways, each rack's uplink at `uplink[r]` both ways; rates by max-min
    /// fairness, times (1 − noise·u) with u in [0, 1).
    struct Fat {
        rack_of: Vec<usize>,
        uplink: Vec<f64>,
        noise: f64,
        seed: u64,
        /// Every this many rounds one flow stalls (a TCP timeout): 5 % of
        /// its rate. 0: never.
        stall_every: usize,
        calls: usize,
    }

    impl Fat {
        fn uniform(n: usize, per: usize, blocking: f64) -> Fat {
            let racks = n.div_ceil(per);
            Fat {
                rack_of: (0..n).map(|h| h / per).collect(),
                // A leaf that is not full still has all its uplinks.
                uplink: vec![per as f64 * NIC / blocking; racks],
                noise: 0.0,
                seed: 1,
                stall_every: 0,
                calls: 0,
            }
        }

        /// The simulator's model of this fabric (its max-min sharing is
        /// what the rounds measure here), then noise and stalls.
        fn rates(&mut self, flows: &[Flow]) -> Vec<f64> {
            let n = self.rack_of.len();
            let hosts: Vec<usize> = (0..n).collect();
            let mut model = Model::flat(Topology::from_hosts(&hosts), NIC, 0.0);
            model.group_of = self.rack_of.clone();
            model.group_out = self.uplink.clone();
            model.group_in = self.uplink.clone();
            let mut rates: Vec<f64> = model
                .host_flow_rates(flows)
                .into_iter()
                .map(|x| x * (1.0 - self.noise * self.unit()))
                .collect();
            self.calls += 1;
            if self.stall_every > 0 && self.calls.is_multiple_of(self.stall_every) {
                let victim = (self.unit() * rates.len() as f64) as usize;
                rates[victim] *= 0.05;
            }
            rates
        }

        fn unit(&mut self) -> f64 {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            (self.seed >> 11) as f64 / (1u64 << 53) as f64
        }

        fn groups(&self) -> Vec<Vec<usize>> {
            let mut g: Vec<Vec<usize>> = vec![Vec::new(); self.uplink.len()];
            for (h, &r) in self.rack_of.iter().enumerate() {
                g[r].push(h);
            }
            g
        }
    }

    fn run_on(fat: &mut Fat, pairs_max: usize) -> Found {
        let n = fat.rack_of.len();
        let opts = Options {
            pairs_max,
            rings: false,
        };
        let mut run = |f: &[Flow]| -> Result<Vec<f64>, ()> { Ok(fat.rates(f)) };
        profile(n, opts, &mut run, &|_| {}).unwrap()
    }

    /// A shifts-only profile of `n` hosts through `run`, and what it said.
    fn shifts_saying(n: usize, run: &mut RunRound<'_, ()>) -> (Found, String) {
        let lines = std::cell::RefCell::new(Vec::new());
        let opts = Options {
            pairs_max: 0,
            rings: false,
        };
        let found = profile(n, opts, run, &|m| lines.borrow_mut().push(m.to_string())).unwrap();
        let said = lines.into_inner().join("\n");
        (found, said)
    }

    #[test]
    fn shifts_find_oversubscribed_racks_whose_uplinks_beat_a_nic() {
        // (hosts, per rack, blocking): the study's 2:1 fat tree from 64 to
        // 1024 hosts, racks that do not divide the hosts, 3:2 and 4:1.
        for (n, per, blocking) in [
            (64, 32, 2.0),
            (1024, 32, 2.0),
            (100, 16, 2.0),
            (48, 12, 1.5),
            (40, 8, 4.0),
            (6, 3, 1.25),
            (21, 7, 2.0),
        ] {
            let mut fat = Fat::uniform(n, per, blocking);
            let found = run_on(&mut fat, 0);
            assert_eq!(found.method, "shifts");
            assert_eq!(found.groups, fat.groups(), "{n} hosts, {per} per rack");
            for (g, members) in found.groups.iter().enumerate() {
                // A rack's uplink is a bottleneck when its hosts together
                // send more than it carries (not so in a rack left short).
                let up = fat.uplink[fat.rack_of[members[0]]];
                let want = (up < infer::SHARED * members.len() as f64 * NIC).then_some(up);
                for cap in [found.group_out[g], found.group_in[g]] {
                    match (cap, want) {
                        (Some(c), Some(w)) => {
                            assert!((c / w - 1.0).abs() < 0.01, "{n}/{per} g{g}: {c} vs {w}")
                        }
                        _ => assert_eq!(cap, want, "{n}/{per} g{g}"),
                    }
                }
            }
            // Rounds: about 2·log2(n) and never n.
            let rounds = found.rounds.len();
            assert!(
                rounds <= 2 * (n as f64).log2().ceil() as usize + 4,
                "{n}: {rounds}"
            );
            // A pair alone inside a rack runs at the NIC; across, no faster
            // than the uplinks.
            assert_eq!(found.rates[0][1], NIC);
            assert_eq!(found.rates[n - 1][0], NIC.min(fat.uplink[0]));
        }
    }

    #[test]
    fn a_shifts_profile_stores_the_hosts_rates_not_the_matrix() {
        // 1024 hosts: the file holds 2 × 1024 rates, not a million, and
        // reads back to exactly the rates the profile estimated.
        let mut fat = Fat::uniform(1024, 32, 2.0);
        let found = run_on(&mut fat, 0);
        let hr = found
            .host_rates
            .clone()
            .expect("shifts keep the hosts' rates");
        let file = TopoFile {
            version: file::VERSION,
            kind: file::KIND.into(),
            note: String::new(),
            hosts: (0..1024).map(|h| format!("h{h}")).collect(),
            rates: found.rates.clone(),
            host_rates: Some(hr),
            groups: found.groups.clone(),
            group_out: found.group_out.clone(),
            group_in: found.group_in.clone(),
            patterns: serde_json::Value::Null,
            profile: serde_json::Value::Null,
        };
        let text = file.to_text();
        assert!(text.len() < 200_000, "{} bytes", text.len());
        let back = TopoFile::parse(&text, std::path::Path::new("t.json")).unwrap();
        assert_eq!(back.rates, found.rates);
        // Measured pairs keep their matrix.
        let mut small = Fat::uniform(8, 4, 4.0);
        assert_eq!(run_on(&mut small, 16).host_rates, None);
    }

    #[test]
    fn shifts_find_racks_that_start_anywhere_and_survive_noise_and_stalls() {
        // Racks of 8 whose first starts at host 3 (hosts 0..2 sit in the
        // last rack, wrapping around), 2:1, rates with up to 5 % noise, and
        // in every other round one flow stalled.
        let n = 40;
        for stall_every in [0, 2, 3] {
            let mut fat = Fat::uniform(n, 8, 2.0);
            fat.rack_of = (0..n).map(|h| ((h + n - 3) % n) / 8).collect();
            fat.noise = 0.05;
            fat.stall_every = stall_every;
            let found = run_on(&mut fat, 0);
            let mut want = fat.groups();
            want.sort_by_key(|g| g[0]);
            assert_eq!(found.groups, want, "stall every {stall_every}");
            for cap in found.group_out.iter().chain(&found.group_in) {
                let c = cap.expect("every rack is a bottleneck");
                assert!((c / fat.uplink[0] - 1.0).abs() < 0.1, "{c}");
            }
        }
    }

    #[test]
    fn a_non_blocking_fabric_is_one_group_and_mixed_racks_are_refused() {
        let mut flat = Fat::uniform(64, 16, 1.0);
        let found = run_on(&mut flat, 0);
        assert_eq!(found.groups, vec![(0..64).collect::<Vec<_>>()]);
        assert_eq!(found.group_out, vec![None]);
        // Racks interleaved with the host order: not runs, so the shifts
        // cannot place them and say so rather than guess.
        let mut mixed = Fat::uniform(32, 8, 2.0);
        mixed.rack_of = (0..32).map(|h| h % 4).collect();
        let (found, said) = shifts_saying(32, &mut |f| Ok(mixed.rates(f)));
        assert_eq!(found.groups.len(), 1, "{:?}", found.groups);
        assert!(said.contains("not racks of hosts in a row"), "{said}");
    }

    #[test]
    fn a_search_its_own_rounds_contradict_is_measured_once_more() {
        // Two racks of 3 behind uplinks at 1.25 NICs (the emulated test's
        // fabric). Flow 0 -> 1, inside a rack, stalls in both tries of the
        // first round: the first search finds a wrong rack or a flow slow
        // inside one, and the second, from the start, finds the racks.
        let mut fat = Fat::uniform(6, 3, 1.25);
        let mut calls = 0;
        let mut run = |f: &[Flow]| {
            calls += 1;
            let mut rates = fat.rates(f);
            if calls <= 2 {
                for (&flow, r) in f.iter().zip(rates.iter_mut()) {
                    if flow == (0, 1) {
                        *r *= 0.3;
                    }
                }
            }
            Ok(rates)
        };
        let (found, said) = shifts_saying(6, &mut run);
        assert_eq!(found.groups, vec![vec![0, 1, 2], vec![3, 4, 5]], "{said}");
        assert!(said.contains("measuring the shifts once more"), "{said}");
        assert!(
            found.rounds.iter().any(|r| r.name == "discarded shift 1"),
            "{:?}",
            found.rounds.iter().map(|r| &r.name).collect::<Vec<_>>()
        );
        // The uplinks' capacity comes from the second search's rounds.
        for cap in found.group_out.iter().chain(&found.group_in) {
            let c = cap.expect("both uplinks are bottlenecks");
            assert!((c / (3.0 * NIC / 1.25) - 1.0).abs() < 0.01, "{c}");
        }
    }

    #[test]
    fn a_stalled_pair_does_not_split_its_rack() {
        // Uplinks at a quarter of a NIC, racks of 4 dealt out; every fifth
        // or seventh round one flow stalls (a pair alone: the pair).
        for every in [5, 7] {
            let mut fat = Fat::uniform(8, 4, 1.0);
            fat.rack_of = vec![0, 1, 1, 0, 0, 1, 0, 1];
            fat.uplink = vec![NIC / 4.0; 2];
            fat.stall_every = every;
            let found = run_on(&mut fat, 16);
            assert_eq!(found.groups, fat.groups(), "every {every}");
        }
    }

    /// The start-up profile's cost is bounded by rounds that grow with
    /// log2 of the hosts, racks or none, noise or none: the flows a run
    /// measures (`calls`, rounds run again included) at 16, 64 and 256
    /// hosts, each a round of about the start-up's 0.05 s plus a barrier
    /// and an exchange of the results. `--nocapture` prints the table
    /// docs/topology.md quotes.
    #[test]
    fn the_start_up_profile_runs_a_bounded_number_of_rounds() {
        for n in [16usize, 64, 256] {
            let bound = 2 * n.ilog2() as usize + 4;
            for (what, per, blocking, noise) in [
                ("one switch", n, 1.0, 0.0),
                ("racks of 8, 2:1", 8, 2.0, 0.0),
                ("racks of 8, 2:1, 5 % noise", 8, 2.0, 0.05),
            ] {
                let mut fat = Fat::uniform(n, per, blocking);
                fat.noise = noise;
                let found = run_on(&mut fat, STARTUP_PAIRS_MAX);
                println!(
                    "{n:4} hosts, {what:28}: {:3} rounds run ({} kept), {} groups",
                    fat.calls,
                    found.rounds.len(),
                    found.groups.len()
                );
                assert!(
                    fat.calls <= bound,
                    "{n} hosts, {what}: {} rounds",
                    fat.calls
                );
            }
        }
    }

    #[test]
    fn small_jobs_keep_their_measured_pairs() {
        for n in [2, 3] {
            let mut fat = Fat::uniform(n, n, 1.0);
            let found = run_on(&mut fat, 16);
            assert_eq!(found.method, "pairs", "{n} hosts");
            assert_eq!(found.rounds.len(), 1, "{n} hosts: the pairs alone only");
            assert_eq!(found.rates[1][0], NIC);
        }
        let mut two = Fat::uniform(2, 2, 1.0);
        let found = run_on(&mut two, 0);
        assert_eq!((found.method.as_str(), found.rates[0][1]), ("shifts", NIC));
    }

    #[test]
    fn shifts_find_uplinks_slower_than_a_nic() {
        let mut fat = Fat::uniform(20, 4, 1.0);
        fat.uplink = vec![NIC / 4.0; 5];
        let found = run_on(&mut fat, 0);
        assert_eq!(found.groups, fat.groups());
        assert_eq!(found.group_out, vec![Some(NIC / 4.0); 5]);
        assert_eq!(found.rates[3][4], NIC / 4.0);
    }

    #[test]
    fn pairs_find_slow_uplinks_anywhere_and_shifts_follow_when_they_find_none() {
        // Uplinks slower than a NIC, racks interleaved: the pairs see them.
        let mut slow = Fat::uniform(6, 3, 1.0);
        slow.rack_of = vec![0, 1, 0, 1, 0, 1];
        slow.uplink = vec![NIC / 4.0; 2];
        let found = run_on(&mut slow, 16);
        assert_eq!(found.method, "pairs");
        assert_eq!(found.groups, vec![vec![0, 2, 4], vec![1, 3, 5]]);
        assert_eq!(found.rates[0][1], NIC / 4.0);
        assert!(found.group_out.iter().all(|c| c.is_some()));
        // Uplinks faster than a NIC but shared: the pairs see one group,
        // then the shifts find the racks.
        let mut shared = Fat::uniform(8, 4, 2.0);
        let found = run_on(&mut shared, 16);
        assert_eq!(found.method, "pairs, then shifts");
        assert_eq!(found.groups, shared.groups());
        assert_eq!(found.rates[0][7], NIC, "pairs keep their measured rates");
        assert_eq!(found.group_out, vec![Some(2.0 * NIC); 2]);
    }
}
