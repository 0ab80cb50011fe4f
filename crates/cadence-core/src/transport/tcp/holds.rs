//! Streams held down from outside their links: the cluster's path planner
//! (`fabric::planner`) says an uplink that a stream crosses is cut, and
//! the stream's path stops carrying chunks at once, instead of after
//! `CADENCE_PATH_TIMEOUT` (or never, where the fabric rehashed the stream
//! onto a spine its other streams already load). One table per rank,
//! written by the planner's reader and read by each link when it next
//! carries something or is checked: a link pays a lock only when the
//! table changed since it last looked.

use super::multipath::Sending;
use super::TcpLink;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Why a stream is held.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    pub why: String,
    /// For the planner's layout (the stream stands by while its link runs
    /// on other spines), not because an uplink failed: not logged as a
    /// path down, nor counted as one.
    pub quiet: bool,
}

/// The streams held down, per (peer, stream), with why.
#[derive(Default)]
pub struct PathHolds {
    changes: AtomicU64,
    held: Mutex<HashMap<(usize, usize), Hold>>,
}

impl PathHolds {
    /// Holds stream `stream` of the link to `peer` down, or (with `None`)
    /// releases it.
    pub fn set(&self, peer: usize, stream: usize, hold: Option<Hold>) {
        let mut held = self.held.lock().unwrap();
        match hold {
            Some(h) => held.insert((peer, stream), h),
            None => held.remove(&(peer, stream)),
        };
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// Releases every stream (the planner is gone: the links' own failover
    /// decides again).
    pub fn release_all(&self) {
        self.held.lock().unwrap().clear();
        self.changes.fetch_add(1, Ordering::Release);
    }

    fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Per stream of the link to `peer` (`streams` of them): why it is
    /// held, if it is.
    fn of_link(&self, peer: usize, streams: usize) -> Vec<Option<Hold>> {
        let held = self.held.lock().unwrap();
        (0..streams)
            .map(|s| held.get(&(peer, s)).cloned())
            .collect()
    }
}

/// What a link knows of the table: the table, and the changes seen.
pub(super) struct Following {
    holds: Arc<PathHolds>,
    seen: u64,
}

impl TcpLink {
    /// Follows `holds` (each stream is then a path of its own: see
    /// `comm::links::tcp_link`).
    pub fn follow_holds(&mut self, holds: Arc<PathHolds>) {
        self.holds = Some(Following { holds, seen: 0 });
        self.apply_holds();
    }

    /// Holds and releases this link's paths as the table now says, if it
    /// changed since the link last looked.
    pub(super) fn apply_holds(&mut self) {
        let Some(f) = &mut self.holds else { return };
        let now_at = f.holds.changes();
        if now_at == f.seen || !self.multipath.on() {
            return;
        }
        f.seen = now_at;
        let want = f.holds.of_link(self.peer, self.streams.len());
        let now = Instant::now();
        let mut refused = Vec::new();
        // Releases first: a path released comes back at once when it owes
        // nothing, so that holding others in the same change finds it up
        // (a link moving from its standby streams to its home's).
        for (s, hold) in want.iter().enumerate() {
            let p = self.multipath.path_of(s);
            if hold.is_none() && self.multipath.held(p) {
                let quiet = self.multipath.held_quietly(p);
                self.multipath.release(p, now);
                if !quiet {
                    self.log(format!(
                        "path {} to rank {} is released by the path planner; it carries \
                         chunks again once it delivers what it holds",
                        self.multipath.name(p),
                        self.peer
                    ));
                }
            }
        }
        for (s, hold) in want.into_iter().enumerate() {
            let p = self.multipath.path_of(s);
            if let Some(h) = hold {
                if !self.multipath.held(p) {
                    self.sample_rates_at(now);
                    let sending = Sending {
                        tx: &self.tx,
                        next_msg: self.tx_msg,
                        ctl_started: self.tx_ctl_done > 0,
                    };
                    if !self.multipath.hold(p, &h.why, h.quiet, now, &sending) {
                        refused.push((p, h.why));
                    }
                }
            }
        }
        self.report_path_events();
        for (p, why) in refused {
            self.log(format!(
                "path {} to rank {} stays in use ({why}): no other path to it works",
                self.multipath.name(p),
                self.peer
            ));
        }
    }
}
