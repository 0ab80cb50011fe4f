//! Where the ranks are: which host each rank runs on. Generators that care
//! (the ring orders, hierarchical schedules) read it; the others ignore it.
//!
//! Terms:
//! - **host**: a group of ranks that share memory (shared-memory transport
//!   inside, TCP between). Hosts are numbered by their lowest rank, so host 0
//!   holds rank 0.
//! - **local rank**: a rank's position among the ranks of its host, in rank
//!   order.
//! - **ring order**: the order rings (and chains, and the cross-host rings of
//!   hierarchical schedules) visit the ranks in. By default every rank, host
//!   after host (by lowest rank), each host's ranks in rank order: a ring in
//!   this order crosses each host boundary exactly once, so no host's NIC
//!   carries more than one ring's worth of traffic each way. A topology file
//!   gives a better **host order** (`fabric::pathfind`: the widest ring over
//!   racks and uplinks), and [`Topology::with_order`] takes any permutation
//!   of the ranks: the verifier proves every generator under random ones.
//! - **uniform**: every host has the same number of ranks (hierarchical
//!   schedules need it: ranks with the same local rank form the cross-host
//!   groups).

use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Topology {
    host_of: Vec<usize>,
    /// Ranks of each host, ascending.
    members: Vec<Vec<usize>>,
    /// The ring order (see the module comment): a permutation of the ranks.
    order: Vec<usize>,
}

impl Topology {
    /// Every rank on one host.
    pub fn single_host(nranks: usize) -> Topology {
        Topology::from_hosts(&vec![0; nranks])
    }

    /// From any per-rank host key (names, ids): equal keys share a host.
    pub fn from_hosts<K: Eq + std::hash::Hash + Clone>(keys: &[K]) -> Topology {
        let mut index: HashMap<K, usize> = HashMap::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let host_of = keys
            .iter()
            .enumerate()
            .map(|(r, k)| {
                let h = *index.entry(k.clone()).or_insert_with(|| {
                    members.push(Vec::new());
                    members.len() - 1
                });
                members[h].push(r);
                h
            })
            .collect();
        let order = members.iter().flatten().copied().collect();
        Topology {
            host_of,
            members,
            order,
        }
    }

    /// The same hosts with rings in `order`, any permutation of the ranks.
    pub fn with_order(mut self, order: Vec<usize>) -> Result<Topology, String> {
        let n = self.nranks();
        let mut seen = vec![false; n];
        for &r in &order {
            if r >= n || std::mem::replace(&mut seen[r], true) {
                return Err(format!(
                    "ring order {order:?} is not a permutation of ranks 0..{n}"
                ));
            }
        }
        if order.len() != n {
            return Err(format!("ring order {order:?} does not list all {n} ranks"));
        }
        self.order = order;
        Ok(self)
    }

    /// Rings visit the hosts in `hosts` (a permutation of the host indices),
    /// each host's ranks in rank order.
    pub fn with_host_order(self, hosts: &[usize]) -> Result<Topology, String> {
        let h = self.nhosts();
        let mut sorted = hosts.to_vec();
        sorted.sort_unstable();
        if sorted != (0..h).collect::<Vec<_>>() {
            return Err(format!(
                "host order {hosts:?} is not a permutation of hosts 0..{h}"
            ));
        }
        let order = hosts
            .iter()
            .flat_map(|&x| self.members[x].iter().copied())
            .collect();
        self.with_order(order)
    }

    pub fn nranks(&self) -> usize {
        self.host_of.len()
    }

