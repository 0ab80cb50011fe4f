//! Flows sharing links by max-min fairness: the network half of the
//! simulator (issue 15).
//!
//! Terms:
//! - **link**: anything with a capacity in bytes/s that transfers share: a
//!   host's NIC in one direction, a rack's uplink in one direction, a
//!   rank's copy engine for shared memory.
//! - **flow**: one message in flight: the links it crosses (its **route**)
//!   and the bytes it has left.
//! - **max-min fair rates** (progressive filling): every flow's rate rises
//!   at the same pace until some link is full; the flows crossing a full
//!   link keep the rate they reached, the others keep rising. No flow can
//!   then go faster without slowing one that is no faster than it. TCP
//!   between hosts shares a bottleneck close to this; it is the usual
//!   flow-level model (SimGrid, ASTRA-sim's analytical network).
//!
//! Time advances from one flow's completion to the next ([`Flows::run_until`]),
//! rates recomputed for the flows a change touches, so the cost is per
//! message, not per byte.

use std::collections::BinaryHeap;

/// A link this close to full (relative to its capacity) counts as full:
/// subtractions of equal shares leave rounding dust.
const FULL: f64 = 1e-12;

/// Max-min fair rates (bytes/s) of flows crossing `routes` (link indices)
/// on links of capacity `cap` (bytes/s). A flow with an empty route is not
/// limited: `f64::INFINITY`.
pub fn max_min_rates(cap: &[f64], routes: &[&[usize]]) -> Vec<f64> {
    let mut rate = vec![0.0f64; routes.len()];
    let mut frozen: Vec<bool> = routes.iter().map(|r| r.is_empty()).collect();
    for (f, r) in routes.iter().enumerate() {
        if r.is_empty() {
            rate[f] = f64::INFINITY;
        }
    }
    let mut left = cap.to_vec();
    let mut crossing = vec![0usize; cap.len()];
    for r in routes.iter().filter(|r| !r.is_empty()) {
        for &l in r.iter() {
            crossing[l] += 1;
        }
    }
    while frozen.iter().any(|f| !f) {
        // The water level rises by the smallest fair share any link offers.
        let rise = (0..cap.len())
            .filter(|&l| crossing[l] > 0)
            .map(|l| left[l].max(0.0) / crossing[l] as f64)
            .fold(f64::INFINITY, f64::min);
        if !rise.is_finite() {
            break; // only links of infinite capacity left
        }
        for (rate, frozen) in rate.iter_mut().zip(&frozen) {
            if !frozen {
                *rate += rise;
            }
        }
        for l in 0..cap.len() {
            left[l] -= rise * crossing[l] as f64;
        }
        // Flows through a full link stop rising.
        let full: Vec<bool> = (0..cap.len())
            .map(|l| crossing[l] > 0 && cap[l].is_finite() && left[l] <= FULL * cap[l])
            .collect();
        for (f, r) in routes.iter().enumerate() {
            if !frozen[f] && r.iter().any(|&l| full[l]) {
                frozen[f] = true;
                for &l in r.iter() {
                    crossing[l] -= 1;
                }
            }
        }
    }
    // Still rising: only links of infinite capacity are left on its route.
    for (rate, frozen) in rate.iter_mut().zip(&frozen) {
        if !frozen {
            *rate = f64::INFINITY;
        }
    }
    rate
}

/// Completion times within this fraction of each other are one moment:
/// flows of a symmetric step end together and are handled in one batch.
const SAME_TIME: f64 = 1e-12;

struct Flow {
    id: usize,
    route: Vec<usize>,
    /// Where this flow sits in each of its links' lists (`on_link`), parallel
    /// to `route`, so leaving a link is O(1).
    pos: Vec<usize>,
    /// Bytes left at time `since`, sent at `rate` from then on.
    left: f64,
    since: f64,
    rate: f64,
    /// Bumped at every rate change: heap entries of older versions are stale.
    version: u64,
    live: bool,
}

/// A flow's predicted completion, earliest first in a max-heap.
struct Due(f64, usize, u64);
impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

/// Flows in flight on a set of links, and the clock.
///
/// Rates are recomputed incrementally: a flow that starts or ends changes
/// only the rates of flows connected to it through shared links (its
/// *component*), so only that component's max-min allocation is redone.
/// In a ring every host's flow has links of its own and a step costs O(n),
/// not O(n²); completions come off a heap of predicted finishing times
/// (entries made stale by a rate change are skipped).
pub struct Flows {
    cap: Vec<f64>,
    on_link: Vec<Vec<usize>>,
    flows: Vec<Flow>,
    free: Vec<usize>,
    due: BinaryHeap<Due>,
    dirty: Vec<usize>,
    /// Per link, the last component search that visited it.
    seen: Vec<u64>,
    search: u64,
    /// Per link, its index among the links of the component being solved.
    local: Vec<usize>,
    live: usize,
    now: f64,
}

