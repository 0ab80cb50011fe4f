//! The communicator's shared state, and the part of it one operation at a
//! time holds.

use super::p2p::P2pSeqs;
use super::shared_links::{Share, Ticket};
use super::ClockOffset;
use crate::choice;
use crate::config::Config;
use crate::engine::{Cancel, Engine};
use crate::error::{CommError, ErrorKind};
use crate::monitor::Recorder;
use crate::schedule::{Algo, CollArgs, Schedule};
use crate::transport::LinkCounters;
use crate::types::CollKind;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

/// What one operation at a time may use: the engine (links, buffers),
/// the numbering the peers expect, and the schedules built so far.
pub(super) struct Inner {
    pub(super) engine: Engine,
    /// The last collective's sequence number (what the wire and the records
    /// match across ranks; sends and receives do not count).
    pub(super) coll_seq: u64,
    /// Operations of every kind so far (the records' `id`).
    pub(super) op_seq: u64,
    pub(super) p2p: P2pSeqs,
    pub(super) failed: Option<CommError>,
    /// Built schedules by (arguments, algorithm); looked up by reference so a
    /// repeated call allocates nothing.
    pub(super) schedules: HashMap<CollArgs, Vec<(Algo, Arc<Schedule>)>>,
    pub(super) last_schedule: Option<(CollArgs, Algo, Arc<Schedule>)>,
}

impl Inner {
    /// Drops every built schedule (the ring order changed under them).
    pub(super) fn forget_schedules(&mut self) {
        self.schedules.clear();
        self.last_schedule = None;
    }
}

/// The communicator's state, shared with its progress and path-keeper
/// threads.
pub(super) struct Shared {
    pub(super) id: String,
    /// The job this communicator belongs to (its sub-communicators share
    /// it), for dumps: `cadence doctor` refuses to mix jobs.
    pub(super) job: String,
    pub(super) rank: usize,
    pub(super) nranks: usize,
    /// Every rank's record from bootstrap (host, process id, addresses),
    /// which a split hands its children.
    pub(super) peers: Arc<super::PeerTable>,
    /// The start-up profile's measurements, when one ran or was cached: a
    /// split orders its rings by them instead of measuring again.
    pub(super) profile: Option<Arc<crate::fabric::file::TopoFile>>,
    /// This rank's wall clock against rank 0's (`clock.rs`).
    pub(super) clock: ClockOffset,
    pub(super) cfg: Config,
    pub(super) inner: Mutex<Inner>,
    pub(super) recorder: Mutex<Recorder>,
    /// Every link's counters (shared with the engine's links), readable
    /// while an operation runs.
    pub(super) links: Arc<Mutex<Vec<Arc<LinkCounters>>>>,
    /// Submitted asynchronous operations not yet finished.
    pub(super) pending: AtomicUsize,
    /// Threads blocked until the progress thread finishes something.
    pub(super) watchers: Arc<AtomicUsize>,
    /// Set when a caller gave up on a queued operation or aborted the
    /// communicator: the engine fails the operation at its next wait, and
    /// the communicator with it.
    pub(super) cancel: Arc<Cancel>,
    /// Which ranks share a host (from their host names), and how to choose
    /// algorithms on it.
    pub(super) auto: choice::Auto,
    /// Choices made so far, by (call, element size, the caller's algorithm):
    /// the cost model builds every rank's schedule to compare algorithms.
    pub(super) chosen: Mutex<HashMap<CollArgs, Vec<(ChoiceKey, Choice)>>>,
    /// Algorithm choices already announced (`CADENCE_DEBUG=INFO`).
    pub(super) choices: choice::ChoiceLog,
    /// The root's TCP links, when this communicator shares them with its
    /// splits (or is one): set by the first split that shares them.
    pub(super) share: OnceLock<Share>,
}

/// Besides the call: its element size and the algorithm the caller asked for.
pub(super) type ChoiceKey = (usize, Option<Algo>);
/// The algorithm chosen, and why.
pub(super) type Choice = (Algo, choice::Why);

impl Shared {
    /// The next operation's place in this rank's order, when the links are
    /// shared.
    pub(super) fn ticket(&self) -> Option<Ticket> {
        self.share.get().map(Share::ticket)
    }

    /// An error of this rank and communicator (`op`: the operation's kind
    /// and sequence number, once it has one).
    pub(super) fn err(&self, kind: ErrorKind, op: Option<(CollKind, u64)>) -> CommError {
        CommError {
            kind,
            rank: Some(self.rank),
            op,
            comm_id: self.id.as_str().into(),
        }
    }
}
