//! The simulator (issue 15): cadence's own schedules, as the generators
//! build them, run on a model of a cluster instead of a network.
//!
//! Built so far: [`flows`], the network model (concurrent messages share
//! links by max-min fairness, time jumps from one completion to the next),
//! and [`exec`], which walks every rank's phases (rendezvous transfers
//! matched in channel order, local steps and reducing receives costed by
//! γ) over a [`exec::Model`] of hosts, NICs and rack uplinks. Still to come
//! (issue 15's note says in what order): topology specs, the engine's
//! one-phase look-ahead, costs from calibration, `cadence sim` and its
//! validation against the emulated cluster, and speed at 1024+ ranks.

pub mod exec;
pub mod flows;
