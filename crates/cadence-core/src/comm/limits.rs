//! Process limits a large job needs: the open-file soft limit.
//!
//! A rank holds a socket per stream of every link it uses; a job of
//! thousands of ranks can need more than the common default soft limit of
//! 1,024 open files. The soft limit may be raised to the hard one without
//! privilege, as NCCL does at init: once per process.

use crate::config::DebugLevel;
use std::sync::Once;

static RAISED: Once = Once::new();

/// Raises `RLIMIT_NOFILE`'s soft limit to its hard limit (once per
/// process), saying so at INFO.
pub fn raise_open_files(debug: DebugLevel) {
    RAISED.call_once(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return;
        }
        if lim.rlim_cur >= lim.rlim_max {
            return;
        }
        let was = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads the struct; raising the soft limit up to
        // the hard one needs no privilege.
        let ok = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0;
        if debug >= DebugLevel::Info {
            if ok {
                stderr_line!(
                    "cadence pid {}: INFO raised the open-file limit from {was} to {} (the hard \
                     limit)",
                    std::process::id(),
                    lim.rlim_max
                );
            } else {
                stderr_line!(
                    "cadence pid {}: INFO could not raise the open-file limit from {was}",
                    std::process::id()
                );
            }
        }
    });
}

/// The open-file soft limit now (None if it cannot be read).
pub fn open_files_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim.rlim_cur)
}
