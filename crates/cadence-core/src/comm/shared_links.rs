//! A root communicator's TCP links, shared with every communicator split
//! from it (`CADENCE_SPLIT_LINKS=share`, the default): a split makes no
//! connection to a member its root already links to, and no listener of
//! its own.
//!
//! One operation at a time holds the links (`engine/pool.rs` lends them to
//! its engine), **in the order this rank issued the operations**, whatever
//! communicator and thread runs them: each operation takes a ticket when
//! it is issued (a call, or a submit to the progress thread) and waits for
//! its turn. The peers read a link's frames in the order they come, so
//! ranks that share links must issue their operations on the communicators
//! that share them in the same order; a rank that does not meets a frame
//! of another communicator, which is an error naming both calls (frames
//! carry their communicator's tag), not garbage or a hang.
//!
//! A failure on one of them fails them all: a link may be left mid-frame,
//! and the peers were told (the abort goes on every shared link).

use super::{Inner, Shared};
use crate::engine::{Cancel, Engine, Pool, View, INTERRUPT_EVERY};
use crate::error::ErrorKind;
use crate::transport::LinkCounters;
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// The root's links and whose turn it is.
pub(super) struct SharedLinks {
    turns: Mutex<Turns>,
    turn_changed: Condvar,
    /// The root's list of link counters (its dumps read it).
    counters: Arc<Mutex<Vec<Arc<LinkCounters>>>>,
}

struct Turns {
    /// None while lent.
    pool: Option<Box<Pool>>,
    /// The next ticket to hand out, and the one whose turn it is.
    next: u64,
    serving: u64,
    /// Tickets given up before their turn (their operations were refused
    /// before they ran): skipped when their turn comes.
    given_up: BTreeSet<u64>,
    /// The failure that ended the sharing communicators (communicator id,
    /// the error's text, its culprit in the root's numbering).
    failed: Option<(String, String, Option<usize>)>,
}

/// One communicator's part in the sharing: the links, and its ranks in
/// the root's numbering.
#[derive(Clone)]
pub(super) struct Share {
    pub(super) links: Arc<SharedLinks>,
    pub(super) view: Arc<View>,
}

/// An operation's place in the order: its turn comes after every
/// operation issued before it on this rank. Given up when dropped unused.
pub(super) struct Ticket {
    links: Arc<SharedLinks>,
    number: u64,
    used: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.used {
            self.links.give_up(self.number);
        }
    }
}

impl SharedLinks {
    /// Shares `pool`, whose counters are in `counters`.
    pub(super) fn new(pool: Pool, counters: Arc<Mutex<Vec<Arc<LinkCounters>>>>) -> SharedLinks {
        SharedLinks {
            turns: Mutex::new(Turns {
                pool: Some(Box::new(pool)),
                next: 0,
                serving: 0,
                given_up: BTreeSet::new(),
                failed: None,
            }),
            turn_changed: Condvar::new(),
            counters,
        }
    }

    /// How many links the root holds (made by any sharing communicator).
    pub(super) fn len(&self) -> usize {
        self.counters.lock().unwrap().len()
    }

    fn give_up(&self, number: u64) {
        let mut t = self.turns.lock().unwrap();
        t.given_up.insert(number);
        t.advance_past_given_up();
        drop(t);
        self.turn_changed.notify_all();
    }
}

impl Turns {
    fn advance_past_given_up(&mut self) {
        while self.given_up.remove(&self.serving) {
            self.serving += 1;
        }
    }
}

impl Share {
    /// The next place in this rank's order of operations.
    pub(super) fn ticket(&self) -> Ticket {
        let mut t = self.links.turns.lock().unwrap();
        let number = t.next;
        t.next += 1;
        Ticket {
            links: self.links.clone(),
            number,
            used: false,
        }
    }

