//! What the communicator hands the engine about the caller of one operation,
//! and how another thread asks a running operation to give up.

use super::Evidence;
use crate::error::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What the communicator tells the engine about the caller of one
/// operation: passed to [`Engine::run`] / [`Engine::drive`], never stored.
///
/// [`Engine::run`]: super::Engine::run
/// [`Engine::drive`]: super::Engine::drive
#[derive(Clone, Copy, Default)]
pub struct OpCtx<'a> {
    /// Asked every [`INTERRUPT_EVERY`] during long waits, for a caller that
    /// can be interrupted (see `Comm::run_interruptible`).
    ///
    /// [`INTERRUPT_EVERY`]: super::INTERRUPT_EVERY
    pub interrupt: Option<&'a InterruptCheck>,
    /// When the operation runs on the progress thread: how many threads
    /// block waiting for that thread. While none does, the caller is busy
    /// (computing the next gradients, say) and a spinning wait would steal
    /// its core, so the wait takes the patient policy and soon sleeps; the
    /// doorbell or poll(2) still wakes it the moment data arrives.
    pub watchers: Option<&'a AtomicUsize>,
    /// Where the operation's messages are recorded (see [`Evidence`]).
    pub evidence: Option<&'a dyn Evidence>,
    /// When the operation started, as its record says: its first phase's
    /// clock starts there (a clock read less per call; None: read it).
    pub started: Option<Instant>,
}

impl OpCtx<'_> {
    /// Whether the operation runs on the progress thread with no thread
    /// waiting for it (see `watchers`).
    pub(super) fn unwatched(&self) -> bool {
        self.watchers
            .is_some_and(|w| w.load(Ordering::Relaxed) == 0)
    }
}

/// Asked while an operation waits: should it give up?
pub type InterruptCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// A request, from another thread, that the running operation give up at
/// its next wait (and every later one fail at once): Ctrl-C while a queued
/// operation waits, or `Comm::abort`. The first reason given wins.
#[derive(Default)]
pub struct Cancel {
    set: AtomicBool,
    why: Mutex<Option<ErrorKind>>,
}

impl Cancel {
    pub fn set(&self, why: ErrorKind) {
        let mut w = self.why.lock().unwrap();
        if w.is_none() {
            *w = Some(why);
        }
        self.set.store(true, Ordering::Release);
    }

    /// Why the operation must give up, if it must (one atomic load when not).
    pub fn reason(&self) -> Option<ErrorKind> {
        if !self.set.load(Ordering::Acquire) {
            return None;
        }
        self.why.lock().unwrap().clone()
    }
}
