//! The network between hosts as measured ([`Fabric`]): per-pair rates and
//! the shared uplinks of host groups such as racks, and the width of a ring
//! or chain over it. The path finder (`pathfind`), the cost model and the
//! host order of a communicator read it.

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
    pub(crate) fn contiguous_rate(&self, a: usize, b: usize) -> f64 {
        let (ga, gb) = (self.group_of[a], self.group_of[b]);
        let alone = self.rate[a][b];
        if ga == gb {
            alone
        } else {
            alone.min(self.group_out[ga]).min(self.group_in[gb])
        }
    }
}
