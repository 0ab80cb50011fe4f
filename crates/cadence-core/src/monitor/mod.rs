//! Always-on operation records and the flight recorder.
//!
//! Every operation gets one [`OpRecord`] (a few words, written at enqueue,
//! start and end); the last `capacity` records stay in a ring buffer that can
//! be dumped as JSON on demand, on error and on timeout. Cost on the hot path:
//! one uncontended mutex and a few stores per operation.

use serde::Serialize;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug, Serialize)]
pub struct OpRecord {
    pub seq: u64,
    pub collective: &'static str,
    pub algo: &'static str,
    pub dtype: &'static str,
    pub redop: &'static str,
    pub root: usize,
    pub count: u64,
    pub bytes: u64,
    /// Nanoseconds since the communicator was created.
    pub enqueue_ns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// "running", "ok" or the error text (static strings on the hot path:
    /// no allocation per operation).
    pub status: Cow<'static, str>,
}

pub struct Recorder {
    pub base: Instant,
    /// Wall-clock time of `base`, for lining up dumps of different ranks.
    pub base_unix_ns: u128,
    ops: VecDeque<OpRecord>,
    capacity: usize,
    pub total_ops: u64,
}

impl Recorder {
    pub fn new(capacity: usize) -> Recorder {
        Recorder {
            base: Instant::now(),
            base_unix_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
            ops: VecDeque::with_capacity(capacity.min(4096)),
            capacity: capacity.max(1),
            total_ops: 0,
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Adds a record; returns its sequence number for later updates.
    pub fn push(&mut self, rec: OpRecord) {
        if self.ops.len() == self.capacity {
            self.ops.pop_front();
        }
        self.total_ops += 1;
        self.ops.push_back(rec);
    }

    /// The record of operation `seq`, if still in the buffer.
    pub fn get_mut(&mut self, seq: u64) -> Option<&mut OpRecord> {
        // Records are pushed in sequence order, so the wanted one is found
        // from the back in O(1) in the common case.
        self.ops.iter_mut().rev().find(|r| r.seq == seq)
    }

    pub fn records(&self) -> impl Iterator<Item = &OpRecord> {
        self.ops.iter()
    }
}
