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

/// Kept in 4-byte rank numbers, as every rank of a job holds one for the
/// job's life: when each host's ranks are consecutive (as launchers place
/// them) and rings go in the default order, only where each host starts;
/// otherwise 8 or 12 bytes a rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Topology {
    /// Each rank's host; None when each host's ranks are consecutive (then
    /// `starts` says it).
    host_of: Option<Vec<u32>>,
    /// Every rank, host after host (by lowest rank), each host's ranks
    /// ascending: the default ring order. None when that is 0, 1, …, n − 1
    /// (each host's ranks consecutive, as launchers place them).
    by_host: Option<Vec<u32>>,
    /// Where each host's ranks start in `by_host`, and its end.
    starts: Vec<u32>,
    /// The ring order (see the module comment) when not the default: a
    /// permutation of the ranks.
    order: Option<Vec<u32>>,
    /// Where each host's ranks start in `order`, when it keeps each host's
    /// ranks together in rank order (a host order, as
    /// [`Topology::with_host_order`] gives): then a rank's place in the
    /// ring and the host order are arithmetic, not a scan of the order.
    block_at: Option<Vec<u32>>,
}

impl Topology {
    /// Every rank on one host.
    pub fn single_host(nranks: usize) -> Topology {
        Topology::from_hosts(&vec![0; nranks])
    }

    /// From any per-rank host key (names, ids): equal keys share a host.
    pub fn from_hosts<K: Eq + std::hash::Hash + Clone>(keys: &[K]) -> Topology {
        assert!(
            keys.len() <= u32::MAX as usize,
            "more ranks than 4 bytes count"
        );
        let mut index: HashMap<K, u32> = HashMap::new();
        let mut sizes: Vec<u32> = Vec::new();
        let host_of: Vec<u32> = keys
            .iter()
            .map(|k| {
                let h = *index.entry(k.clone()).or_insert_with(|| {
                    sizes.push(0);
                    sizes.len() as u32 - 1
                });
                sizes[h as usize] += 1;
                h
            })
            .collect();
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        let mut at = 0;
        for size in &sizes {
            starts.push(at);
            at += size;
        }
        starts.push(at);
        let mut next = starts.clone();
        let mut by_host = vec![0; keys.len()];
        for (r, &h) in host_of.iter().enumerate() {
            by_host[next[h as usize] as usize] = r as u32;
            next[h as usize] += 1;
        }
        let consecutive = by_host.iter().enumerate().all(|(i, &r)| r as usize == i);
        let (host_of, by_host) = if consecutive {
            (None, None)
        } else {
            (Some(host_of), Some(by_host))
        };
        Topology {
            host_of,
            by_host,
            starts,
            order: None,
            block_at: None,
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
        let default = order.iter().enumerate().all(|(i, &r)| r == self.by_host(i));
        self.block_at = (!default).then(|| self.blocks_of(&order)).flatten();
        self.order = (!default).then(|| order.into_iter().map(|r| r as u32).collect());
        Ok(self)
    }

    /// Where each host's block starts in `order`, if every host's ranks
    /// are together there in rank order.
    fn blocks_of(&self, order: &[usize]) -> Option<Vec<u32>> {
        let mut at = vec![u32::MAX; self.nhosts()];
        let mut i = 0;
        while i < order.len() {
            let h = self.host_of(order[i]);
            if at[h] != u32::MAX
                || !self
                    .members(h)
                    .eq(order[i..].iter().copied().take(self.host_size(h)))
            {
                return None;
            }
            at[h] = i as u32;
            i += self.host_size(h);
        }
        Some(at)
    }

    /// Where host `h`'s ranks start in the ring order, when they are
    /// together there in rank order (always in the default order).
    fn block_start(&self, h: usize) -> Option<usize> {
        match (&self.order, &self.block_at) {
            (None, _) => Some(self.starts[h] as usize),
            (Some(_), Some(at)) => Some(at[h] as usize),
            (Some(_), None) => None,
        }
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
        let order = hosts.iter().flat_map(|&x| self.members(x)).collect();
        self.with_order(order)
    }

    pub fn nranks(&self) -> usize {
        *self.starts.last().expect("starts ends with the rank count") as usize
    }

    pub fn nhosts(&self) -> usize {
        self.starts.len() - 1
    }

    pub fn host_of(&self, rank: usize) -> usize {
        match &self.host_of {
            Some(h) => h[rank] as usize,
            None => {
                assert!(rank < self.nranks(), "rank {rank} of {}", self.nranks());
                self.starts.partition_point(|&s| s as usize <= rank) - 1
            }
        }
    }

    /// The i-th rank of the default ring order.
    fn by_host(&self, i: usize) -> usize {
        self.by_host.as_ref().map_or(i, |b| b[i] as usize)
    }

    fn members(&self, h: usize) -> impl Iterator<Item = usize> + '_ {
        let (a, b) = (self.starts[h] as usize, self.starts[h + 1] as usize);
        (a..b).map(|i| self.by_host(i))
    }

    fn host_size(&self, h: usize) -> usize {
        (self.starts[h + 1] - self.starts[h]) as usize
    }

