//! The store's protocol: after a greeting each way, a request is one
//! operation with its fields, answered by a status and fields. Every field
//! is length-prefixed and bounded, so garbage or a stranger ends its own
//! connection and nothing else.
//!
//! ```text
//! greeting  GREETING (both ways, once)
//! request   op:u8  timeout_ms:u32  nfields:u16  { len:u32 bytes }*
//! reply     status:u8  nfields:u16  { len:u32 bytes }*
//! ```

use super::StoreError;
use std::io::{Read, Write};

/// Sent first by both sides: the protocol and its version.
pub const GREETING: &[u8; 16] = b"cadence-store/1\n";
/// The longest key.
pub const MAX_KEY: usize = 4096;
/// The largest value (a peer table of a very large job fits).
pub const MAX_VALUE: usize = 256 << 20;
/// The most fields of one message (keys of a `check`).
pub const MAX_FIELDS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Set = 1,
    Get = 2,
    Add = 3,
    Check = 4,
    CompareSet = 5,
    Delete = 6,
    Wait = 7,
    NumKeys = 8,
}

impl Op {
    pub fn from_u8(b: u8) -> Option<Op> {
        use Op::*;
        [Set, Get, Add, Check, CompareSet, Delete, Wait, NumKeys]
            .into_iter()
            .find(|o| *o as u8 == b)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    Timeout = 1,
    Refused = 2,
}

pub fn write_message(w: &mut impl Write, head: &[u8], fields: &[&[u8]]) -> std::io::Result<()> {
    let mut buf =
        Vec::with_capacity(head.len() + 2 + fields.iter().map(|f| 4 + f.len()).sum::<usize>());
    buf.extend_from_slice(head);
    buf.extend_from_slice(&(fields.len() as u16).to_le_bytes());
    for f in fields {
        buf.extend_from_slice(&(f.len() as u32).to_le_bytes());
        buf.extend_from_slice(f);
    }
    w.write_all(&buf)
}

/// Reads `nfields` and the fields that follow, within the limits.
pub fn read_fields(r: &mut impl Read) -> Result<Vec<Vec<u8>>, ReadError> {
    let mut n = [0u8; 2];
    r.read_exact(&mut n)?;
    let n = u16::from_le_bytes(n) as usize;
    if n > MAX_FIELDS {
        return Err(ReadError::Bad(format!("{n} fields (at most {MAX_FIELDS})")));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut len = [0u8; 4];
        r.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_VALUE {
            return Err(ReadError::Bad(format!("a field of {len} bytes")));
        }
        let mut f = vec![0u8; len];
        r.read_exact(&mut f)?;
        out.push(f);
    }
    Ok(out)
}

/// A request as it arrived: its operation byte, timeout and fields.
pub struct Request {
    pub op: u8,
    pub timeout_ms: u32,
    pub fields: Vec<Vec<u8>>,
}

/// Reads a request from the front of `buf` without blocking: `Ok(None)`
/// while it is incomplete, else the request and the bytes it took. `Err`:
/// it breaks the limits (the connection is then refused).
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, String> {
    let word = |at: usize, n: usize| buf.get(at..at + n);
    let Some(head) = word(0, 7) else {
        return Ok(None);
    };
    let nfields = u16::from_le_bytes([head[5], head[6]]) as usize;
    if nfields > MAX_FIELDS {
        return Err(format!("{nfields} fields (at most {MAX_FIELDS})"));
    }
    // The lengths first: a field over the limit is refused before its
    // bytes come.
    let mut at = 7;
    let mut spans = Vec::with_capacity(nfields);
    for _ in 0..nfields {
        let Some(len) = word(at, 4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        if len > MAX_VALUE {
            return Err(format!("a field of {len} bytes"));
        }
        spans.push((at + 4, len));
        at += 4 + len;
        if at > buf.len() {
            // Not all of this field yet; its successors' lengths are
            // behind it.
            return Ok(None);
        }
    }
    let fields = spans
        .into_iter()
        .map(|(from, len)| buf[from..from + len].to_vec())
        .collect();
    let request = Request {
        op: head[0],
        timeout_ms: u32::from_le_bytes([head[1], head[2], head[3], head[4]]),
        fields,
    };
    Ok(Some((request, at)))
}

pub enum ReadError {
    Io(std::io::Error),
    Bad(String),
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

impl ReadError {
    pub fn into_store_error(self, addr: &str) -> StoreError {
        match self {
            ReadError::Io(e) => StoreError::Unreachable {
                addr: addr.to_string(),
                detail: format!("stopped answering ({e})"),
            },
            ReadError::Bad(m) => StoreError::Protocol(m),
        }
    }
}

/// A key as text, refusing what is not UTF-8 or too long.
pub fn key_of(b: &[u8]) -> Result<String, String> {
    if b.len() > MAX_KEY {
        return Err(format!("a key of {} bytes (at most {MAX_KEY})", b.len()));
    }
    String::from_utf8(b.to_vec()).map_err(|_| "a key that is not UTF-8".to_string())
}
