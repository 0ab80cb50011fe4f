//! [`Link`]: the one interface the engine sees, over every transport.

use super::{shm, tcp, AbortNotice, LinkCounters, RecvJob, SendJob, StallNotice, WireHeader};
use crate::error::ErrorKind;
use std::sync::Arc;

/// What an idle engine waits on for one transfer that cannot move now
/// ([`Link::wait_on`]). The engine gathers these over its transfers and
/// blocks once: in poll(2) on every socket, on its shared-memory doorbell,
/// or in short turns of each.
pub enum WaitOn<P> {
    /// The kernel says when: `poll(2)` these entries.
    Poll(P),
    /// The peer rings this rank's doorbell (the futex word in its
    /// [`shm::Inbox`]) when it publishes; after raising the sleep flag the
    /// engine asks [`Link::ready`] once more, for a publish that came first.
    Doorbell,
}

/// Blocks in poll(2) on `fds` for at most `timeout` (sleeps when empty).
pub use super::tcp::poll_fds;

/// A connection to one peer, over shared memory or TCP. Boxed: the engine
/// keeps a slot per rank of the job, most of them empty.
pub enum Link {
    Shm(Box<shm::ShmLink>),
    Tcp(Box<tcp::TcpLink>),
}

impl Link {
    pub fn tcp(link: tcp::TcpLink) -> Link {
        Link::Tcp(Box::new(link))
    }
    pub fn shm(link: shm::ShmLink) -> Link {
        Link::Shm(Box::new(link))
    }
}

impl Link {
    pub fn send_progress(&mut self, job: &mut SendJob) -> Result<bool, ErrorKind> {
        match self {
            Link::Shm(l) => l.send_progress(job),
            Link::Tcp(l) => l.send_progress(job),
        }
    }
    pub fn recv_progress(&mut self, job: &mut RecvJob) -> Result<bool, ErrorKind> {
        match self {
            Link::Shm(l) => l.recv_progress(job),
            Link::Tcp(l) => l.recv_progress(job),
        }
    }
    pub fn stats(&self) -> &Arc<LinkCounters> {
        match self {
            Link::Shm(l) => &l.stats,
            Link::Tcp(l) => &l.stats,
        }
    }
    pub fn is_tcp(&self) -> bool {
        matches!(self, Link::Tcp(_))
    }
    /// Whether this link has several paths, and so background work
    /// ([`Link::maintain`]).
    pub fn multipath(&self) -> bool {
        match self {
            Link::Tcp(l) => l.multipath(),
            Link::Shm(_) => false,
        }
    }
    /// What to wait on while a send (`send = true`) or receive to this peer
    /// cannot move; `started`: the job's `started` (the link has begun it).
    pub fn wait_on(
        &self,
        send: bool,
        started: bool,
    ) -> WaitOn<impl Iterator<Item = libc::pollfd> + '_> {
        match self {
            Link::Tcp(l) => {
                let events = if send { libc::POLLOUT } else { libc::POLLIN };
                WaitOn::Poll(l.waiting_fds(send, started).map(move |fd| libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                }))
            }
            Link::Shm(_) => WaitOn::Doorbell,
        }
    }
    /// What else to poll while this link writes chunks on its own (sent
    /// again after a path failed, or the rest of a completed send), with no
    /// send of the engine's to this peer pending.
    pub fn background_wait(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        let fds = match self {
            Link::Tcp(l) => Some(l.background_fds()),
            Link::Shm(_) => None,
        };
        fds.into_iter().flatten().map(|fd| libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        })
    }
    /// Whether a send (`send = true`) or receive that waits on the doorbell
    /// ([`WaitOn::Doorbell`]) could move now. Links waited on by poll(2)
    /// answer `false` (the kernel tells for them).
    pub fn ready(&self, send: bool) -> bool {
        match self {
            Link::Shm(l) if send => l.tx_ready(),
            Link::Shm(l) => l.rx_ready(),
            Link::Tcp(_) => false,
        }
    }
    /// Where the peer says it stands in its collectives, against operation
    /// `seq`, for a timeout's text (`None` where the link cannot tell).
    pub fn describe_peer_progress(&self, peer: usize, seq: u64) -> Option<String> {
        match self {
            Link::Shm(l) => Some(l.peer_progress().describe(peer, seq)),
            Link::Tcp(_) => None,
        }
    }
    /// Checks, cheaply, whether the peer is known to be gone.
    pub fn check_alive(&mut self) -> Result<(), ErrorKind> {
        match self {
            Link::Shm(l) => l.check_alive(),
            Link::Tcp(_) => Ok(()),
        }
    }
    /// Tells the peer whom this rank waits on (best effort, never blocks long).
    pub fn post_stall(&mut self, notice: &StallNotice) {
        match self {
            Link::Shm(l) => l.post_stall(notice),
            Link::Tcp(l) => l.post_stall(notice),
        }
    }
    /// The header of the next data frame from this peer, without taking it
    /// (control frames ahead of it are consumed: a stall notice is noted, an
    /// abort fails). `None` while none has arrived. Only valid between
    /// receives: no receive from this peer may be in progress.
    pub fn peek_header(&mut self) -> Result<Option<WireHeader>, ErrorKind> {
        match self {
            Link::Shm(l) => Ok(l.peek_header()),
            Link::Tcp(l) => l.peek_header(),
        }
    }
    /// Background work of a TCP link with several paths: path failure and
    /// recovery, and writing chunks the link owns (see
    /// [`tcp::TcpLink::maintain`]). Nothing to do on other links.
    pub fn maintain(&mut self) -> Result<bool, ErrorKind> {
        match self {
            Link::Tcp(l) => l.maintain(),
            Link::Shm(_) => Ok(false),
        }
    }
    /// Whether [`Link::maintain`] has nothing to do until the link next
    /// carries something: nothing queued, nothing to send again, no path
    /// waiting to come back (always, without several paths).
    pub fn resting(&self) -> bool {
        match self {
            Link::Tcp(l) => l.resting(),
            Link::Shm(_) => true,
        }
    }
    /// The link is about to carry something after a rest, at `now` (see
    /// [`tcp::TcpLink::wake`]).
    pub fn wake(&mut self, now: std::time::Instant) {
        if let Link::Tcp(l) = self {
            l.wake(now);
        }
    }
    /// Writes what is left of queued control frames (stall notices), never
    /// blocking.
    pub fn flush_control(&mut self) {
        if let Link::Tcp(l) = self {
            l.flush_control();
        }
    }
    /// The last stall notice this peer sent, if any.
    pub fn read_stall(&self) -> Option<StallNotice> {
        match self {
            Link::Shm(l) => l.read_stall(),
            Link::Tcp(l) => l.stall.clone(),
        }
    }
    /// Tells the peer this rank failed (best effort, never blocks long).
    pub fn send_abort(&mut self, notice: &AbortNotice) {
        match self {
            Link::Shm(l) => l.send_abort(notice),
            Link::Tcp(l) => l.send_abort(notice),
        }
    }
}