    /// The ranks of host `h`, ascending.
    pub fn ranks_on(&self, h: usize) -> Vec<usize> {
        self.members(h).collect()
    }

    /// The ranks of host `h` as a range, when every host's ranks are
    /// consecutive (as launchers place them); else None.
    pub fn host_range(&self, h: usize) -> Option<std::ops::Range<usize>> {
        self.host_of
            .is_none()
            .then(|| self.starts[h] as usize..self.starts[h + 1] as usize)
    }

    /// The rank with local rank `local` on host `h`.
    pub fn rank_on(&self, h: usize, local: usize) -> usize {
        self.by_host(self.starts[h] as usize + local)
    }

    /// The lowest rank of host `h`.
    pub fn leader(&self, h: usize) -> usize {
        self.by_host(self.starts[h] as usize)
    }

    pub fn local_rank(&self, rank: usize) -> usize {
        self.members(self.host_of(rank))
            .position(|r| r == rank)
            .expect("rank on its host")
    }

    /// The ranks per host when every host has as many, else None.
    pub fn uniform_ranks_per_host(&self) -> Option<usize> {
        let l = if self.nhosts() == 0 {
            0
        } else {
            self.host_size(0)
        };
        (0..self.nhosts())
            .all(|h| self.host_size(h) == l)
            .then_some(l)
    }

    /// Most ranks on any host.
    pub fn max_ranks_per_host(&self) -> usize {
        (0..self.nhosts())
            .map(|h| self.host_size(h))
            .max()
            .unwrap_or(0)
    }

    /// The i-th rank of the ring order.
    pub fn ring_rank(&self, i: usize) -> usize {
        self.ring_at(i)
    }

    /// Where `rank` is in the ring order: arithmetic when each host's
    /// ranks are together in it (a host order), a scan otherwise.
    pub fn ring_pos(&self, rank: usize) -> usize {
        if self.order.is_none() && self.by_host.is_none() {
            return rank;
        }
        if let Some(at) = self.block_start(self.host_of(rank)) {
            return at + self.local_rank(rank);
        }
        (0..self.nranks())
            .find(|&i| self.ring_at(i) == rank)
            .expect("every rank is in the ring order")
    }

    fn ring_at(&self, i: usize) -> usize {
        match &self.order {
            Some(o) => o[i] as usize,
            None => self.by_host(i),
        }
    }

    /// See the module comment.
    pub fn ring_order(&self) -> Vec<usize> {
        (0..self.nranks()).map(|i| self.ring_at(i)).collect()
    }

    /// The hosts in the order the ring order first reaches them.
    pub fn host_order(&self) -> Vec<usize> {
        if self.order.is_none() {
            return (0..self.nhosts()).collect();
        }
        if let Some(at) = &self.block_at {
            let mut hosts: Vec<usize> = (0..self.nhosts()).collect();
            hosts.sort_unstable_by_key(|&h| at[h]);
            return hosts;
        }
        let mut seen = vec![false; self.nhosts()];
        (0..self.nranks())
            .map(|i| self.host_of(self.ring_at(i)))
            .filter(|&h| !std::mem::replace(&mut seen[h], true))
            .collect()
    }

    /// Whether rings go in the default order (host after host, by lowest
    /// rank).
    pub fn is_default_order(&self) -> bool {
        self.order.is_none()
    }

    /// The ranks with local rank `local`, one per host, in host order
    /// (uniform topologies).
    pub fn column(&self, local: usize) -> Vec<usize> {
        self.host_order()
            .into_iter()
            .map(|h| self.by_host(self.starts[h] as usize + local))
            .collect()
    }

    /// [`Topology::chain_from`] without listing it: where each host's
    /// ranks are together in the ring order (the default, or a host order)
    /// a position's rank and a rank's position are arithmetic (the root's
    /// host is one block of the order), so a tree's rank asks for its
    /// log2(n) partners in O(1) each, not O(n) for the list.
    pub fn chain(&self, root: usize) -> Chain<'_> {
        let home = self.host_of(root);
        let Some(start) = self.block_start(home) else {
            return Chain::Listed(self.chain_from(root));
        };
        let end = start + self.host_size(home);
        let at = start + self.local_rank(root);
        Chain::Blocks {
            topo: self,
            start,
            end,
            at,
        }
    }

    /// The chain of a pipelined broadcast from `root`: the ring order from
    /// the root on, except that the rest of the root's host comes first, so
    /// the chain leaves the root's host once (on one host: root, root+1, …,
    /// wrapping around).
    pub fn chain_from(&self, root: usize) -> Vec<usize> {
        let n = self.nranks();
        let at = (0..n).position(|i| self.ring_at(i) == root).unwrap_or(0);
        let rotated = (0..n).map(|i| self.ring_at((at + i) % n));
        let home = self.host_of(root);
        let (mut chain, away): (Vec<usize>, Vec<usize>) =
            rotated.partition(|&r| self.host_of(r) == home);
        chain.extend(away);
        chain
    }
}

