//! Sleeping: a rank that has waited long (ranks outnumber cores) sleeps on
//! the futex **doorbell** in its own inbox after raising its `sleeping` flag
//! and re-checking its rings; whoever publishes into one of its rings, frees
//! a slot it waits for, or offers it a chunk to write, rings the doorbell
//! when the flag is up.

use super::layout::{OFF_DOORBELL, OFF_SLEEPING};
use super::sys::{futex_wait, futex_wake};
use super::{Inbox, Region, ShmLink};
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Inbox {
    /// Prepares to sleep: returns the doorbell value to wait on. The caller
    /// must re-check its rings after this and before [`Inbox::sleep`].
    pub fn prepare_sleep(&self) -> u32 {
        let bell = self.region.atomic_u32(OFF_DOORBELL).load(Ordering::Acquire);
        self.region
            .atomic_u32(OFF_SLEEPING)
            .store(1, Ordering::SeqCst);
        // The flag store must be ordered before the caller's re-check of its
        // rings (a store then a load: only a full fence orders them), pairing
        // with the fence in `ring_doorbell` between a publish and the flag
        // read: then either the waker sees the flag or we see its publish.
        std::sync::atomic::fence(Ordering::SeqCst);
        bell
    }

    /// Sleeps until the doorbell moves past `seen` or `timeout` passes;
    /// true when the timeout ended the sleep (no doorbell rang).
    pub fn sleep(&self, seen: u32, timeout: Duration) -> bool {
        let timed_out = futex_wait(self.region.atomic_u32(OFF_DOORBELL), seen, timeout);
        self.region
            .atomic_u32(OFF_SLEEPING)
            .store(0, Ordering::Relaxed);
        timed_out
    }

    /// Cancels a [`Inbox::prepare_sleep`] (something was ready after all).
    pub fn cancel_sleep(&self) {
        self.region
            .atomic_u32(OFF_SLEEPING)
            .store(0, Ordering::Relaxed);
    }
}

/// Wakes the owner of `inbox` if it sleeps; true when it did (a system
/// call). The fence orders our preceding publish before the flag read,
/// pairing with the sleeper's flag store before its re-check: one of the
/// two always sees the other.
fn ring_doorbell(inbox: &Region) -> bool {
    std::sync::atomic::fence(Ordering::SeqCst);
    let sleeping = inbox.atomic_u32(OFF_SLEEPING);
    // The waker lowers the flag, so that only one publish per sleep pays
    // for the system call: a sleeper woken but not yet run (ranks that
    // outnumber cores) would otherwise take a futex wake from every publish
    // meant for it until it ran, e.g. each of a broadcast root's calls run
    // ahead. The plain load first keeps the usual case (awake) a read of a
    // line that does not change. Lowering it early is safe: the doorbell
    // moves before the wake, and a sleeper that has not yet called
    // futex_wait sees it moved and does not sleep.
    if sleeping.load(Ordering::Relaxed) != 0 && sleeping.swap(0, Ordering::Relaxed) != 0 {
        inbox
            .atomic_u32(OFF_DOORBELL)
            .fetch_add(1, Ordering::Release);
        futex_wake(inbox.atomic_u32(OFF_DOORBELL));
        return true;
    }
    false
}

impl ShmLink {
    /// Rings the peer's doorbell after publishing something it may sleep
    /// on (counted when it slept).
    pub(super) fn wake_peer(&self) {
        if ring_doorbell(&self.peer_inbox) {
            self.stats.doorbells_rung.add(1);
        }
    }
}
