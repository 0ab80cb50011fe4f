//! Links that several communicators share: a root communicator's TCP links
//! and the maker of new ones (a [`Pool`]), lent to one operation at a time
//! of the root or of any communicator split from it (the order of the
//! loans is the communicator layer's: `comm/shared_links.rs`). A borrower
//! numbers its ranks its own way; a [`View`] maps them onto the root's.
//!
//! What crosses a shared link is numbered so that any borrower can read
//! it: data frames carry their communicator's tag and that communicator's
//! own numbering (only its members read them), while abort and stall
//! notices, which a rank may read in another communicator's operation,
//! carry the root's ranks.

use crate::error::ErrorKind;
use crate::transport::{AbortNotice, LinkCounters, StallNotice};
use std::sync::{Arc, Mutex};

/// A root communicator's TCP links and how more are made, in the root's
/// numbering.
pub struct Pool {
    pub(super) links: super::Links,
    /// Every link's counters: the root's list, which its dumps read.
    pub(super) counters: Arc<Mutex<Vec<Arc<LinkCounters>>>>,
}

impl Pool {
    pub fn new(links: super::Links, counters: Arc<Mutex<Vec<Arc<LinkCounters>>>>) -> Pool {
        Pool { links, counters }
    }

    /// How many links the pool holds.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Whether new links are made on first use.
    pub fn makes_links(&self) -> bool {
        self.links.maker.is_some()
    }
}

/// A borrower's ranks in its root's numbering.
pub enum View {
    /// The root itself.
    Same,
    /// A split: its rank i is the root's `to_root[i]`; `from_root` is the
    /// same map inverted, sorted by the root's rank.
    Members {
        to_root: Box<[u32]>,
        from_root: Box<[(u32, u32)]>,
    },
}

impl View {
    /// A split whose rank i is the root's rank `members[i]`.
    pub fn members(members: &[usize]) -> View {
        let to_root: Box<[u32]> = members.iter().map(|&r| r as u32).collect();
        let mut from_root: Vec<(u32, u32)> = to_root
            .iter()
            .enumerate()
            .map(|(i, &r)| (r, i as u32))
            .collect();
        from_root.sort_unstable();
        View::Members {
            to_root,
            from_root: from_root.into(),
        }
    }

    /// The root's rank of this communicator's `rank`.
    pub fn root(&self, rank: usize) -> Option<usize> {
        match self {
            View::Same => Some(rank),
            View::Members { to_root, .. } => to_root.get(rank).map(|&r| r as usize),
        }
    }

    /// This communicator's rank of the root's `rank`, if it is a member.
    pub fn own(&self, rank: usize) -> Option<usize> {
        match self {
            View::Same => Some(rank),
            View::Members { from_root, .. } => {
                let r = u32::try_from(rank).ok()?;
                let at = from_root.binary_search_by_key(&r, |e| e.0).ok()?;
                Some(from_root[at].1 as usize)
            }
        }
    }

    /// `notice` (in this communicator's numbering) as the root numbers it.
    pub(super) fn abort_to_root(&self, notice: &AbortNotice) -> AbortNotice {
        let root = |r: usize| self.root(r).unwrap_or(r);
        AbortNotice {
            origin: root(notice.origin),
            detail: notice.detail.clone(),
            mismatch: notice.mismatch.map(|(b, d, ds)| (b, root(d), ds)),
        }
    }

    pub(super) fn stall_to_root(&self, notice: &StallNotice) -> StallNotice {
        StallNotice {
            seq: notice.seq,
            comm: notice.comm,
            chain: notice
                .chain
                .iter()
                .map(|&r| self.root(r as usize).map_or(r, |q| q as u32))
                .collect(),
        }
    }

