//! Rendezvous: how ranks find each other before any link exists.
//!
//! A [`Store`] is a key-value service every rank reaches (NCCL's bootstrap
//! root, torch's TCPStore). Cadence asks it for O(1) operations per rank:
//! each rank publishes where it listens for the peer-table exchange and
//! reads where its ring successor does; the ranks then complete the table
//! among themselves (`comm/gather.rs`), so the store serves O(n) requests
//! in all, not n².
//!
//! The core brings its own store ([`StoreServer`], served by rank 0 at
//! `MASTER_ADDR:MASTER_PORT`, and [`StoreClient`]), so that a job starts
//! without torch; a torch Store handed to `cadence.init` is used through the
//! same trait (the bindings adapt it). [`MemoryStore`] serves threads of one
//! process (the in-process harness) and counts each caller's operations.

mod client;
mod memory;
mod server;
mod table;
mod wire;

pub use client::StoreClient;
pub use memory::MemoryStore;
pub use server::StoreServer;

use std::time::Duration;
use thiserror::Error;

/// Why a store operation failed.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum StoreError {
    /// The key did not appear within the wait.
    #[error("timed out after {secs:.1}s waiting for key {key:?}")]
    Timeout { key: String, secs: f64 },
    /// The store could not be reached, or stopped answering.
    #[error("the Store at {addr} {detail}")]
    Unreachable { addr: String, detail: String },
    /// Something answered that does not speak the store's protocol, or a
    /// request broke a limit.
    #[error("Store protocol: {0}")]
    Protocol(String),
}

/// The operations the bootstrap needs of a key-value store. Values are
/// bytes; a key, once set, is never unset by the bootstrap.
pub trait Store: Send + Sync {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError>;
}