    pub fn nhosts(&self) -> usize {
        self.members.len()
    }

    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of[rank]
    }

    /// The ranks of host `h`, ascending.
    pub fn ranks_on(&self, h: usize) -> &[usize] {
        &self.members[h]
    }

    pub fn local_rank(&self, rank: usize) -> usize {
        let on = self.ranks_on(self.host_of(rank));
        on.iter()
            .position(|&r| r == rank)
            .expect("rank on its host")
    }

    /// The ranks per host when every host has as many, else None.
    pub fn uniform_ranks_per_host(&self) -> Option<usize> {
        let l = self.members.first().map_or(0, Vec::len);
        self.members.iter().all(|m| m.len() == l).then_some(l)
    }

    /// Most ranks on any host.
    pub fn max_ranks_per_host(&self) -> usize {
        self.members.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// See the module comment.
    pub fn ring_order(&self) -> Vec<usize> {
        self.order.clone()
    }

    /// The hosts in the order the ring order first reaches them.
    pub fn host_order(&self) -> Vec<usize> {
        let mut seen = vec![false; self.nhosts()];
        self.order
            .iter()
            .map(|&r| self.host_of[r])
            .filter(|&h| !std::mem::replace(&mut seen[h], true))
            .collect()
    }

    /// Whether rings go in the default order (host after host, by lowest
    /// rank).
    pub fn is_default_order(&self) -> bool {
        self.order
            .iter()
            .copied()
            .eq(self.members.iter().flatten().copied())
    }

    /// The ranks with local rank `local`, one per host, in host order
    /// (uniform topologies).
    pub fn column(&self, local: usize) -> Vec<usize> {
        self.host_order()
            .into_iter()
            .map(|h| self.members[h][local])
            .collect()
    }

    /// The chain of a pipelined broadcast from `root`: the ring order from
    /// the root on, except that the rest of the root's host comes first, so
    /// the chain leaves the root's host once (on one host: root, root+1, …,
    /// wrapping around).
    pub fn chain_from(&self, root: usize) -> Vec<usize> {
        let n = self.nranks();
        let at = self.order.iter().position(|&r| r == root).unwrap_or(0);
        let rotated = (0..n).map(|i| self.order[(at + i) % n]);
        let home = self.host_of[root];
        let (mut chain, away): (Vec<usize>, Vec<usize>) =
            rotated.partition(|&r| self.host_of[r] == home);
        chain.extend(away);
        chain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_numbered_by_their_lowest_rank() {
        let t = Topology::from_hosts(&["b", "a", "b", "a", "c"]);
        assert_eq!(t.nhosts(), 3);
        assert_eq!(t.ranks_on(0), &[0, 2]);
        assert_eq!(t.ranks_on(1), &[1, 3]);
        assert_eq!(t.ranks_on(2), &[4]);
        assert_eq!(t.local_rank(3), 1);
        assert_eq!(t.ring_order(), vec![0, 2, 1, 3, 4]);
        assert_eq!(t.uniform_ranks_per_host(), None);
        assert_eq!(t.max_ranks_per_host(), 2);
        let u = Topology::from_hosts(&[0, 1, 0, 1]);
        assert_eq!(u.uniform_ranks_per_host(), Some(2));
        assert_eq!(u.column(1), vec![2, 3]);
        assert_eq!(Topology::single_host(3).ring_order(), vec![0, 1, 2]);
    }

    #[test]
    fn a_host_order_reorders_rings_columns_and_chains() {
        // Hosts 0..3, two ranks each; racks would be {0, 2} and {1, 3}.
        let t = Topology::from_hosts(&[0, 0, 1, 1, 2, 2, 3, 3]);
        assert!(t.is_default_order());
        assert_eq!(t.chain_from(3), vec![3, 2, 4, 5, 6, 7, 0, 1]);
        let t = t.with_host_order(&[0, 2, 1, 3]).unwrap();
        assert!(!t.is_default_order());
        assert_eq!(t.ring_order(), vec![0, 1, 4, 5, 2, 3, 6, 7]);
        assert_eq!(t.host_order(), vec![0, 2, 1, 3]);
        assert_eq!(t.column(1), vec![1, 5, 3, 7]);
        // From rank 5: the rest of its host (4), then on around the ring.
        assert_eq!(t.chain_from(5), vec![5, 4, 2, 3, 6, 7, 0, 1]);
        assert_eq!(Topology::single_host(4).chain_from(2), vec![2, 3, 0, 1]);
        let bad = Topology::from_hosts(&[0, 1, 2]);
        assert!(bad.clone().with_host_order(&[0, 0, 1]).is_err());
        assert!(bad.clone().with_order(vec![0, 1]).is_err());
        assert!(bad.with_order(vec![0, 1, 3]).is_err());
    }
}
