//! Waiting when a round moved nothing. A wait spins for a few tens of
//! microseconds (a peer on another core answers in well under that; no
//! spinning at all when ranks outnumber cores), then yields the CPU, then
//! sleeps: in poll(2) on sockets, on the shared-memory doorbell, or in short
//! turns of each, as the links say ([`crate::transport::WaitOn`]). Pure
//! spinning would starve the very rank we wait for when ranks outnumber
//! cores.
//!
//! The spin budget adapts to what the yields of past waits showed. Two
//! ranks the scheduler put on one core cannot spin at each other: each wait
//! would burn the whole budget before its yield let the awaited rank run.
//! So a wait that ended after a yield *handed the core over* for a moment
//! (a peer ran on our core and answered) drops the budget to nothing; a
//! wait that ends within the full budget without handing the core over
//! doubles it back, as a peer on a core of its own answers within it.

use super::tuning::{
    LIVENESS_EVERY, NAP, NAP_MAX, NAP_MIXED, NAP_NO_INBOX, NAP_RANKS_PER_CORE, ROOTED_SMALL, SPIN,
    SPIN_OVERSUBSCRIBED, SPIN_REGROW, STREAM_RANKS_PER_CORE, YIELD, YIELD_LOST_MIN,
    YIELD_OVERSUBSCRIBED, YIELD_ROOTED_OVERSUBSCRIBED,
};
use super::{Engine, Marks, Moving, OpCtx, INTERRUPT_EVERY};
use crate::error::ErrorKind;
use crate::transport::{poll_fds, RecvJob, SendJob, WaitOn};
use crate::types::CollKind;
use std::time::{Duration, Instant};

/// How this engine's waits went, for `dump_records()` ("waits"): a missed
/// wake-up shows as a `late_wakeup`, a stall as a long `longest_idle_us`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct WaitStats {
    /// Sleeps on the shared-memory doorbell.
    pub naps: u64,
    /// Naps that ended by their timeout, not by a doorbell.
    pub nap_timeouts: u64,
    /// Naps that ended by their timeout although what they waited on was
    /// ready: a publish whose doorbell never rang (a missed wake-up), or a
    /// publisher descheduled between its publish and its doorbell.
    pub late_wakeups: u64,
    /// The longest stretch in which nothing moved (µs), over all operations.
    pub longest_idle_us: u64,
    /// Waits that ended after a yield handed this rank's core to another
    /// task for a moment: a peer that shares the core (see
    /// [`yield_core`]). Each cut the spin budget to nothing.
    pub shared_core_waits: u64,
}

/// How long a wait has lasted, for the backoff policy and the timeout text.
pub struct Wait {
    pub(super) t0: Instant,
    pub(super) idle_since: Option<Instant>,
    last_liveness: Instant,
    /// When the deadline passed; the grace period for diagnosis runs from here.
    pub(super) stalled_at: Option<Instant>,
    /// The wait-for chain this rank last published, and to how many links.
    pub(super) published: Vec<u32>,
    pub(super) published_to: usize,
    last_interrupt_check: Instant,
    /// In this idle stretch, a yield handed the core to another task for a
    /// moment, or lost it for a slice (see [`yield_core`]).
    handed: bool,
    lost: bool,
    /// In this idle stretch, whether every transfer that could move waits
    /// for its link to be made, and the number of links when that was
    /// asked (asked again once a link came up).
    links_only: Option<(bool, usize)>,
}

impl Wait {
    /// A wait that began at `now` (a time the caller has just read: small
    /// calls read the clock as few times as they can).
    pub fn since(now: Instant) -> Wait {
        Wait {
            t0: now,
            idle_since: None,
            last_liveness: now,
            stalled_at: None,
            published: Vec::new(),
            published_to: 0,
            last_interrupt_check: now,
            handed: false,
            lost: false,
            links_only: None,
        }
    }
    /// Something moved: the next idle stretch starts spinning again.
    pub fn reset(&mut self) {
        self.idle_since = None;
        self.handed = false;
        self.lost = false;
        self.links_only = None;
    }
}

