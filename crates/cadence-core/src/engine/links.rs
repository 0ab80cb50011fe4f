//! The engine's links, by peer. A job of n ranks gives each rank n − 1
//! peers, but a rank links to few of them (its same-host peers and the
//! partners of its algorithms, made on first use): so the links sit in a
//! dense list, found by a peer through a short index sorted by peer (a
//! binary search over the links that exist: nothing kept per rank of the
//! job), and walking them (aborts, stall notices) costs what the rank
//! uses, not n. Upkeep walks fewer still: only the links with several
//! paths that carried something since they were last found at rest
//! ([`Links::stir`], [`Links::upkeep`]), so a rank that once talked to
//! every peer (an alltoall) does not look at all of them every
//! millisecond.

use crate::error::ErrorKind;
use crate::transport::Link;
use std::time::Instant;

pub struct Links {
    nranks: usize,
    /// (peer, place in `links`), sorted by peer.
    index: Vec<(u32, u32)>,
    /// Each link, with its peer and whether it is in `restless`.
    links: Vec<(usize, Link, bool)>,
    /// Places of the links with background work possibly due.
    restless: Vec<u32>,
}

impl Links {
    /// No link yet, to any of `nranks` ranks.
    pub fn new(nranks: usize) -> Links {
        Links {
            nranks,
            index: Vec::new(),
            links: Vec::new(),
            restless: Vec::new(),
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

    /// The link to `peer`, about to carry something: a link with several
    /// paths joins the ones upkeep walks (told first, so that its rest does
    /// not count as a stall).
    pub fn stir(&mut self, peer: usize) -> Option<&mut Link> {
        let at = self.place(peer).ok()?;
        let place = self.index[at].1;
        let (_, link, restless) = &mut self.links[place as usize];
        if !*restless && link.multipath() {
            link.wake(Instant::now());
            *restless = true;
            self.restless.push(place);
        }
        Some(link)
    }

    /// Every link with several paths joins the ones upkeep walks (control
    /// frames were queued on all).
    pub fn stir_all(&mut self) {
        for place in 0..self.links.len() {
            let peer = self.links[place].0;
            self.stir(peer);
        }
    }

    /// Runs `work` on every link upkeep walks; a link found at rest after
    /// it leaves them. Whether any `work` moved bytes.
    pub fn upkeep(
        &mut self,
        mut work: impl FnMut(&mut Link) -> Result<bool, ErrorKind>,
    ) -> Result<bool, ErrorKind> {
        let mut moved = false;
        let mut i = 0;
        while i < self.restless.len() {
            let (_, link, restless) = &mut self.links[self.restless[i] as usize];
            moved |= work(link)?;
            if link.resting() {
                *restless = false;
                self.restless.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(moved)
    }

    /// The links upkeep walks, with their peers.
    pub fn restless(&self) -> impl Iterator<Item = (usize, &Link)> {
        self.restless.iter().map(|&place| {
            let (peer, link, _) = &self.links[place as usize];
            (*peer, link)
        })
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
                self.links.push((peer, link, false));
                Ok(())
            }
        }
    }

    /// Every link, with its peer, in the order they were made.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Link)> {
        self.links.iter().map(|(p, l, _)| (*p, l))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Link> {
        self.links.iter_mut().map(|(_, l, _)| l)
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
    fn upkeep_walks_only_the_links_stirred_since_they_rested() {
        // Two streams on two paths (over loopback; the far ends kept open).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut far = Vec::new();
        let mut two_paths = |peer| {
            let addr = listener.local_addr().unwrap();
            let streams: Vec<_> = (0..2)
                .map(|_| {
                    let s = std::net::TcpStream::connect(addr).unwrap();
                    far.push(listener.accept().unwrap().0);
                    s
                })
                .collect();
            Link::tcp(TcpLink::new(peer, streams, 2).unwrap())
        };
        let mut links = Links::new(8);
        for p in [1, 4, 6] {
            assert!(links.insert(p, two_paths(p)).is_ok());
        }
        assert!(links.insert(2, link(2)).is_ok(), "one path: never walked");
        assert_eq!(links.restless().count(), 0);
        links.stir(4);
        links.stir(4);
        links.stir(2);
        assert!(links.stir(5).is_none(), "no link to rank 5");
        let walked: Vec<usize> = links.restless().map(|(p, _)| p).collect();
        assert_eq!(walked, [4], "once, and only the one stirred");
        let mut visits = 0;
        links
            .upkeep(|_| {
                visits += 1;
                Ok(false)
            })
            .unwrap();
        assert_eq!(visits, 1);
        // With nothing queued it was at rest: gone from the walk.
        assert_eq!(links.restless().count(), 0);
        links.stir_all();
        let mut walked: Vec<usize> = links.restless().map(|(p, _)| p).collect();
        walked.sort();
        assert_eq!(walked, [1, 4, 6]);
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
