//! The network between hosts: a measured model of it ([`Fabric`], in
//! `model.rs`: per-pair rates plus the shared uplinks of host groups such as
//! racks) and the path finder that turns that model into the host order of
//! the widest ring or chain ([`pathfind::widest_ring`],
//! [`pathfind::widest_chain`]), so ring and chain collectives cross slow,
//! oversubscribed links as few times as possible.

pub mod file;
pub mod infer;
pub mod model;
pub mod pathfind;
pub mod planner;
pub mod probe;

pub use model::Fabric;
