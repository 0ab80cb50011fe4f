//! What the engine records of an operation's messages: when transfers are
//! stamped with times, and when a waiting operation publishes snapshots.

use super::tuning::{SNAPSHOT_AFTER, SNAPSHOT_CHECK_ROUNDS, SNAPSHOT_EVERY};
use crate::transport::{RecvJob, SendJob};
use std::time::Instant;

/// Receives the evidence of an operation's messages for the records: each
/// transfer with its cursor and [`JobTrace`](crate::transport::JobTrace).
/// Called once when the operation ends, and while it waits long, every
/// [`SNAPSHOT_EVERY`] or so (a snapshot, so that a dump taken meanwhile
/// shows what is pending).
///
/// Cost: transfers are stamped with the time they move (one clock read per
/// progress call that moved something, ~40 ns here) only once the
/// operation has waited [`STAMP_AFTER_IDLE`] idle rounds (a few µs); what
/// moved before then is stamped with the time stamping began (an upper
/// bound, a few µs late). An operation that finishes sooner reads no clock
/// for its messages, and its transfers carry no stamps (its record's start
/// and end bound them), so the communicator keeps only its record: a small
/// collective pays no clock read and no lock for its messages.
///
/// [`STAMP_AFTER_IDLE`]: super::STAMP_AFTER_IDLE
pub trait Evidence {
    fn transfers(&self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)], at: Moment);
}

/// When [`Evidence::transfers`] is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// The operation waits (a snapshot).
    Waiting,
    /// It finished, or failed.
    Finished,
    Failed,
}

/// What [`Engine::drive`] counts for the records: idle rounds (when to
/// start stamping transfers, see [`Evidence`]) and when to publish
/// snapshots of a waiting operation's messages (the clock is read only
/// every few idle rounds).
///
/// [`Engine::drive`]: super::Engine::drive
#[derive(Default)]
pub(super) struct Recording {
    /// Idle rounds of the whole operation.
    idle_total: u32,
    /// Idle rounds since something last moved.
    idle_rounds: u32,
    idle_since: Option<Instant>,
    last: Option<Instant>,
}

impl Recording {
    /// Something moved: the next idle stretch starts over.
    pub(super) fn moved(&mut self) {
        self.idle_rounds = 0;
        self.idle_since = None;
    }

    /// Counts an idle round; returns the operation's idle rounds so far.
    pub(super) fn idle(&mut self) -> u32 {
        self.idle_rounds = self.idle_rounds.saturating_add(1);
        self.idle_total = self.idle_total.saturating_add(1);
        self.idle_total
    }

    /// Whether to publish a snapshot now.
    pub(super) fn snapshot_due(&mut self) -> bool {
        if self.idle_rounds % SNAPSHOT_CHECK_ROUNDS != 1 {
            return false;
        }
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if now.duration_since(since) < SNAPSHOT_AFTER
            || self
                .last
                .is_some_and(|t| now.duration_since(t) < SNAPSHOT_EVERY)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// Stamping begins: transfers that already moved get `now` as an upper
/// bound of their first and last progress.
pub(super) fn stamp_moved(
    sends: &mut [(usize, SendJob)],
    recvs: &mut [(usize, RecvJob)],
    now: Instant,
) {
    let sent = sends
        .iter_mut()
        .filter(|(_, j)| j.done || j.moved() > 0)
        .map(|(_, j)| &mut j.trace);
    let received = recvs
        .iter_mut()
        .filter(|(_, j)| j.done || j.moved() > 0)
        .map(|(_, j)| &mut j.trace);
    for t in sent.chain(received) {
        if t.first.is_none() {
            t.stamp(now);
        }
    }
}
