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
//!
//! A communicator that shares its root's TCP links (`pool.rs`) holds its
//! own (shared memory) here and, while an operation runs, the root's
//! pool on loan: a peer is looked up in its own links first, then in the
//! pool under the root's number for it.

use super::pool::{Lent, Pool, View};
use super::{LinkMaker, LinkUse};
use crate::error::ErrorKind;
use crate::transport::{AbortNotice, Link, LinkCounters, StallNotice};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub struct Links {
    nranks: usize,
    /// (peer, place in `links`), sorted by peer.
    index: Vec<(u32, u32)>,
    /// Each link, with its peer and whether it is in `restless`.
    links: Vec<(usize, Link, bool)>,
    /// Places of the links with background work possibly due.
    restless: Vec<u32>,
    /// Whether some link has several paths.
    multipath: bool,
    /// Makes links on first use (`CADENCE_CONNECT=lazy`), else None: every
    /// link exists from the start (or comes with a lent pool).
    pub(super) maker: Option<Box<dyn LinkMaker>>,
    /// The root's pool, while an operation of a communicator that shares
    /// it runs.
    lent: Option<Lent>,
}

impl Links {
    /// No link yet, to any of `nranks` ranks.
    pub fn new(nranks: usize) -> Links {
        Links {
            nranks,
            index: Vec::new(),
            links: Vec::new(),
            restless: Vec::new(),
            multipath: false,
            maker: None,
            lent: None,
        }
    }

    /// Links are made on first use by `maker`.
    pub fn set_maker(&mut self, maker: Box<dyn LinkMaker>) {
        self.maker = Some(maker);
    }

    fn place(&self, peer: usize) -> Result<usize, usize> {
        let peer = u32::try_from(peer).unwrap_or(u32::MAX);
        self.index.binary_search_by_key(&peer, |e| e.0)
    }

    /// The lent pool and the root's number of `peer`, when `peer` has no
    /// link of this communicator's own.
    fn in_pool(&self, peer: usize) -> Option<(&Lent, usize)> {
        let lent = self.lent.as_ref()?;
        Some((lent, lent.view.root(peer)?))
    }

    /// The link to `peer`, if there is one.
    pub fn get(&self, peer: usize) -> Option<&Link> {
        match self.place(peer) {
            Ok(at) => Some(&self.links[self.index[at].1 as usize].1),
            Err(_) => {
                let (lent, root) = self.in_pool(peer)?;
                lent.pool.links.get(root)
            }
        }
    }

    pub fn get_mut(&mut self, peer: usize) -> Option<&mut Link> {
        match self.place(peer) {
            Ok(at) => Some(&mut self.links[self.index[at].1 as usize].1),
            Err(_) => {
                let root = self.in_pool(peer)?.1;
                self.lent.as_mut()?.pool.links.get_mut(root)
            }
        }
    }

    /// Whether `peer`'s link is the pool's (its errors name the root's
    /// ranks).
    fn pooled(&self, peer: usize) -> bool {
        self.place(peer).is_err() && self.lent.is_some()
    }

    /// `e`, raised by the link to `peer`, in this communicator's numbering.
    pub fn own_error(&self, peer: usize, e: ErrorKind) -> ErrorKind {
        match &self.lent {
            Some(lent) if self.pooled(peer) => lent.view.error_from_root(e, peer),
            _ => e,
        }
    }

    /// The link to `peer`, about to carry something: a link with several
    /// paths joins the ones upkeep walks (told first, so that its rest does
    /// not count as a stall).
    pub fn stir(&mut self, peer: usize) -> Option<&mut Link> {
        let Ok(at) = self.place(peer) else {
            let root = self.in_pool(peer)?.1;
            return self.lent.as_mut()?.pool.links.stir(root);
        };
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
        if let Some(lent) = self.lent.as_mut() {
            lent.pool.links.stir_all();
        }
    }

    /// Runs `work` on every link upkeep walks; a link found at rest after
    /// it leaves them. Whether any `work` moved bytes.
    pub fn upkeep(
        &mut self,
        mut work: impl FnMut(&mut Link) -> Result<bool, ErrorKind>,
    ) -> Result<bool, ErrorKind> {
        let mut moved = self.own_upkeep(&mut work)?;
        if let Some(lent) = self.lent.as_mut() {
            // A pool link's error names the root's ranks: the culprit is
            // whichever rank it names, member or not.
            moved |= lent.pool.links.own_upkeep(&mut work).map_err(|e| {
                match e.culprit().and_then(|r| lent.view.own(r)) {
                    Some(p) => lent.view.error_from_root(e, p),
                    None => e,
                }
            })?;
        }
        Ok(moved)
    }

