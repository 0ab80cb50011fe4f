//! The path keeper: with several paths to some peer, a thread that does the
//! links' background work while no operation runs.

use super::Comm;
use std::sync::Arc;
use std::time::Duration;

/// How often the path keeper looks at the links (see
/// [`Comm::start_path_keeper`]).
const KEEP_PATHS_EVERY: Duration = Duration::from_millis(5);

impl Comm {
    /// With several paths to some peer: a thread that does the links'
    /// background work (path checks, chunks sent again, failback) while no
    /// operation runs, so that a rank computing between collectives, or
    /// done with them, still delivers what a failed path held (its peer may
    /// be waiting for it) and finds a path that came back. It takes the
    /// engine only when it is free (`try_lock`: an operation in progress
    /// does this work itself), and ends with the communicator. A link left
    /// with no path fails the communicator as an operation would.
    pub(crate) fn start_path_keeper(&self) {
        if !self.shared.inner.lock().unwrap().engine.multipath() {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        let _ = std::thread::Builder::new()
            .name(format!("cadence-paths-{}", self.shared.rank))
            .spawn(move || loop {
                std::thread::sleep(KEEP_PATHS_EVERY);
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                if shared.cancel.reason().is_some() {
                    return;
                }
                let Ok(mut inner) = shared.inner.try_lock() else {
                    continue;
                };
                // Shared links: only while no operation holds or waits
                // for them.
                let lent = shared
                    .share
                    .get()
                    .map(|s| (s, s.lend_if_idle(&mut inner.engine)));
                let r = match &lent {
                    Some((_, None)) => Ok(false),
                    _ => inner.engine.maintain_links(),
                };
                if let Some((s, Some(t))) = &lent {
                    s.give_back(&mut inner.engine, t);
                }
                if let Err(e) = r {
                    shared.cancel.set(e);
                    return;
                }
            });
    }
}
