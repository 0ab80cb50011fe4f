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

pub mod exec;
pub mod flows;
pub mod run;
pub mod spec;
