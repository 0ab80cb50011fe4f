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
//! rates recomputed at each, so the cost is per message, not per byte.

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

struct Flow {
    id: usize,
    route: Vec<usize>,
    left: f64,
}

/// Flows in flight on a set of links, and the clock.
pub struct Flows {
    cap: Vec<f64>,
    active: Vec<Flow>,
    now: f64,
}

impl Flows {
    /// Links of capacity `cap` (bytes/s), no flow, time 0.
    pub fn new(cap: Vec<f64>) -> Flows {
        assert!(
            cap.iter().all(|&c| c > 0.0),
            "every link needs a positive capacity"
        );
        Flows {
            cap,
            active: Vec::new(),
            now: 0.0,
        }
    }

    pub fn now(&self) -> f64 {
        self.now
    }

    pub fn is_idle(&self) -> bool {
        self.active.is_empty()
    }

    /// Starts flow `id` of `bytes` over `route` now.
    pub fn start(&mut self, id: usize, route: Vec<usize>, bytes: f64) {
        self.active.push(Flow {
            id,
            route,
            left: bytes.max(0.0),
        });
    }

    /// Runs until the next flow finishes or time `until`, whichever comes
    /// first; returns the flows that finished at the new time (none when
    /// `until` came first).
    pub fn run_until(&mut self, until: f64) -> Vec<usize> {
        if self.active.is_empty() {
            self.now = self.now.max(until);
            return Vec::new();
        }
        let routes: Vec<&[usize]> = self.active.iter().map(|f| f.route.as_slice()).collect();
        let rate = max_min_rates(&self.cap, &routes);
        let finish_in = |f: &Flow, r: f64| if f.left <= 0.0 { 0.0 } else { f.left / r };
        let next = self
            .active
            .iter()
            .zip(&rate)
            .map(|(f, &r)| finish_in(f, r))
            .fold(f64::INFINITY, f64::min);
        let dt = next.min(until - self.now).max(0.0);
        self.now += dt;
        let mut done = Vec::new();
        let mut kept = Vec::with_capacity(self.active.len());
        for (mut f, r) in self.active.drain(..).zip(rate) {
            // Finished now: its own finishing time was the earliest (up to
            // rounding), and the clock did not stop short of it.
            let ends = finish_in(&f, r) <= next * (1.0 + 1e-12) && dt >= next;
            if ends {
                done.push(f.id);
            } else {
                f.left -= r * dt;
                kept.push(f);
            }
        }
        self.active = kept;
        done
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
