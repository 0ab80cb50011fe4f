//! The engine's links, by peer. A job of n ranks gives each rank n − 1
//! peers, but a rank links to few of them (its same-host peers and the
//! partners of its algorithms, made on first use): so the links sit in a
//! dense list, found by a peer through a short index sorted by peer (a
//! binary search over the links that exist: nothing kept per rank of the
//! job), and walking them (upkeep, aborts, stall notices) costs what the
//! rank uses, not n.

use crate::transport::Link;

pub struct Links {
    nranks: usize,
    /// (peer, place in `links`), sorted by peer.
    index: Vec<(u32, u32)>,
    links: Vec<(usize, Link)>,
}

impl Links {
    /// No link yet, to any of `nranks` ranks.
    pub fn new(nranks: usize) -> Links {
        Links {
            nranks,
            index: Vec::new(),
            links: Vec::new(),
        }
    }

    fn place(&self, peer: usize) -> Result<usize, usize> {
        let peer = u32::try_from(peer).unwrap_or(u32::MAX);
        self.index.binary_search_by_key(&peer, |e| e.0)
    }

    /// The link to `peer`, if there is one.
    pub fn get(&self, peer: usize) -> Option<&Link> {
        let at = self.place(peer).ok()?;
        Some(&self.links[self.index[at].1 as usize].1)
    }

    pub fn get_mut(&mut self, peer: usize) -> Option<&mut Link> {
        let at = self.place(peer).ok()?;
        Some(&mut self.links[self.index[at].1 as usize].1)
    }

    /// Adds the link to `peer`; hands it back when `peer` has one already
    /// (or is not a rank of the job).
    pub fn insert(&mut self, peer: usize, link: Link) -> Result<(), Link> {
        if peer >= self.nranks {
            return Err(link);
        }
        match self.place(peer) {
            Ok(_) => Err(link),
            Err(at) => {
                self.index
                    .insert(at, (peer as u32, self.links.len() as u32));
                self.links.push((peer, link));
                Ok(())
            }
        }
    }

    /// Every link, with its peer, in the order they were made.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Link)> {
        self.links.iter().map(|(p, l)| (*p, l))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Link> {
        self.links.iter_mut().map(|(_, l)| l)
    }

    /// How many links there are.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tcp::TcpLink;

    fn link(peer: usize) -> Link {
        Link::tcp(TcpLink::new(peer, Vec::new(), 1).unwrap())
    }

    #[test]
    fn a_slot_finds_its_link_and_takes_one_only() {
        let mut links = Links::new(5);
        assert!(links.is_empty() && links.get(3).is_none() && links.get(9).is_none());
        assert!(links.insert(3, link(3)).is_ok());
        assert!(links.insert(1, link(1)).is_ok());
        assert!(links.insert(3, link(3)).is_err(), "a second link to rank 3");
        assert!(
            links.insert(5, link(5)).is_err(),
            "rank 5 is not in the job"
        );
        assert_eq!(links.len(), 2);
        assert_eq!(links.get(3).unwrap().stats().peer, 3);
        assert_eq!(links.get_mut(1).unwrap().stats().peer, 1);
        assert!(links.get(0).is_none());
        let peers: Vec<usize> = links.iter().map(|(p, _)| p).collect();
        assert_eq!(peers, [3, 1]);
        assert_eq!(links.iter_mut().count(), 2);
    }
}