    /// A stall notice read from a shared link, if it is about an operation
    /// of the communicator tagged `comm`: its chain in this numbering, cut
    /// at the first rank that is not a member.
    pub(super) fn stall_from_root(&self, notice: StallNotice, comm: u32) -> Option<StallNotice> {
        if notice.comm != comm {
            return None;
        }
        let chain = notice
            .chain
            .iter()
            .map_while(|&r| self.own(r as usize).map(|q| q as u32))
            .collect();
        Some(StallNotice {
            seq: notice.seq,
            comm,
            chain,
        })
    }

    /// An error a shared link raised, which names the root's ranks, in
    /// this numbering: `peer` is this communicator's rank at the link's
    /// other end; a rank that is not a member is named in the text and the
    /// blame goes to `peer`, who reported it.
    pub(super) fn error_from_root(&self, e: ErrorKind, peer: usize) -> ErrorKind {
        let own = |r: usize| self.own(r).unwrap_or(peer);
        match e {
            ErrorKind::Timeout { secs, what, .. } => ErrorKind::Timeout { peer, secs, what },
            ErrorKind::PeerClosed { detail, .. } => ErrorKind::PeerClosed { peer, detail },
            ErrorKind::Garbage { detail, .. } => ErrorKind::Garbage { peer, detail },
            ErrorKind::Io { detail, .. } => ErrorKind::Io { peer, detail },
            ErrorKind::PeerDied { pid, .. } => ErrorKind::PeerDied { peer, pid },
            ErrorKind::Mismatch {
                ours,
                theirs,
                our_sig,
                their_sig,
                ..
            } => ErrorKind::Mismatch {
                peer,
                ours,
                theirs,
                our_sig,
                their_sig,
            },
            ErrorKind::Aborted { origin, detail } => match self.own(origin) {
                Some(o) => ErrorKind::Aborted { origin: o, detail },
                None => ErrorKind::Aborted {
                    origin: peer,
                    detail: format!(
                        "{detail} (rank {origin} of the communicator these links were made \
                         for, not a member of this one)"
                    ),
                },
            },
            ErrorKind::Failed { detail, culprit } => ErrorKind::Failed {
                detail,
                culprit: culprit.map(own),
            },
            ErrorKind::Setup { detail, culprit } => ErrorKind::Setup {
                detail,
                culprit: culprit.map(own),
            },
            e => e,
        }
    }
}

/// A pool on loan to one engine, for one operation.
pub(super) struct Lent {
    pub(super) pool: Box<Pool>,
    pub(super) view: Arc<View>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_maps_both_ways_and_cuts_chains_at_strangers() {
        // Split members: root ranks 7, 2, 9 are its ranks 0, 1, 2.
        let v = View::members(&[7, 2, 9]);
        assert_eq!((v.root(0), v.root(2), v.root(3)), (Some(7), Some(9), None));
        assert_eq!((v.own(2), v.own(9), v.own(3)), (Some(1), Some(2), None));
        let n = StallNotice {
            seq: 4,
            comm: 11,
            chain: vec![1, 2, 0],
        };
        let wire = v.stall_to_root(&n);
        assert_eq!(wire.chain, [2, 9, 7]);
        assert_eq!(v.stall_from_root(wire.clone(), 11), Some(n));
        assert_eq!(v.stall_from_root(wire, 12), None, "another communicator's");
        let far = StallNotice {
            seq: 4,
            comm: 11,
            chain: vec![9, 5, 7],
        };
        assert_eq!(v.stall_from_root(far, 11).unwrap().chain, [2], "cut at 5");
        let e = v.error_from_root(
            ErrorKind::Aborted {
                origin: 5,
                detail: "x".into(),
            },
            1,
        );
        match e {
            ErrorKind::Aborted { origin, detail } => {
                assert_eq!(origin, 1, "blame goes to who reported it");
                assert!(detail.contains("rank 5"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        let e = v.error_from_root(
            ErrorKind::Aborted {
                origin: 9,
                detail: "x".into(),
            },
            0,
        );
        assert!(matches!(e, ErrorKind::Aborted { origin: 2, .. }));
    }
}
