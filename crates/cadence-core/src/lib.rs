//! cadence-core: the Rust core of the cadence collective communication library.
//!
//! Layers, bottom up: [`types`] (vocabulary), [`copy`] (byte copies that stay
//! fast at any alignment), [`reduce`] (element-wise reductions), [`schedule`]
//! (algorithms as per-rank plans, plus their verifier),
//! [`transport`] (shared memory and TCP links), [`engine`] (runs schedules
//! with deadlines), [`monitor`] (always-on operation records), [`comm`] (the
//! communicator that ties them together), [`config`] (`CADENCE_*` variables),
//! [`choice`] (which algorithm a call runs: `CADENCE_ALGO`, tuning tables,
//! the cost model, the size table), [`fabric`] (the network between
//! hosts: measured model and path finder), [`sim`] (schedules run on a model
//! of a cluster).

#[macro_use]
mod log;

pub mod choice;
pub mod comm;
pub mod config;
pub mod copy;
pub mod engine;
pub mod error;
pub mod fabric;
pub mod monitor;
pub mod reduce;
pub mod rendezvous;
pub mod schedule;
pub mod sim;
pub mod transport;
pub mod types;

pub use comm::{Bootstrap, Comm, Completion, OpRequest, PeerInfo};
pub use config::Config;
pub use error::{CommError, ErrorKind};
pub use transport::handshake::JobSecret;
pub use types::{CollKind, DType, RedOp};