impl Engine {
    /// Fixed spin and yield budgets instead of the policy of
    /// [`Engine::set_local_ranks`] (each `None`: the policy's).
    pub fn override_wait(&mut self, spin: Option<Duration>, yield_for: Option<Duration>) {
        self.wait_override = (spin, yield_for);
        self.spin = spin.unwrap_or(self.spin);
        self.yield_for = yield_for.unwrap_or(self.yield_for);
        self.yield_rooted = yield_for.unwrap_or(self.yield_rooted);
        self.spin_budget = self.spin;
    }

    /// Tells the engine how many ranks share this machine's cores (emulated
    /// hosts included), to pick its waiting policy: spin when each has a
    /// core, hand the core over when they do not; and whether streaming can
    /// count on a sender and its receiver running at once
    /// ([`super::prefers_stream`]).
    pub fn set_local_ranks(&mut self, local: usize) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.may_stream = local <= STREAM_RANKS_PER_CORE * cores;
        let (spin, yield_for, yield_rooted) = if local > cores {
            (
                SPIN_OVERSUBSCRIBED,
                YIELD_OVERSUBSCRIBED,
                YIELD_ROOTED_OVERSUBSCRIBED,
            )
        } else {
            (SPIN, YIELD, YIELD)
        };
        self.spin = self.wait_override.0.unwrap_or(spin);
        self.yield_for = self.wait_override.1.unwrap_or(yield_for);
        self.yield_rooted = self.wait_override.1.unwrap_or(yield_rooted);
        self.spin_budget = self.spin;
        (self.nap, self.nap_mixed) = naps_for(local, cores);
        self.liveness_every = (LIVENESS_EVERY * crowd(local, cores)).min(NAP_MAX);
    }

    /// How long a wait of a `coll` call of `bytes` yields before it sleeps
    /// (see `YIELD_ROOTED_OVERSUBSCRIBED`).
    pub(super) fn yield_budget(&self, coll: CollKind, bytes: u64) -> Duration {
        let rooted = matches!(
            coll,
            CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
        );
        if rooted && bytes < ROOTED_SMALL {
            self.yield_rooted
        } else {
            self.yield_for
        }
    }

    /// The spin budget after an idle stretch of `idle` ended (see the
    /// module doc). Costs nothing on the fast path: called only when a
    /// round found nothing to move before this one.
    pub(super) fn adapt_spin(&mut self, idle: Duration, wait: &Wait) {
        if self.wait_override.0.is_some() || wait.lost {
            return;
        }
        if wait.handed {
            self.spin_budget = Duration::ZERO;
            self.wait_stats.shared_core_waits += 1;
        } else if idle <= self.spin {
            self.spin_budget = (self.spin_budget * 2).max(SPIN_REGROW).min(self.spin);
        }
    }

    /// Called when a round moved nothing: checks what can end the wait (an
    /// abort notice, the deadline, a dead peer), then spins, yields or sleeps
    /// depending on how long the wait has lasted.
    pub(super) fn backoff(
        &mut self,
        wait: &mut Wait,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
        moving: &Moving,
        ctx: OpCtx,
    ) -> Result<(), ErrorKind> {
        let (deadline, my_sig, my_seq) = (moving.deadline, moving.sig, moving.seq);
        let now = Instant::now();
        let since = *wait.idle_since.get_or_insert(now);
        if let Some(inbox) = &self.inbox {
            if inbox.aborted() {
                if let Some(notice) = inbox.abort_notice() {
                    return Err(notice.into_error(my_sig));
                }
            }
        }
        if now > deadline {
            self.past_deadline(wait, sends, recvs, my_seq, now)?;
        }
        if now.duration_since(wait.last_liveness) > self.liveness_every {
            wait.last_liveness = now;
            self.check_peers_alive(sends, recvs)?;
        }
        let waited = now.duration_since(since);
        // A wait for links being made, and for nothing else, sleeps at
        // once (in poll(2) on the links' streams and the maker's bell): the
        // listeners' threads answering the handshakes need the cores a spin
        // would take, and nothing moves before a handshake round trip.
        let nlinks = self.links.len();
        let links_only = match wait.links_only {
            Some((only, n)) if n == nlinks => only,
            _ => {
                let only = self.waits_for_links_only(sends, recvs);
                wait.links_only = Some((only, nlinks));
                only
            }
        };
        let (spin, yield_for) = if links_only {
            (Duration::ZERO, Duration::ZERO)
        } else if ctx.unwatched() {
            (SPIN_OVERSUBSCRIBED, YIELD_OVERSUBSCRIBED)
        } else {
            (self.spin_budget, self.op_yield)
        };
        if waited < spin {
            std::hint::spin_loop();
        } else if waited < yield_for {
            // What a yield showed matters only to a spin budget that adapts
            // (ranks with a core each); where ranks crowd the cores there is
            // no spin, and the two system calls would slow every yield.
            if self.spin.is_zero() || self.wait_override.0.is_some() {
                std::thread::yield_now();
            } else {
                let (switched, took) = yield_core();
                wait.handed |= switched && took < YIELD_LOST_MIN;
                wait.lost |= took >= YIELD_LOST_MIN;
            }
        } else {
            if let Some(why) = self.cancel.reason() {
                return Err(why);
            }
            if let Some(check) = ctx.interrupt {
                if now.duration_since(wait.last_interrupt_check) >= INTERRUPT_EVERY {
                    wait.last_interrupt_check = now;
                    if check() {
                        return Err(ErrorKind::Interrupted);
                    }
                }
            }
            self.idle_wait(sends, recvs);
        }
        Ok(())
    }

    /// Whether every transfer that could move (unfinished, not held) waits
    /// for a link being made, and one does.
    fn waits_for_links_only(&self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)]) -> bool {
        if !self.links.makes_links() {
            return false;
        }
        let mut heads = sends
            .iter()
            .map(|(p, j)| (*p, j.done, j.held))
            .chain(recvs.iter().map(|(p, j)| (*p, j.done, j.held)))
            .filter(|&(_, done, held)| !done && !held)
            .peekable();
        heads.peek().is_some() && heads.all(|(p, _, _)| self.links.get(p).is_none())
    }

    /// Fails if a peer with an active transfer is known to be gone.
    fn check_peers_alive(
        &mut self,
        sends: &[(usize, SendJob)],
        recvs: &[(usize, RecvJob)],
    ) -> Result<(), ErrorKind> {
        let waiting_on = recvs
            .iter()
            .filter(|(_, j)| j.active())
            .map(|(p, _)| *p)
            .chain(sends.iter().filter(|(_, j)| j.active()).map(|(p, _)| *p));
        for peer in waiting_on {
            if let Some(l) = self.links.get_mut(peer) {
                if let Err(e) = l.check_alive() {
                    return Err(self.links.own_error(peer, e));
                }
            }
        }
        Ok(())
    }

    /// Blocks briefly on what the transfers' links say to wait on
    /// ([`WaitOn`]): in poll(2) when only sockets can wake us (the kernel
    /// does when data arrives), on the doorbell when only it can, and in
    /// short turns of each otherwise.
    ///
    /// Only each peer's first unfinished message can move (messages to a
    /// peer go in order), and not while held: a later or held one waits on
    /// this rank's own progress, not on a peer. Counting one as waitable
    /// would let a rank whose later shared-memory sends had free slots skip
    /// every sleep and spin on poll(2) while its TCP receive was in flight,
    /// starving the ranks it shares cores with.
    fn idle_wait(&mut self, sends: &[(usize, SendJob)], recvs: &[(usize, RecvJob)]) {
        self.pollfds.clear();
        self.doorbell_waits.clear();
        let mut connecting = false;
        let heads = sends
            .iter()
            .map(|(p, j)| (*p, true, j.done, j.held, j.started))
            .chain(
                recvs
                    .iter()
                    .map(|(p, j)| (*p, false, j.done, j.held, j.started)),
            );
        for (peer, is_send, done, held, started) in heads {
            let bit = if is_send {
                Marks::BUSY_TX
            } else {
                Marks::BUSY_RX
            };
            if done || self.mark(peer, bit) || held {
                continue;
            }
            match self.links.get(peer).map(|l| l.wait_on(is_send, started)) {
                Some(WaitOn::Poll(fds)) => self.pollfds.extend(fds),
                Some(WaitOn::Doorbell) => self.doorbell_waits.push((peer, is_send)),
                // Its link is being made: look again soon.
                None => connecting = true,
            }
        }
        if self.multipath {
            // Chunks a link writes on its own wake us too (only a link that
            // carried something since it was last at rest has any).
            for (peer, l) in self.links.restless() {
                if !peer.is_some_and(|p| self.marked(p, Marks::BUSY_TX)) {
                    self.pollfds.extend(l.background_wait());
                }
            }
        }
        self.unmark(sends, recvs, Marks::BUSY_TX | Marks::BUSY_RX);
        let sockets_pending = !self.pollfds.is_empty();
        if connecting {
            // Sleep until a link comes up (or data on the others): the
            // streams of links on their way, and the maker's descriptor,
            // which the threads making or accepting links ring.
            self.links.maker_fds(&mut self.pollfds);
            poll_fds(&mut self.pollfds, self.nap);
            return;
        }
        if self.doorbell_waits.is_empty() {
            poll_fds(&mut self.pollfds, self.nap);
            return;
        }
        if sockets_pending {
            poll_fds(&mut self.pollfds, Duration::ZERO);
        }
        let Some(inbox) = &self.inbox else {
            std::thread::sleep(NAP_NO_INBOX);
            return;
        };
        let seen = inbox.prepare_sleep();
        // Re-check after raising the flag: a peer that published before it
        // saw the flag down and did not ring.
        if self.doorbell_ready() || inbox.aborted() {
            inbox.cancel_sleep();
            return;
        }
        let nap = if sockets_pending {
            self.nap_mixed
        } else {
            self.nap
        };
        self.wait_stats.naps += 1;
        if inbox.sleep(seen, nap) {
            self.wait_stats.nap_timeouts += 1;
            if self.doorbell_ready() {
                self.wait_stats.late_wakeups += 1;
            }
        }
    }

    /// Whether a transfer waiting on the doorbell could move now.
    fn doorbell_ready(&self) -> bool {
        self.doorbell_waits
            .iter()
            .any(|&(p, is_send)| self.links.get(p).is_some_and(|l| l.ready(is_send)))
    }
}

