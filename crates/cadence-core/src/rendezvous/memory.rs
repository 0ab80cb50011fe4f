//! [`MemoryStore`]: a store for threads of one process (the in-process
//! harness, tests), counting each handle's operations.

use super::{Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Shared {
    values: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

/// One handle on a shared table; [`MemoryStore::handle`] makes another
/// with its own count (one per rank).
#[derive(Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
    ops: AtomicUsize,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
    /// Another handle on the same table, counting from 0.
    pub fn handle(&self) -> MemoryStore {
        MemoryStore {
            shared: self.shared.clone(),
            ops: AtomicUsize::new(0),
        }
    }
    /// Operations made through this handle.
    pub fn ops(&self) -> usize {
        self.ops.load(Ordering::Relaxed)
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.shared
            .values
            .lock()
            .unwrap()
            .insert(key.to_string(), value.to_vec());
        self.shared.changed.notify_all();
        Ok(())
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + timeout;
        let mut v = self.shared.values.lock().unwrap();
        loop {
            if let Some(x) = v.get(key) {
                return Ok(x.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::Timeout {
                    key: key.to_string(),
                    secs: timeout.as_secs_f64(),
                });
            }
            v = self.shared.changed.wait_timeout(v, left).unwrap().0;
        }
    }
}