    /// Waits for `ticket`'s turn (until `deadline`: the operations before
    /// it have deadlines of their own, so only a stuck thread gets there;
    /// or until `cancel` says the caller gave up) and lends the links to
    /// `engine`. Fails when a communicator sharing them failed.
    pub(super) fn lend(
        &self,
        engine: &mut Engine,
        ticket: &mut Ticket,
        deadline: Instant,
        cancel: Option<&Cancel>,
    ) -> Result<(), ErrorKind> {
        ticket.used = true;
        let mut t = self.links.turns.lock().unwrap();
        while t.serving != ticket.number || t.pool.is_none() {
            let now = Instant::now();
            let gave_up = cancel.and_then(Cancel::reason);
            if now >= deadline || gave_up.is_some() {
                // Its turn will never be taken: later ones go on.
                t.given_up.insert(ticket.number);
                t.advance_past_given_up();
                drop(t);
                self.links.turn_changed.notify_all();
                return Err(gave_up.unwrap_or_else(|| ErrorKind::Failed {
                    detail: "the links this communicator shares with its root were held \
                             past the deadline by an operation of another communicator"
                        .into(),
                    culprit: None,
                }));
            }
            let nap = (deadline - now).min(INTERRUPT_EVERY);
            t = self.links.turn_changed.wait_timeout(t, nap).unwrap().0;
        }
        if let Some((comm, what, culprit)) = &t.failed {
            let e = ErrorKind::Failed {
                detail: format!(
                    "communicator {comm}, which shares this one's links, failed: {what}"
                ),
                culprit: culprit.and_then(|r| self.view.own(r)),
            };
            t.serving += 1;
            t.advance_past_given_up();
            drop(t);
            self.links.turn_changed.notify_all();
            return Err(e);
        }
        let pool = t.pool.take().expect("checked above");
        drop(t);
        engine.lend(pool, self.view.clone());
        Ok(())
    }

    /// Takes the links back from `engine` after `ticket`'s operation (and
    /// after every later one it took in: `through`), and passes the turn.
    pub(super) fn give_back(&self, engine: &mut Engine, through: &Ticket) {
        let pool = engine.take_lent();
        let mut t = self.links.turns.lock().unwrap();
        if let Some(pool) = pool {
            t.pool = Some(pool);
        }
        t.serving = t.serving.max(through.number + 1);
        t.advance_past_given_up();
        drop(t);
        self.links.turn_changed.notify_all();
    }

    /// Lends the links to `engine` if nobody holds or waits for them (the
    /// path keeper's background work between operations): the ticket to
    /// give them back with.
    pub(super) fn lend_if_idle(&self, engine: &mut Engine) -> Option<Ticket> {
        let mut t = self.links.turns.lock().unwrap();
        if t.serving != t.next || t.pool.is_none() || t.failed.is_some() {
            return None;
        }
        let number = t.next;
        t.next += 1;
        let pool = t.pool.take().expect("checked above");
        drop(t);
        engine.lend(pool, self.view.clone());
        Some(Ticket {
            links: self.links.clone(),
            number,
            used: true,
        })
    }

    /// Whether `ticket` comes right after `held` (a point-to-point batch
    /// holding the links through `held` may take it in).
    pub(super) fn follows(held: &Ticket, ticket: &Ticket) -> bool {
        ticket.number == held.number + 1
    }

    /// Marks `ticket` as taken in by an operation that holds the links.
    pub(super) fn take_in(ticket: &mut Ticket) {
        ticket.used = true;
    }

    /// Records that communicator `comm` failed with `e` (culprit in its own
    /// numbering): every operation on a communicator sharing the links
    /// fails from now on.
    pub(super) fn fail(&self, comm: &str, e: &crate::error::CommError) {
        let mut t = self.links.turns.lock().unwrap();
        if t.failed.is_none() {
            let culprit = e.culprit().and_then(|r| self.view.root(r));
            t.failed = Some((comm.to_string(), e.kind.to_string(), culprit));
        }
    }

    /// Whether this is the root's own part.
    pub(super) fn is_root(&self) -> bool {
        matches!(*self.view, View::Same)
    }
}

