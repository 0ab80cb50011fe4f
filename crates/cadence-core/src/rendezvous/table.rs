//! The store's data and its operations, without I/O: the server's loop
//! (`server.rs`) hands each request here and says the answer, or parks a
//! `get`/`wait` on the key it still lacks until a write of that key or its
//! deadline.

use super::wire::{key_of, Op, Status};
use std::collections::HashMap;

/// Keys and values.
#[derive(Default)]
pub(super) struct Table {
    values: HashMap<String, Vec<u8>>,
}

/// What a request comes to.
pub(super) enum Outcome {
    /// Answer now: a status and its fields; `wrote`: the key it set, whose
    /// waiters may now be served.
    Reply {
        status: Status,
        fields: Vec<Vec<u8>>,
        wrote: Option<String>,
    },
    /// A `get`/`wait` whose key is not there yet: asked again when it is
    /// written ([`Table::run`] with the same request), or timed out naming it.
    WaitFor(String),
}

fn reply(fields: Vec<Vec<u8>>) -> Result<Outcome, String> {
    Ok(Outcome::Reply {
        status: Status::Ok,
        fields,
        wrote: None,
    })
}

fn wrote(key: String, fields: Vec<Vec<u8>>) -> Result<Outcome, String> {
    Ok(Outcome::Reply {
        status: Status::Ok,
        fields,
        wrote: Some(key),
    })
}

impl Table {
    /// Runs one request. `Err`: it is refused (the connection then ends).
    pub(super) fn run(&mut self, op: Op, f: &[Vec<u8>]) -> Result<Outcome, String> {
        let want = |n: usize| {
            if f.len() == n {
                Ok(())
            } else {
                Err(format!("{op:?} takes {n} fields, got {}", f.len()))
            }
        };
        match op {
            Op::Set => {
                want(2)?;
                let key = key_of(&f[0])?;
                self.values.insert(key.clone(), f[1].clone());
                wrote(key, vec![])
            }
            Op::Get | Op::Wait => {
                if f.is_empty() || (op == Op::Get && f.len() != 1) {
                    return Err(format!("{op:?} with {} keys", f.len()));
                }
                for k in f {
                    let key = key_of(k)?;
                    if !self.values.contains_key(&key) {
                        return Ok(Outcome::WaitFor(key));
                    }
                }
                if op == Op::Get {
                    reply(vec![self.values[&key_of(&f[0])?].clone()])
                } else {
                    reply(vec![])
                }
            }
            Op::Add => {
                want(2)?;
                let key = key_of(&f[0])?;
                let delta = i64::from_le_bytes(
                    f[1].as_slice()
                        .try_into()
                        .map_err(|_| "Add takes an 8-byte delta".to_string())?,
                );
                // As torch's store: the counter is kept as decimal text.
                let now = match self.values.get(&key) {
                    Some(v) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.trim().parse::<i64>().ok())
                        .ok_or_else(|| format!("Add on key {key:?}, which is not a number"))?,
                    None => 0,
                }
                .wrapping_add(delta);
                self.values
                    .insert(key.clone(), now.to_string().into_bytes());
                wrote(key, vec![now.to_le_bytes().to_vec()])
            }
            Op::Check => {
                let keys = f.iter().map(|k| key_of(k)).collect::<Result<Vec<_>, _>>()?;
                let all = keys.iter().all(|k| self.values.contains_key(k));
                reply(vec![vec![all as u8]])
            }
            Op::CompareSet => {
                want(3)?;
                let key = key_of(&f[0])?;
                // As torch's: a missing key matches an empty `expected`.
                let current = self.values.get(&key).cloned();
                let matches = match &current {
                    Some(v) => *v == f[1],
                    None => f[1].is_empty(),
                };
                if matches {
                    self.values.insert(key.clone(), f[2].clone());
                    wrote(key, vec![f[2].clone()])
                } else {
                    reply(vec![current.unwrap_or_default()])
                }
            }
            Op::Delete => {
                want(1)?;
                let key = key_of(&f[0])?;
                let gone = self.values.remove(&key).is_some();
                reply(vec![vec![gone as u8]])
            }
            Op::NumKeys => {
                want(0)?;
                reply(vec![(self.values.len() as u64).to_le_bytes().to_vec()])
            }
        }
    }
}
