//! Running every rank's schedule on a modeled cluster: the executor half of
//! the simulator.
//!
//! Semantics, as the engine runs a schedule (`engine::run_phases`):
//! - A rank runs its phases in order. Entering a phase it does the phase's
//!   local steps (`Copy`, `Reduce`: γ per byte on the rank's CPU), then
//!   **posts** the phase's transfers.
//! - **Look-ahead**: while phase p is current, phase p+1 (when it has no
//!   local steps) is admitted *held*; each of its transfers is released
//!   once no unfinished transfer of phase p writes memory it touches, or
//!   reads memory it writes (`schedule::hazard`, the rule the engine and
//!   the verifier use), and an empty one when its phase becomes current. So a sliced ring forwards slice k as
//!   soon as slice k arrived.
//! - **Channels**: the k-th `Send` from a to b is the k-th `Recv` at b from a
//!   (channel order, as on the wire), and messages on one channel leave one
//!   after another (one stream). A message leaves once its send is released
//!   and the one before it on the channel has left; a large one (over the
//!   transport's eager limit: socket buffers, shared-memory slots) waits for
//!   its receive to be released too. It is a flow over its route
//!   ([`Model::route`]) sharing links by weighted max-min fairness
//!   ([`super::flows`]), weighted by the messages its channel has ready
//!   when it leaves (TCP favours a connection that always has data), and
//!   arrives α after its last byte left (so back-to-back slices do not pay
//!   α each).
//! - Each message costs its sender's CPU a fixed overhead before it leaves,
//!   one message after another (many concurrent messages overlap their
//!   latency, not their start-up work). Where the ranks share a machine's
//!   cores ([`Model::shared_cores`]: an emulated cluster), that start-up
//!   work, at least [`Model::loaded_overhead`] a message, is shared by all
//!   the messages being started at once on the machine (processor sharing,
//!   at most one core each); with [`Model::stack_cost`] the bytes of
//!   messages between hosts cross those cores too, as a link, and each
//!   call first costs each rank [`Model::call_overhead`] of them.
//! - A receive completes when its message arrived and it is released; a
//!   reducing one also needs γ per byte of the receiver's CPU, which it
//!   spends while the bytes arrive (the engine reduces pieces as they land),
//!   one reduction at a time per rank.
//! - A phase ends when all its transfers are done; the held phase becomes
//!   current and the one after it may be admitted held.
//!
//! Not modeled: CPU contention between ranks beyond the memory link, the
//! shared cores' start-up work and their network stacks (reductions and
//! copies use a rank's own CPU), TCP slow start and retransmits, the
//! engine's wake-up costs on an idle machine (they are in α).
//!
//! The schedules are compiled to a compact form as they are built
//! ([`simulate_with`]), so 4096 ranks' schedules of thousands of phases fit
//! in memory, and time advances from event to event: the cost is per
//! message, not per byte.
//!
//! Files: `model.rs` (the cluster: hosts, NICs, groups, cores, and what
//! things cost), `compile.rs` (a rank's schedule in the compact form),
//! `channel.rs` (messages on their channels, from leaving to arriving),
//! `executor.rs` (the ranks' phases and the look-ahead, event by event),
//! `program.rs` (the entry points: calls and programs of calls),
//! `records.rs` (what a recorded run keeps per rank: calls entered and
//! finished, transfers first moved and completed or where they stood) and `fault.rs` (the
//! faults a recorded run injects: a rank that stops calling, a hung link,
//! a late rank, a slow NIC).

mod channel;
mod compile;
mod executor;
mod fault;
mod model;
mod program;
mod records;

pub use fault::Fault;
pub use model::{Model, Shaper};
pub use program::{
    simulate, simulate_calls, simulate_program, simulate_recorded, simulate_with, Outcome, Unit,
};
pub use records::{CallSpan, RankRecord, Recorded, Transfer, XferState};

#[cfg(test)]
mod records_tests;
#[cfg(test)]
mod tests;