/// How long one idle sleep lasts with `local` ranks on `cores` cores, on
/// one kind of wake-up and on both (see `NAP_RANKS_PER_CORE`).
fn naps_for(local: usize, cores: usize) -> (Duration, Duration) {
    let crowd = crowd(local, cores);
    ((NAP * crowd).min(NAP_MAX), (NAP_MIXED * crowd).min(NAP))
}

/// How many times [`NAP_RANKS_PER_CORE`] ranks a core has (at least 1): a
/// wait's periodic checks come this many times less often.
fn crowd(local: usize, cores: usize) -> u32 {
    (local / (NAP_RANKS_PER_CORE * cores.max(1))).max(1) as u32
}

/// Yields the core: whether the scheduler ran another task meanwhile, and
/// how long the yield took. A `sched_yield` that switched counts as one of
/// the thread's involuntary context switches; alone on its core it counts
/// none. (Timing the yield alone took a loaded machine's slow yields for
/// hand-overs, or missed them when the start-up yields were slow.)
fn yield_core() -> (bool, Duration) {
    let before = involuntary_switches();
    let t = Instant::now();
    std::thread::yield_now();
    let took = t.elapsed();
    (involuntary_switches() != before, took)
}

/// This thread's involuntary context switches so far.
fn involuntary_switches() -> i64 {
    // SAFETY: rusage is plain integers and timevals; all-zero is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct we own; RUSAGE_THREAD cannot fail
    // on Linux with a valid pointer (on failure the count stays 0: no
    // hand-over seen).
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    u.ru_nivcsw as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(engine: &mut Engine, idle_us: u64, handed: bool, lost: bool) -> Duration {
        let mut wait = Wait::since(Instant::now());
        wait.handed = handed;
        wait.lost = lost;
        engine.adapt_spin(Duration::from_micros(idle_us), &wait);
        engine.spin_budget
    }

    #[test]
    fn the_spin_budget_follows_what_the_yields_showed() {
        let mut e = Engine::new(0, 1, crate::engine::Links::new(1), None);
        e.set_local_ranks(1);
        assert_eq!(e.spin_budget, SPIN);
        // A peer on our core answered after a yield handed it the core.
        assert_eq!(ended(&mut e, 80, true, false), Duration::ZERO);
        assert_eq!(e.wait_stats.shared_core_waits, 1);
        // Waits answered within the full budget, nothing handed: it grows back.
        let grown: Vec<u64> = (0..8)
            .map(|_| ended(&mut e, 3, false, false).as_micros() as u64)
            .collect();
        assert_eq!(grown, [1, 2, 4, 8, 16, 32, 50, 50]);
        // Longer than the full budget, alone on the core: spinning would not
        // have helped, nor hurt; unchanged.
        assert_eq!(ended(&mut e, 400, false, false), SPIN);
        // The core lost to a foreign task for a slice: unchanged, even with a
        // short hand-over in the same wait.
        assert_eq!(ended(&mut e, 4000, true, true), SPIN);
        assert_eq!(e.wait_stats.shared_core_waits, 1);
    }

    #[test]
    fn a_fixed_spin_budget_does_not_adapt() {
        let mut e = Engine::new(0, 1, crate::engine::Links::new(1), None);
        e.override_wait(Some(Duration::from_micros(50)), None);
        e.set_local_ranks(1);
        assert_eq!(ended(&mut e, 80, true, false), Duration::from_micros(50));
        assert_eq!(e.wait_stats.shared_core_waits, 0);
    }

    #[test]
    fn naps_lengthen_only_when_ranks_crowd_the_cores() {
        assert_eq!(naps_for(1, 2), (NAP, NAP_MIXED));
        assert_eq!(naps_for(8, 2), (NAP, NAP_MIXED));
        assert_eq!(naps_for(64, 2), (NAP * 8, NAP_MIXED * 8));
        assert_eq!(naps_for(512, 2), (NAP * 64, NAP));
        assert_eq!(naps_for(2048, 2), (NAP_MAX, NAP));
        assert_eq!(naps_for(64, 16), (NAP, NAP_MIXED));
        assert_eq!(naps_for(5, 0), (NAP, NAP_MIXED));
    }

    #[test]
    fn with_more_ranks_than_cores_nothing_spins() {
        let mut e = Engine::new(0, 1, crate::engine::Links::new(1), None);
        e.set_local_ranks(100_000);
        assert_eq!(e.spin_budget, Duration::ZERO);
        assert_eq!(ended(&mut e, 0, false, false), Duration::ZERO);
        assert_eq!(ended(&mut e, 3, false, false), Duration::ZERO);
    }

    #[test]
    fn with_more_ranks_than_cores_small_rooted_calls_yield_longer() {
        use CollKind::*;
        let mut e = Engine::new(0, 1, crate::engine::Links::new(1), None);
        e.set_local_ranks(100_000);
        for coll in [Broadcast, Reduce, Gather, Scatter] {
            assert_eq!(e.yield_budget(coll, 64), YIELD, "{coll}");
            assert_eq!(
                e.yield_budget(coll, 1 << 20),
                YIELD_OVERSUBSCRIBED,
                "{coll}"
            );
        }
        for coll in [
            AllReduce,
            AllGather,
            ReduceScatter,
            AllToAll,
            Barrier,
            Send,
            Recv,
        ] {
            assert_eq!(e.yield_budget(coll, 64), YIELD_OVERSUBSCRIBED, "{coll}");
        }
        // A core per rank: every call yields as long.
        e.set_local_ranks(1);
        assert_eq!(e.yield_budget(AllReduce, 64), YIELD);
        assert_eq!(e.yield_budget(Broadcast, 64), YIELD);
        // CADENCE_YIELD_US fixes it for every call.
        let us = Duration::from_micros(7);
        e.override_wait(None, Some(us));
        e.set_local_ranks(100_000);
        assert_eq!(e.yield_budget(Broadcast, 64), us);
        assert_eq!(e.yield_budget(AllReduce, 64), us);
    }
}
