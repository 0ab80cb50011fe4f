//! Failure handling: a failed operation fails the communicator, tells every
//! peer which rank is to blame, and leaves evidence (a warning line, a dump
//! under `CADENCE_DUMP_DIR`); aborting on purpose takes the same path.

use super::{Inner, Shared};
use crate::config::DebugLevel;
use crate::error::{CommError, ErrorKind, Result};
use crate::transport::Link;

impl Shared {
    /// Fails the communicator after `e`: later operations fail at once,
    /// and every peer is told why (the one failure path, for collectives and
    /// point-to-point batches alike).
    pub(super) fn fail_locked(&self, inner: &mut Inner, e: &CommError) {
        inner.failed = Some(e.clone());
        inner.engine.broadcast_abort(e);
        if let Some(share) = self.share.get() {
            share.fail(&self.id, e);
        }
    }

    /// Prints a failed operation's error (`CADENCE_DEBUG` WARN and above).
    pub(super) fn warn_failed(&self, e: &CommError) {
        if self.cfg.debug >= DebugLevel::Warn {
            stderr_line!("{e}");
        }
    }

    /// Writes the dump a failure leaves under `CADENCE_DUMP_DIR`, if set.
    pub(super) fn dump_on_error(&self, e: &CommError) {
        if let Some(dir) = &self.cfg.dump_dir {
            if let Err(err) = self.dump_to(dir, &format!("failure: {e}")) {
                stderr_line!(
                    "cadence: could not write a dump into {}: {err}",
                    dir.display()
                );
            }
        }
    }

    /// See [`Comm::abort`](super::Comm::abort).
    pub(super) fn abort(&self, reason: &str) {
        self.cancel.set(ErrorKind::UserAbort(reason.to_string()));
        // Its turn on shared links comes after the operations issued
        // before (this communicator's give up at once, being cancelled):
        // the abort then goes on every shared link too.
        let ticket = self.ticket();
        let mut inner = self.inner.lock().unwrap();
        if inner.failed.is_none() {
            let deadline = std::time::Instant::now() + self.cfg.timeout;
            // Not cancellable: this abort is what cancelled the communicator.
            self.holding_links(&mut inner, ticket, deadline, false, |inner, _| {
                let e = self.err(ErrorKind::UserAbort(reason.to_string()), None);
                self.fail_locked(inner, &e);
            });
        }
    }

    /// See [`Comm::inject_garbage`](super::Comm::inject_garbage).
    pub(super) fn inject_garbage(&self, peer: usize) -> Result<()> {
        let ticket = self.ticket();
        let mut inner = self.inner.lock().unwrap();
        let deadline = std::time::Instant::now() + self.cfg.timeout;
        self.holding_links(&mut inner, ticket, deadline, true, |inner, lent| {
            lent.map_err(|k| self.err(k, None))?;
            match inner.engine.links.get_mut(peer) {
                Some(Link::Tcp(t)) => t
                    .inject_garbage()
                    .map_err(|e| CommError::invalid(format!("inject: {e}"))),
                _ => Err(CommError::invalid(format!("no TCP link to rank {peer}"))),
            }
        })
    }
}