impl Flows {
    /// Links of capacity `cap` (bytes/s), no flow, time 0.
    pub fn new(cap: Vec<f64>) -> Flows {
        assert!(
            cap.iter().all(|&c| c > 0.0),
            "every link needs a positive capacity"
        );
        let n = cap.len();
        Flows {
            cap,
            on_link: vec![Vec::new(); n],
            flows: Vec::new(),
            free: Vec::new(),
            due: BinaryHeap::new(),
            dirty: Vec::new(),
            seen: vec![0; n],
            search: 0,
            local: vec![0; n],
            live: 0,
            now: 0.0,
        }
    }

    pub fn now(&self) -> f64 {
        self.now
    }

    pub fn is_idle(&self) -> bool {
        self.live == 0
    }

    /// Starts flow `id` of `bytes` over `route` now.
    pub fn start(&mut self, id: usize, route: Vec<usize>, bytes: f64) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.flows.push(Flow {
                id: 0,
                route: Vec::new(),
                pos: Vec::new(),
                left: 0.0,
                since: 0.0,
                rate: 0.0,
                version: 0,
                live: false,
            });
            self.flows.len() - 1
        });
        let mut pos = Vec::with_capacity(route.len());
        for &l in &route {
            pos.push(self.on_link[l].len());
            self.on_link[l].push(slot);
            self.dirty.push(l);
        }
        let f = &mut self.flows[slot];
        f.version += 1;
        *f = Flow {
            id,
            route,
            pos,
            left: bytes.max(0.0),
            since: self.now,
            rate: 0.0,
            version: f.version,
            live: true,
        };
        self.live += 1;
        if f.route.is_empty() {
            // Nothing limits it: done at once.
            f.rate = f64::INFINITY;
            self.due.push(Due(self.now, slot, f.version));
        }
    }

    /// The time the next flow finishes (infinite when none is in flight).
    pub fn next_completion(&mut self) -> f64 {
        self.reallocate();
        while let Some(d) = self.due.peek() {
            let f = &self.flows[d.1];
            if f.live && f.version == d.2 {
                return d.0;
            }
            self.due.pop();
        }
        f64::INFINITY
    }

    /// Runs until the next flow finishes or time `until`, whichever comes
    /// first; returns the flows that finished at the new time (none when
    /// `until` came first).
    pub fn run_until(&mut self, until: f64) -> Vec<usize> {
        let next = self.next_completion();
        if next > until {
            if until.is_finite() {
                self.now = self.now.max(until);
            }
            return Vec::new();
        }
        self.now = self.now.max(next);
        let horizon = next + SAME_TIME * next.abs();
        let mut done = Vec::new();
        while let Some(d) = self.due.peek() {
            if d.0 > horizon {
                break;
            }
            let Due(_, slot, version) = self.due.pop().expect("peeked");
            if !(self.flows[slot].live && self.flows[slot].version == version) {
                continue;
            }
            done.push(self.flows[slot].id);
            self.finish(slot);
        }
        done
    }

    fn finish(&mut self, slot: usize) {
        let route = std::mem::take(&mut self.flows[slot].route);
        let pos = std::mem::take(&mut self.flows[slot].pos);
        for (&l, &p) in route.iter().zip(&pos) {
            let list = &mut self.on_link[l];
            list.swap_remove(p);
            if let Some(&moved) = list.get(p) {
                let m = &mut self.flows[moved];
                let k = m.route.iter().position(|&x| x == l).expect("on its link");
                m.pos[k] = p;
            }
            self.dirty.push(l);
        }
        let f = &mut self.flows[slot];
        f.live = false;
        f.version += 1;
        self.live -= 1;
        self.free.push(slot);
    }

    /// Max-min rates again for the flows connected to a link that changed.
    fn reallocate(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        self.search += 1;
        let mark = self.search;
        let mut links = Vec::new();
        let mut stack = std::mem::take(&mut self.dirty);
        let mut members: Vec<usize> = Vec::new();
        while let Some(l) = stack.pop() {
            if self.seen[l] == mark {
                continue;
            }
            self.seen[l] = mark;
            links.push(l);
            for &f in &self.on_link[l] {
                // A flow is added once: by the first of its links visited.
                let first_seen = self.flows[f]
                    .route
                    .iter()
                    .all(|&m| m == l || self.seen[m] != mark);
                if first_seen {
                    members.push(f);
                }
                for &m in &self.flows[f].route {
                    if self.seen[m] != mark {
                        stack.push(m);
                    }
                }
            }
        }
        // The allocation over the component's links only, renumbered.
        let cap: Vec<f64> = links.iter().map(|&l| self.cap[l]).collect();
        for (i, &l) in links.iter().enumerate() {
            self.local[l] = i;
        }
        let routes: Vec<Vec<usize>> = members
            .iter()
            .map(|&f| self.flows[f].route.iter().map(|&l| self.local[l]).collect())
            .collect();
        let routes: Vec<&[usize]> = routes.iter().map(Vec::as_slice).collect();
        let rates = max_min_rates(&cap, &routes);
        let now = self.now;
        for (&slot, rate) in members.iter().zip(rates) {
            let f = &mut self.flows[slot];
            f.left = (f.left - f.rate * (now - f.since)).max(0.0);
            if !f.left.is_finite() {
                f.left = 0.0;
            }
            f.since = now;
            f.rate = rate;
            f.version += 1;
            let at = if f.left <= 0.0 || rate.is_infinite() {
                now
            } else {
                now + f.left / rate
            };
            self.due.push(Due(at, slot, f.version));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn max_min_is_the_textbook_allocation() {
        // Link 0 (10) carries f0 and f1; link 1 (4) carries f1 and f2: link 1
        // is the bottleneck of f1 and f2 (2 each), f0 takes what is left of
        // link 0 (8).
        let r = max_min_rates(&[10.0, 4.0], &[&[0], &[0, 1], &[1]]);
        assert!(
            close(r[0], 8.0) && close(r[1], 2.0) && close(r[2], 2.0),
            "{r:?}"
        );
        // One link, three flows: a third each; no links: unlimited.
        let r = max_min_rates(&[9.0], &[&[0], &[0], &[0], &[]]);
        assert!(
            r[..3].iter().all(|&x| close(x, 3.0)) && r[3].is_infinite(),
            "{r:?}"
        );
        // A flow through an unlimited link only, beside one that is limited.
        let r = max_min_rates(&[f64::INFINITY, 5.0], &[&[0], &[0, 1]]);
        assert!(r[0].is_infinite() && close(r[1], 5.0), "{r:?}");
        let r = max_min_rates(&[f64::INFINITY], &[&[0]]);
        assert!(r[0].is_infinite(), "{r:?}");
    }

    #[test]
    fn one_message_takes_its_bytes_over_the_rate() {
        let mut f = Flows::new(vec![1e9]);
        f.start(7, vec![0], 3e9);
        assert_eq!(f.run_until(f64::INFINITY), vec![7]);
        assert!(close(f.now(), 3.0));
        assert!(f.is_idle());
    }

    #[test]
    fn a_flow_that_ends_leaves_the_link_to_the_others() {
        // 1 and 3 bytes share a link of 1 byte/s: both at 0.5 until t = 2,
        // then the second alone at 1: done at 4, the total bytes over the
        // rate.
        let mut f = Flows::new(vec![1.0]);
        f.start(0, vec![0], 1.0);
        f.start(1, vec![0], 3.0);
        assert_eq!(f.run_until(f64::INFINITY), vec![0]);
        assert!(close(f.now(), 2.0));
        assert_eq!(f.run_until(f64::INFINITY), vec![1]);
        assert!(close(f.now(), 4.0));
    }

    #[test]
    fn the_clock_stops_at_until_without_finishing_anything() {
        let mut f = Flows::new(vec![2.0]);
        f.start(0, vec![0], 4.0);
        assert!(f.run_until(1.0).is_empty());
        assert!(close(f.now(), 1.0));
        // Another flow joins: 2 bytes left each at 1 byte/s.
        f.start(1, vec![0], 2.0);
        let mut done = f.run_until(f64::INFINITY);
        done.sort_unstable();
        assert_eq!(done, vec![0, 1]);
        assert!(close(f.now(), 3.0));
    }

    #[test]
    fn a_ring_on_a_uniform_network_moves_at_link_rate() {
        // n hosts, each with an out and an in link of rate c; a ring step
        // sends b bytes from every host to the next: every flow alone on
        // its links, b / c per step.
        let (n, c, b) = (8usize, 1.25e8, 1e6);
        let mut f = Flows::new(vec![c; 2 * n]);
        for step in 0..3 {
            for h in 0..n {
                let to = (h + 1) % n;
                f.start(h, vec![h, n + to], b);
            }
            let mut done = Vec::new();
            while done.len() < n {
                done.extend(f.run_until(f64::INFINITY));
            }
            assert!(close(f.now(), (step + 1) as f64 * b / c), "{}", f.now());
        }
    }
}
