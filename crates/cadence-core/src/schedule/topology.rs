//! Where the ranks are: which host each rank runs on. Generators that care
//! (the ring orders, hierarchical schedules) read it; the others ignore it.
//!
//! Terms:
//! - **host**: a group of ranks that share memory (shared-memory transport
//!   inside, TCP between). Hosts are numbered by their lowest rank, so host 0
//!   holds rank 0.
//! - **local rank**: a rank's position among the ranks of its host, in rank
//!   order.
//! - **ring order**: every rank, host after host, each host's ranks in rank
//!   order. A ring in this order crosses each host boundary exactly once, so
//!   no host's NIC carries more than one ring's worth of traffic each way.
//! - **uniform**: every host has the same number of ranks (hierarchical
//!   schedules need it: ranks with the same local rank form the cross-host
//!   groups).

use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Topology {
    host_of: Vec<usize>,
    /// Ranks of each host, ascending.
    members: Vec<Vec<usize>>,
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
        Topology { host_of, members }
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
        self.members.iter().flatten().copied().collect()
    }

    /// The ranks with local rank `local`, one per host, host by host
    /// (uniform topologies).
    pub fn column(&self, local: usize) -> Vec<usize> {
        self.members.iter().map(|m| m[local]).collect()
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
}
