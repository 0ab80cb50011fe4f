//! The simulator (docs/simulator.md): cadence's own schedules, as the generators
//! build them and the selection code chooses them, run on a model of a
//! cluster instead of a network.
//!
//! - [`spec`]: cluster specs (hosts, NICs, fabric, costs) and topology
//!   files, read into a [`exec::Model`].
//! - [`flows`]: the network model: concurrent messages share links by
//!   max-min fairness, rates recomputed only where a flow starts or ends,
//!   time jumping from one completion to the next.
//! - [`exec`]: every rank's phases as the engine runs them (look-ahead,
//!   channel order, eager and rendezvous transfers, γ for local steps and
//!   reducing receives) over the model.
//! - [`run`]: one collective at one size on a model, with `auto` chosen by
//!   the library's own selection (what `cadence sim` calls).
//! - [`dumps`]: the library's calls on a model with a fault injected, and
//!   the dumps its ranks would leave (`cadence sim --records`), for
//!   `cadence doctor`.
//! - [`windows`]: the same run cut into windows of simulated time, and the
//!   record each rank would publish per window to the live slowness judge.

pub mod dumps;
pub mod exec;
pub mod flows;
pub mod run;
pub mod spec;
pub mod windows;

#[cfg(test)]
mod windows_tests;

/// `f(r)` for every rank r < n, in parallel over the machine's cores (a
/// dump or window record a rank: thousands of them).
pub(crate) fn per_rank<T: Send + Default + Clone>(
    n: usize,
    f: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let workers = std::thread::available_parallelism()
        .map_or(1, |w| w.get())
        .clamp(1, n.max(1));
    let per = n.div_ceil(workers).max(1);
    let f = &f;
    std::thread::scope(|s| {
        for (w, part) in out.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (i, slot) in part.iter_mut().enumerate() {
                    *slot = f(w * per + i);
                }
            });
        }
    });
    out
}