impl Shared {
    /// Runs `f` in `ticket`'s turn with the shared links lent to the
    /// engine, when this communicator shares them; `f` learns whether the
    /// loan failed (a communicator sharing them failed, the turn never
    /// came, or the communicator was cancelled while it waited, unless
    /// `cancellable` is false) and decides what that means.
    pub(super) fn holding_links<R>(
        &self,
        inner: &mut Inner,
        mut ticket: Option<Ticket>,
        deadline: Instant,
        cancellable: bool,
        f: impl FnOnce(&mut Inner, Result<(), ErrorKind>) -> R,
    ) -> R {
        let (Some(share), Some(t)) = (self.share.get(), ticket.as_mut()) else {
            return f(inner, Ok(()));
        };
        let cancel = cancellable.then_some(&*self.cancel);
        let lent = share.lend(&mut inner.engine, t, deadline, cancel);
        let r = f(inner, lent);
        share.give_back(&mut inner.engine, t);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Links;
    use std::time::Duration;

    fn share() -> (Share, Engine) {
        let counters = Arc::default();
        let pool = Pool::new(Links::new(4), Arc::clone(&counters));
        let links = Arc::new(SharedLinks::new(pool, counters));
        let share = Share {
            links,
            view: Arc::new(View::Same),
        };
        (share, Engine::new(0, 4, Links::new(4), None))
    }

    #[test]
    fn turns_come_in_the_order_tickets_were_taken_and_skip_given_up_ones() {
        let (share, _) = share();
        let first = share.ticket();
        let second = share.ticket();
        let third = share.ticket();
        drop(second); // refused before it ran
        let order = Arc::new(Mutex::new(Vec::new()));
        let later = {
            let (share, order) = (share.clone(), order.clone());
            std::thread::spawn(move || {
                let mut third = third;
                let mut eng = Engine::new(0, 4, Links::new(4), None);
                let deadline = Instant::now() + Duration::from_secs(5);
                share.lend(&mut eng, &mut third, deadline, None).unwrap();
                order.lock().unwrap().push(3);
                share.give_back(&mut eng, &third);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            order.lock().unwrap().is_empty(),
            "the third waits for the first"
        );
        let mut first = first;
        let mut eng = Engine::new(0, 4, Links::new(4), None);
        share
            .lend(
                &mut eng,
                &mut first,
                Instant::now() + Duration::from_secs(5),
                None,
            )
            .unwrap();
        order.lock().unwrap().push(1);
        share.give_back(&mut eng, &first);
        later.join().unwrap();
        assert_eq!(*order.lock().unwrap(), [1, 3]);
        // Nobody waits now: the path keeper may take the links.
        let mut eng = Engine::new(0, 4, Links::new(4), None);
        let t = share.lend_if_idle(&mut eng).expect("idle");
        assert!(share
            .lend_if_idle(&mut Engine::new(0, 4, Links::new(4), None))
            .is_none());
        share.give_back(&mut eng, &t);
    }

    #[test]
    fn a_cancelled_communicator_stops_waiting_for_its_turn() {
        let (share, mut eng) = share();
        let mut held = share.ticket();
        let mut waiting = share.ticket();
        let far = Instant::now() + Duration::from_secs(30);
        share.lend(&mut eng, &mut held, far, None).unwrap();
        let cancel = Arc::new(Cancel::default());
        let later = {
            let (share, cancel) = (share.clone(), cancel.clone());
            std::thread::spawn(move || {
                let mut other = Engine::new(0, 4, Links::new(4), None);
                let t = Instant::now();
                let r = share.lend(&mut other, &mut waiting, far, Some(&cancel));
                (r, t.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        cancel.set(ErrorKind::UserAbort("stop".into()));
        let (r, took) = later.join().unwrap();
        assert!(matches!(r, Err(ErrorKind::UserAbort(_))), "{r:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        // Its turn is skipped: the next ticket gets the links.
        share.give_back(&mut eng, &held);
        let mut next = share.ticket();
        share.lend(&mut eng, &mut next, far, None).unwrap();
        share.give_back(&mut eng, &next);
    }

    #[test]
    fn a_failure_fails_every_later_turn_and_a_stuck_turn_times_out() {
        let (share, mut eng) = share();
        let held = share.ticket();
        let mut waiting = share.ticket();
        let mut held = held;
        share
            .lend(
                &mut eng,
                &mut held,
                Instant::now() + Duration::from_secs(1),
                None,
            )
            .unwrap();
        let mut other = Engine::new(0, 4, Links::new(4), None);
        let e = share
            .lend(
                &mut other,
                &mut waiting,
                Instant::now() + Duration::from_millis(30),
                None,
            )
            .unwrap_err();
        assert!(e.to_string().contains("held past the deadline"), "{e}");
        share.fail(
            "c1",
            &crate::error::CommError::new(ErrorKind::PeerDied { peer: 2, pid: 9 }),
        );
        share.give_back(&mut eng, &held);
        let mut next = share.ticket();
        let e = share
            .lend(
                &mut other,
                &mut next,
                Instant::now() + Duration::from_secs(1),
                None,
            )
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("communicator c1") && text.contains("rank 2"),
            "{text}"
        );
        assert_eq!(e.culprit(), Some(2));
    }
}
