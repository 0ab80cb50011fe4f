//! The engine's tuning constants, each with the reason for its value. The
//! policies that use them are described where they are applied: waiting in
//! `wait.rs`, records in `evidence.rs`.

use std::time::Duration;

/// Ranks per core up to which messages may stream ([`super::prefers_stream`]):
/// a streamed message moves only while its sender and receiver both run,
/// which ranks crowding the cores make rare.
pub(super) const STREAM_RANKS_PER_CORE: usize = 2;

/// How long a wait spins before yielding, and yields before sleeping, when
/// every rank of this host has a core of its own: a peer on another core
/// answers in well under the spin.
pub(super) const SPIN: Duration = Duration::from_micros(50);
pub(super) const YIELD: Duration = Duration::from_millis(2);

/// When ranks outnumber cores no wait spins at all: every microsecond spun
/// is core time the awaited rank cannot have.
pub(super) const SPIN_OVERSUBSCRIBED: Duration = Duration::ZERO;
/// ... and it soon sleeps: a sleeping rank leaves its core's run queue, so
/// the scheduler can move the awaited rank onto it (yielding alone does not).
pub(super) const YIELD_OVERSUBSCRIBED: Duration = Duration::from_micros(50);
/// Small rooted collectives (below [`ROOTED_SMALL`] bytes) keep yielding as
/// long as when ranks have cores: the root is the bottleneck, and every rank
/// that sleeps makes it pay a futex wake a call.
pub(super) const YIELD_ROOTED_OVERSUBSCRIBED: Duration = YIELD;
/// Above this a rooted call's waits are for data in flight, where sleeping
/// early leaves the core to a rank with work.
pub(super) const ROOTED_SMALL: u64 = 32 << 10;

/// A yield that takes this long lost the core for a scheduler slice to a
/// task that is not a peer (a peer hands it back as soon as it waits).
pub(super) const YIELD_LOST_MIN: Duration = Duration::from_micros(500);
/// Where a spin budget cut to nothing grows back from (doubling each wait).
pub(super) const SPIN_REGROW: Duration = Duration::from_micros(1);

/// How long one sleep lasts when only sockets can wake it (poll(2)), or only
/// the doorbell can: the wait's own checks (deadline, abort notice, dead
/// peers) and a missed wake-up come this late at worst.
pub(super) const NAP: Duration = Duration::from_millis(5);
/// Ranks per core up to which a sleep lasts [`NAP`]; past it a sleep lasts
/// longer in proportion, up to [`NAP_MAX`]: a thousand ranks on two cores
/// that each woke every `NAP` would spend the cores on waking (the kernel
/// wakes a sleeper when its data arrives or its doorbell rings, so a longer
/// nap only delays the wait's own checks: deadline, abort, dead peers).
pub(super) const NAP_RANKS_PER_CORE: usize = 4;
pub(super) const NAP_MAX: Duration = Duration::from_secs(1);
/// How long a doorbell sleep lasts while sockets are pending too: their
/// data cannot ring the doorbell, so they are polled again soon.
pub(super) const NAP_MIXED: Duration = Duration::from_micros(200);
/// How long a wait on shared memory sleeps without an inbox to block on.
pub(super) const NAP_NO_INBOX: Duration = Duration::from_micros(20);

/// How often a long wait checks that same-host peers are still alive (a
/// system call per peer and a read of /proc), scaled as the naps are when
/// ranks crowd the cores (up to [`NAP_MAX`]).
pub(super) const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// How often links with several paths get their background work done.
pub(super) const MAINTAIN_EVERY: Duration = Duration::from_millis(1);

/// How often a long wait asks its [`super::InterruptCheck`]: calling it costs a
/// GIL acquisition from Python, too much for every round of a short wait.
pub const INTERRUPT_EVERY: Duration = Duration::from_millis(100);

/// How long a wait lasts before the engine publishes a snapshot of the
/// operation's messages, and how often it does while the wait goes on.
pub const SNAPSHOT_AFTER: Duration = Duration::from_millis(50);
pub const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);
/// Idle rounds between looks at the clock for snapshots (a round of the
/// spin stage costs well under a microsecond; one of the sleep stage up
/// to a few milliseconds).
pub(super) const SNAPSHOT_CHECK_ROUNDS: u32 = 16;
/// Idle rounds an operation waits before its transfers are stamped with
/// times (see [`super::Evidence`]): a few µs of spinning when ranks have cores of
/// their own; fewer when they share cores (or nobody waits for the
/// progress thread), where rounds soon take a yield or a nap each.
pub const STAMP_AFTER_IDLE: u32 = 64;
pub const STAMP_AFTER_IDLE_SHARED: u32 = 8;
