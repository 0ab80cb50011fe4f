//! A sub-communicator made from its parent's, without the store: the
//! members' records come from the parent's peer table (each member's new
//! listening ports from an allgather over the parent, which the split
//! makes anyway), links are made on first use, and what the parent
//! measured at start-up is inherited: clock offsets (rebased on the new
//! rank 0), the start-up profile (the ring order over the members' hosts)
//! and the cost model. Nothing is measured again. Unless
//! `CADENCE_SPLIT_LINKS=own`, the split uses its root's TCP links
//! (`shared_links.rs`): it connects to no member its root links to
//! already, and listens for nothing.

use super::shared_links::{Share, SharedLinks};
use super::{Bootstrap, ClockOffset, Comm};
use crate::engine::View;
use crate::error::{CommError, Result};
use std::sync::Arc;

/// What a child takes from its parent at the end of set-up.
pub(super) struct Inherited {
    pub clock: ClockOffset,
    pub profile: Option<Arc<crate::fabric::file::TopoFile>>,
    pub model: Option<crate::schedule::cost::CostModel>,
    pub measured_at_start: bool,
    /// The root's TCP links, when the split shares them.
    pub share: Option<Share>,
}

impl Bootstrap {
    /// The ports this rank listens on, one per NIC (what a split's members
    /// tell each other over the parent).
    pub fn ports(&self) -> Vec<u16> {
        self.info
            .nic_addrs()
            .iter()
            .filter_map(|a| a.rsplit_once(':')?.1.parse().ok())
            .collect()
    }

    /// Sets up the split of `parent` whose members are the parent's ranks
    /// `members` (in the new rank order; this rank is one), listening on
    /// `ports[i]`; `clocks[i]` is member i's clock offset to the parent's
    /// rank 0 (offset, error in ns). Collective over the members.
    pub fn connect_split(
        self,
        parent: &Comm,
        members: &[usize],
        ports: &[Vec<u16>],
        clocks: &[(i64, u64)],
    ) -> Result<Comm> {
        let n = members.len();
        if n != self.nranks || ports.len() != n || clocks.len() != n {
            return Err(CommError::invalid(format!(
                "a split of {} ranks given {n} members, {} port lists and {} clocks",
                self.nranks,
                ports.len(),
                clocks.len()
            )));
        }
        if members[self.rank] != parent.rank() {
            return Err(CommError::invalid(format!(
                "member {} of the split is parent rank {}, not this rank ({})",
                self.rank,
                members[self.rank],
                parent.rank()
            )));
        }
        let table = &parent.shared.peers;
        let infos = table.subset(members, ports).map_err(CommError::invalid)?;
        // Offsets to the new rank 0's clock: ours minus its, errors added.
        let (mine, zero) = (clocks[self.rank], clocks[0]);
        let same_host = table.same_host(members[0], members[self.rank]);
        let clock = if same_host {
            ClockOffset::SAME_HOST
        } else {
            ClockOffset {
                offset_ns: mine.0.wrapping_sub(zero.0),
                error_ns: mine.1 + zero.1,
                method: "ping-pong",
            }
        };
        let (model, measured_at_start) = (
            parent.shared.auto.model,
            parent.shared.auto.measured_at_start,
        );
        let share = self
            .cfg
            .share_split_links
            .then(|| parent.share_links(members));
        let inherited = Inherited {
            clock,
            profile: parent.shared.profile.clone(),
            model,
            measured_at_start,
            share,
        };
        self.connect_inheriting(infos, Some(inherited))
    }
}

impl Comm {
    /// The sharing of this communicator's root's links by its split whose
    /// members are this communicator's ranks `members`. The first split of
    /// a root takes the root's TCP links out of its engine to share them.
    fn share_links(&self, members: &[usize]) -> Share {
        let mine = self.shared.share.get_or_init(|| {
            let mut inner = self.shared.inner.lock().unwrap();
            let counters = inner.engine.link_counters();
            let pool = inner.engine.take_pool();
            Share {
                links: Arc::new(SharedLinks::new(pool, counters)),
                view: Arc::new(View::Same),
            }
        });
        let in_root: Vec<usize> = members
            .iter()
            .map(|&m| mine.view.root(m).expect("a member is a rank of the parent"))
            .collect();
        Share {
            links: mine.links.clone(),
            view: Arc::new(View::members(&in_root)),
        }
    }

    /// The end of a split's set-up: what the parent measured, for the
    /// members' hosts.
    pub(super) fn inherit(&mut self, from: Inherited) -> Result<()> {
        let ordered = from.profile.as_ref().map(|file| {
            let peers = &self.shared.peers;
            super::order::choose_by(
                peers.topology(),
                &|r| peers.host(r),
                file,
                "the parent's start-up profile",
            )
        });
        let shared = self.exclusive("inheriting the parent's measurements")?;
        shared.clock = from.clock;
        if let Some((topo, choice, fabric)) = ordered {
            shared.auto.topo = topo;
            shared.auto.order = choice;
            shared.auto.fabric = fabric.map(Arc::new);
            shared.profile = from.profile;
        }
        if shared.auto.model.is_none() {
            shared.auto.model = from.model;
            shared.auto.measured_at_start = from.measured_at_start;
        }
        Ok(())
    }
}