    fn own_upkeep(
        &mut self,
        work: &mut dyn FnMut(&mut Link) -> Result<bool, ErrorKind>,
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

    /// The links upkeep walks, with their peers (None: a pool link to a
    /// rank that is not a member).
    pub fn restless(&self) -> impl Iterator<Item = (Option<usize>, &Link)> {
        let own = self.own_restless().map(|(p, l)| (Some(p), l));
        let pooled = self.lent.iter().flat_map(|lent| {
            lent.pool
                .links
                .own_restless()
                .map(|(root, l)| (lent.view.own(root), l))
        });
        own.chain(pooled)
    }

    fn own_restless(&self) -> impl Iterator<Item = (usize, &Link)> {
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
                self.multipath |= link.multipath();
                self.links.push((peer, link, false));
                Ok(())
            }
        }
    }

    /// Every link of this communicator's own, with its peer, in the order
    /// they were made.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Link)> {
        self.links.iter().map(|(p, l, _)| (*p, l))
    }

    /// How many links there are (a lent pool's included).
    pub fn len(&self) -> usize {
        self.links.len() + self.lent.as_ref().map_or(0, |l| l.pool.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether some link has several paths (a lent pool's included).
    pub fn multipath(&self) -> bool {
        self.multipath || self.lent.as_ref().is_some_and(|l| l.pool.links.multipath)
    }

    /// Tells every peer this rank failed: on a lent pool, every rank it
    /// links to (a failure fails every communicator sharing the pool).
    pub fn send_abort(&mut self, notice: &AbortNotice) {
        for (_, l, _) in &mut self.links {
            l.send_abort(notice);
        }
        if let Some(lent) = self.lent.as_mut() {
            let wire = lent.view.abort_to_root(notice);
            lent.pool.links.send_abort(&wire);
        }
    }

    /// Posts this rank's stall notice on every link.
    pub fn post_stall(&mut self, notice: &StallNotice) {
        for (_, l, _) in &mut self.links {
            l.post_stall(notice);
        }
        if let Some(lent) = self.lent.as_mut() {
            let wire = lent.view.stall_to_root(notice);
            lent.pool.links.post_stall(&wire);
        }
    }

    /// Writes what the links' control streams still hold.
    pub fn flush_control(&mut self) {
        for (_, l, _) in &mut self.links {
            l.flush_control();
        }
        if let Some(lent) = self.lent.as_mut() {
            lent.pool.links.flush_control();
        }
    }

    /// The last stall notice `peer` sent about an operation of the
    /// communicator tagged `comm`.
    pub fn read_stall(&self, peer: usize, comm: u32) -> Option<StallNotice> {
        let notice = self.get(peer)?.read_stall()?;
        match &self.lent {
            Some(lent) if self.pooled(peer) => lent.view.stall_from_root(notice, comm),
            _ => Some(notice),
        }
    }

    // Making links: the lent pool's maker while there is one, else this
    // communicator's own.

    fn active_maker(&self) -> Option<&dyn LinkMaker> {
        match &self.lent {
            Some(lent) => lent.pool.links.maker.as_deref(),
            None => self.maker.as_deref(),
        }
    }

    /// Whether links are made on first use here.
    pub fn makes_links(&self) -> bool {
        self.active_maker().is_some()
    }

    /// Asks for a link to `peer` (see [`LinkMaker::request`]).
    pub fn request(&mut self, peer: usize, used: LinkUse) {
        match self.lent.as_mut() {
            Some(lent) => {
                if let (Some(root), Some(m)) =
                    (lent.view.root(peer), lent.pool.links.maker.as_mut())
                {
                    m.request(root, used);
                }
            }
            None => {
                if let Some(m) = self.maker.as_mut() {
                    m.request(peer, used);
                }
            }
        }
    }

    /// What an idle engine polls to learn that a link came up: the
    /// maker's bell, and the streams of links on their way.
    pub fn maker_fds(&self, out: &mut Vec<libc::pollfd>) {
        if let Some(m) = self.active_maker() {
            out.push(libc::pollfd {
                fd: m.wake_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            m.flight_fds(out);
        }
    }

    /// Moves the links on their way and installs those that came up
    /// (their counters join `counters`, or the pool's list). A link that
    /// could not be made fails the operation, named in this
    /// communicator's numbering.
    pub fn install_ready(
        &mut self,
        counters: &Mutex<Vec<Arc<LinkCounters>>>,
    ) -> Result<(), ErrorKind> {
        if let Some(lent) = self.lent.as_mut() {
            let view = lent.view.clone();
            return lent
                .pool
                .links
                .install_ready(&lent.pool.counters)
                .map_err(|e| {
                    let peer = e.culprit().and_then(|r| view.own(r));
                    match peer {
                        Some(p) => view.error_from_root(e, p),
                        None => e,
                    }
                });
        }
        let Some(maker) = self.maker.as_mut() else {
            return Ok(());
        };
        if maker.in_flight() {
            maker.advance();
        }
        if !maker.has_ready() {
            return Ok(());
        }
        for (peer, made) in maker.take_ready() {
            let link = made?;
            let stats = link.stats().clone();
            if self.insert(peer, link).is_err() {
                return Err(ErrorKind::Internal(format!("a second link to rank {peer}")));
            }
            counters.lock().unwrap().push(stats);
        }
        Ok(())
    }

    /// The TCP links and their maker, taken out to be shared (`pool.rs`);
    /// shared-memory links stay.
    pub fn take_pool(&mut self, counters: Arc<Mutex<Vec<Arc<LinkCounters>>>>) -> Pool {
        let mut pool = Links::new(self.nranks);
        pool.maker = self.maker.take();
        let mine = std::mem::take(&mut self.links);
        self.index.clear();
        self.restless.clear();
        self.multipath = false;
        for (peer, link, _) in mine {
            let to = if link.is_tcp() { &mut pool } else { &mut *self };
            if to.insert(peer, link).is_err() {
                unreachable!("one link per peer");
            }
        }
        Pool::new(pool, counters)
    }

    /// Lends `pool` to this communicator for one operation.
    pub fn lend(&mut self, pool: Box<Pool>, view: Arc<View>) {
        debug_assert!(self.lent.is_none());
        self.lent = Some(Lent { pool, view });
    }

    /// The pool lent, back.
    pub fn take_lent(&mut self) -> Option<Box<Pool>> {
        self.lent.take().map(|l| l.pool)
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
        let walked: Vec<usize> = links.restless().filter_map(|(p, _)| p).collect();
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
        let mut walked: Vec<usize> = links.restless().filter_map(|(p, _)| p).collect();
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
    }
}
