//! Links made on first use: the engine asks its [`LinkMaker`] for a link
//! the first time a transfer needs a peer it has none to, moves every
//! other transfer meanwhile, and installs links as they come up (also
//! links a peer made first).

use super::Engine;
use crate::error::ErrorKind;
use crate::transport::Link;

/// Makes links in the background (the communicator's, over TCP).
pub trait LinkMaker: Send {
    /// Asks for a link to `peer`; idempotent, never blocks.
    fn request(&mut self, peer: usize);
    /// Whether links (or failures to make one) are waiting to be taken.
    fn has_ready(&self) -> bool;
    /// The links that came up since the last call (or why one could not).
    fn take_ready(&mut self) -> Vec<(usize, Result<Link, ErrorKind>)>;
    /// A file descriptor that polls readable when links are ready, so an
    /// idle engine waiting for one sleeps until then.
    fn wake_fd(&self) -> std::os::fd::RawFd;
}

impl Engine {
    /// Takes the links that came up into `links` (and their counters into
    /// the shared list). A link that could not be made fails the operation
    /// that asked for it.
    pub(super) fn install_ready_links(&mut self) -> Result<(), ErrorKind> {
        let Some(maker) = self.maker.as_mut() else {
            return Ok(());
        };
        if !maker.has_ready() {
            return Ok(());
        }
        for (peer, made) in maker.take_ready() {
            let link = made?;
            self.multipath |= link.multipath();
            let stats = link.stats().clone();
            if self.links.insert(peer, link).is_err() {
                return Err(ErrorKind::Internal(format!("a second link to rank {peer}")));
            }
            self.counters.lock().unwrap().push(stats);
        }
        Ok(())
    }

    /// A transfer needs `peer` and there is no link yet: asks for one (the
    /// transfer waits; others move). Fails when links are never made here.
    pub(super) fn want_link(&mut self, peer: usize) -> Result<(), ErrorKind> {
        match self.maker.as_mut() {
            Some(m) if peer != self.rank => {
                m.request(peer);
                Ok(())
            }
            _ => Err(ErrorKind::Internal(format!(
                "schedule/engine invariant: no link to rank {peer}"
            ))),
        }
    }
}
