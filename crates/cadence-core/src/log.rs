//! Lines to stderr, each written whole.
//!
//! `eprintln!` hands stderr (unbuffered) one piece of the formatted line at
//! a time, so another thread's output can land in the middle of it: a
//! progress thread's error then splits the application's own line (the
//! soak's rank events, a training script's logs), and tools that read
//! either line by line lose it. [`stderr_line!`] formats the line first and
//! writes it in one call: one `write` on a pipe, atomic up to PIPE_BUF
//! (4 KiB on Linux).

use std::io::Write;

/// Writes `line` and a newline to stderr in one write. An error (a closed
/// stderr) is ignored: a log line must not fail an operation, where
/// `eprintln!` would panic.
pub fn write_stderr_line(mut line: String) {
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `eprintln!`, written whole (see the module comment).
macro_rules! stderr_line {
    ($($arg:tt)*) => {
        $crate::log::write_stderr_line(format!($($arg)*))
    };
}
