//! Transports move messages between two ranks. Every transport implements the
//! same small interface ([`Link`]): progress a send, progress a receive, say
//! what to wait on when idle. The engine never blocks inside a transport; it
//! calls `*_progress` until the transfer is done and backs off when nothing
//! moved.
//!
//! Terms: a **message** is what one schedule `Send` step transfers (possibly 0
//! bytes: it still carries its header, which is how barriers signal). A message
//! travels as one or more **frames** (shm: one per slot; TCP: one per chunk,
//! see `tcp/`), each led by a [`WireHeader`] so that the receiver checks, before
//! touching data, that the sender is running the same operation with the same
//! arguments.
//!
//! Files: `wire.rs` (the header and the notices), `job.rs` (a transfer as a
//! link sees it), `counters.rs`, `link.rs` (the interface); one folder per
//! transport (`shm/`, `tcp/`), and `handshake.rs` (how a TCP stream proves it
//! belongs to the job).

mod counters;
pub mod handshake;
mod job;
mod link;
pub mod shm;
pub mod tcp;
mod wire;

pub use counters::*;
pub use job::*;
pub use link::*;
pub use tcp::setup as tcp_setup;
pub use wire::*;