/// A chain from a root ([`Topology::chain`]).
pub enum Chain<'t> {
    /// Hosts together in the ring order: the root's host is its places
    /// `start..end`, the root at place `at`.
    Blocks {
        topo: &'t Topology,
        start: usize,
        end: usize,
        at: usize,
    },
    Listed(Vec<usize>),
}

impl Chain<'_> {
    /// The rank at position `i` of the chain.
    pub fn at(&self, i: usize) -> usize {
        match self {
            Chain::Listed(v) => v[i],
            &Chain::Blocks {
                topo,
                start,
                end,
                at,
            } => {
                // The root's host from the root on, then its ranks before
                // the root, then the other hosts from the next one on.
                let home = end - start;
                let place = if i < end - at {
                    at + i
                } else if i < home {
                    start + (i - (end - at))
                } else {
                    (end + (i - home)) % topo.nranks()
                };
                topo.ring_at(place)
            }
        }
    }

    /// The position of `rank` in the chain.
    pub fn pos(&self, rank: usize) -> usize {
        match self {
            Chain::Listed(v) => v
                .iter()
                .position(|&r| r == rank)
                .expect("every rank is in the chain"),
            &Chain::Blocks {
                topo,
                start,
                end,
                at,
            } => {
                let n = topo.nranks();
                let place = topo.ring_pos(rank);
                if (start..end).contains(&place) {
                    if place >= at {
                        place - at
                    } else {
                        (end - at) + (place - start)
                    }
                } else {
                    (end - start) + (place + n - end) % n
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_and_ring_places_answer_as_their_lists() {
        let topos = [
            Topology::single_host(7),
            Topology::from_hosts(&[0, 0, 0, 1, 1, 2, 2, 2, 3]),
            Topology::from_hosts(&[0, 1, 0, 2, 1, 0, 2, 3]),
            Topology::from_hosts(&[0, 0, 1, 1, 2, 2])
                .with_host_order(&[2, 0, 1])
                .unwrap(),
            Topology::from_hosts(&[0, 1, 0, 2, 1, 0, 2, 3])
                .with_host_order(&[3, 1, 0, 2])
                .unwrap(),
            Topology::from_hosts(&[0, 0, 1, 1, 2, 2])
                .with_order(vec![1, 0, 2, 3, 5, 4])
                .unwrap(),
        ];
        for t in &topos {
            // Positions and the host order, against their definitions.
            let mut first_reached = Vec::new();
            for i in 0..t.nranks() {
                assert_eq!(t.ring_pos(t.ring_rank(i)), i, "{t:?}");
                let h = t.host_of(t.ring_rank(i));
                if !first_reached.contains(&h) {
                    first_reached.push(h);
                }
            }
            assert_eq!(t.host_order(), first_reached, "{t:?}");
            for root in 0..t.nranks() {
                let list = t.chain_from(root);
                let chain = t.chain(root);
                for (i, &r) in list.iter().enumerate() {
                    assert_eq!((chain.at(i), chain.pos(r)), (r, i), "{t:?} root {root}");
                }
            }
        }
    }

    #[test]
    fn consecutive_hosts_keep_no_default_order_and_answer_alike() {
        let together = Topology::from_hosts(&[0, 0, 0, 1, 1, 2]);
        let apart = Topology::from_hosts(&[0, 1, 0, 2, 1, 0]);
        assert!(together.by_host.is_none() && apart.by_host.is_some());
        assert!(together.host_of.is_none() && apart.host_of.is_some());
        let hosts = |t: &Topology| (0..6).map(|r| t.host_of(r)).collect::<Vec<_>>();
        assert_eq!(
            (hosts(&together), hosts(&apart)),
            (vec![0, 0, 0, 1, 1, 2], vec![0, 1, 0, 2, 1, 0])
        );
        assert_eq!((together.nranks(), together.nhosts()), (6, 3));
        assert_eq!(together.ring_order(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(apart.ring_order(), [0, 2, 5, 1, 4, 3]);
        assert_eq!(
            (together.ranks_on(1), apart.ranks_on(0)),
            (vec![3, 4], vec![0, 2, 5])
        );
        assert_eq!((together.leader(2), apart.leader(2)), (5, 3));
        assert_eq!(together.chain_from(4), [4, 3, 5, 0, 1, 2]);
        assert_eq!(apart.chain_from(4), [4, 1, 3, 0, 2, 5]);
        assert_eq!(Topology::from_hosts(&[0, 0, 1, 1]).column(1), [1, 3]);
    }

    #[test]
    fn the_default_ring_order_given_again_is_the_default() {
        let t = Topology::from_hosts(&["b", "a", "b", "a"]);
        let same = t.clone().with_order(vec![0, 2, 1, 3]).unwrap();
        assert!(same.is_default_order());
        assert_eq!(same, t);
        let other = t.clone().with_order(vec![1, 3, 0, 2]).unwrap();
        assert!(!other.is_default_order());
        assert_eq!(other.ring_order(), vec![1, 3, 0, 2]);
        assert_eq!(other.host_order(), vec![1, 0]);
        assert_eq!(other.chain_from(3), vec![3, 1, 0, 2]);
        assert_eq!((other.leader(1), other.local_rank(3)), (1, 1));
    }

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
