//! Links made on first use: the engine asks its [`LinkMaker`] for a link
//! the first time a transfer needs a peer it has none to, moves every
//! other transfer meanwhile, and installs links as they come up (also
//! links a peer made first).

use super::Engine;
use crate::error::ErrorKind;
use crate::transport::Link;

/// A link first wanted by a call this large carries bulk data: the path
/// planner counts it when it balances the fabric's uplinks (a barrier's or
/// a small allreduce's link it places without counting it).
pub const BULK_BYTES: usize = 64 * 1024;

/// What a link is expected to carry, for the path planner's balance of the
/// fabric's uplinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkUse {
    /// Small messages (a barrier's, a small call's): placed, not counted.
    Light,
    /// Bulk data from the rank that dials it to its peer only (a ring's
    /// link to the next rank): its other direction is not counted.
    Forward,
    /// Bulk data either way (a link first wanted by a large call).
    Both,
}

impl LinkUse {
    /// The planner's weights of the link's streams (dialer to peer, back).
    pub fn weights(self) -> (u8, u8) {
        match self {
            LinkUse::Light => (0, 0),
            LinkUse::Forward => (1, 0),
            LinkUse::Both => (1, 1),
        }
    }
}

/// Makes links in the background (the communicator's, over TCP).
pub trait LinkMaker: Send {
    /// Asks for a link to `peer`; idempotent, never blocks. `used`: what
    /// it will carry, as far as the asker knows (the path planner balances
    /// bulk links; the others it places without counting them).
    fn request(&mut self, peer: usize, used: LinkUse);
    /// Whether links (or failures to make one) are waiting to be taken.
    fn has_ready(&self) -> bool;
    /// The links that came up since the last call (or why one could not).
    fn take_ready(&mut self) -> Vec<(usize, Result<Link, ErrorKind>)>;
    /// A file descriptor that polls readable when links are ready, so an
    /// idle engine waiting for one sleeps until then.
    fn wake_fd(&self) -> std::os::fd::RawFd;
    /// Whether links are on their way that the engine's loop moves
    /// ([`LinkMaker::advance`]).
    fn in_flight(&self) -> bool;
    /// Moves the links on their way, without blocking; a link that comes
    /// up is ready to take.
    fn advance(&mut self);
    /// What an idle engine polls for the links on their way.
    fn flight_fds(&self, out: &mut Vec<libc::pollfd>);
}

impl Engine {
    /// Takes the links that came up into `links` (and their counters into
    /// the shared list). A link that could not be made fails the operation
    /// that asked for it.
    pub(super) fn install_ready_links(&mut self) -> Result<(), ErrorKind> {
        self.links.install_ready(&self.counters)?;
        self.multipath = self.links.multipath();
        Ok(())
    }

    /// A receive from `peer` and no link yet: the sender makes it, as it
    /// must send first (the receive waits; others move). Asking here too
    /// would race the sender's link on every first message, and one of the
    /// two would be made for nothing. Fails when links are never made here.
    pub(super) fn await_link(&mut self, peer: usize) -> Result<(), ErrorKind> {
        match self.links.makes_links() {
            true if peer != self.rank => Ok(()),
            _ => Err(ErrorKind::Internal(format!(
                "schedule/engine invariant: no link to rank {peer}"
            ))),
        }
    }

    /// A send to `peer` by a call of `bytes` and there is no link yet: asks for one
    /// (the transfer waits; others move). Fails when links are never made
    /// here.
    pub(super) fn want_link(&mut self, peer: usize, bytes: usize) -> Result<(), ErrorKind> {
        match self.links.makes_links() {
            true if peer != self.rank => {
                let used = if bytes >= BULK_BYTES {
                    LinkUse::Both
                } else {
                    LinkUse::Light
                };
                self.links.request(peer, used);
                Ok(())
            }
            _ => Err(ErrorKind::Internal(format!(
                "schedule/engine invariant: no link to rank {peer}"
            ))),
        }
    }
}
