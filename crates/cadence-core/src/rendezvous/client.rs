//! [`StoreClient`]: one connection to a [`super::StoreServer`], shared by
//! the threads of a process (requests take turns).

use super::wire::{self, Op, Status, GREETING};
use super::{Store, StoreError};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long past a request's own wait the client waits for the answer
/// before it calls the server unreachable.
const ANSWER_GRACE: Duration = Duration::from_secs(5);
/// While the server does not listen yet, how often to say so (at INFO).
const WAIT_NOTICE: Duration = Duration::from_secs(5);

pub struct StoreClient {
    /// As the user named it (`host:port`), for messages.
    name: String,
    addr: SocketAddr,
    /// Shared by the handles of [`StoreClient::with_timeout`]: one
    /// connection per process (the store's server holds one per rank).
    conn: Arc<Mutex<Option<TcpStream>>>,
    /// How long a request may wait (a `get` for its key).
    timeout: Mutex<Duration>,
}

impl StoreClient {
    /// Connects to the server at `host:port`, retrying until it listens or
    /// `timeout` passes. `log`: a prefix for the INFO lines that say it is
    /// still waiting (None: quiet).
    pub fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
        log: Option<&str>,
    ) -> Result<StoreClient, StoreError> {
        let name = format!("{host}:{port}");
        let unreachable = |detail: String| StoreError::Unreachable {
            addr: name.clone(),
            detail,
        };
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|e| unreachable(format!("cannot be resolved ({e})")))?
            .find(SocketAddr::is_ipv4)
            .or_else(|| (host, port).to_socket_addrs().ok()?.next())
            .ok_or_else(|| unreachable("has no address".into()))?;
        let c = StoreClient {
            name,
            addr,
            conn: Arc::new(Mutex::new(None)),
            timeout: Mutex::new(timeout),
        };
        let stream = c.open(Instant::now() + timeout, log)?;
        *c.conn.lock().unwrap() = Some(stream);
        Ok(c)
    }

    /// Another handle on the same connection with its own timeout (the
    /// watchdog's: its requests are short, and it must not wait long). The
    /// requests of all handles take turns.
    pub fn with_timeout(&self, timeout: Duration) -> StoreClient {
        StoreClient {
            name: self.name.clone(),
            addr: self.addr,
            conn: self.conn.clone(),
            timeout: Mutex::new(timeout),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap()
    }
    pub fn set_timeout(&self, t: Duration) {
        *self.timeout.lock().unwrap() = t;
    }

    fn open(&self, deadline: Instant, log: Option<&str>) -> Result<TcpStream, StoreError> {
        let started = Instant::now();
        let mut next_notice = started + WAIT_NOTICE;
        // Every rank but the server's may start first: look again soon,
        // then less often (a thousand ranks each trying every 2 ms would
        // be a storm of refused connections).
        let mut pause = Duration::from_millis(2);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = TcpStream::connect_timeout(
                &self.addr,
                left.clamp(Duration::from_millis(10), Duration::from_secs(5)),
            )
            .and_then(|mut s| {
                s.set_nodelay(true)?;
                // Something that is not a store may never answer.
                s.set_read_timeout(Some(
                    left.clamp(Duration::from_millis(100), Duration::from_secs(10)),
                ))?;
                s.write_all(GREETING)?;
                let mut g = [0u8; GREETING.len()];
                s.read_exact(&mut g)?;
                if &g != GREETING {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "it does not speak the cadence store protocol",
                    ));
                }
                s.set_read_timeout(None)?;
                Ok(s)
            });
            match attempt {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(StoreError::Protocol(format!("{}: {e}", self.name)))
                }
                // Connected, but closed without a greeting (a store never
                // does), or none came in time.
                Err(e)
                    if e.kind() == std::io::ErrorKind::UnexpectedEof
                        || (matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) && Instant::now() >= deadline) =>
                {
                    return Err(StoreError::Protocol(format!(
                        "{}: it does not speak the cadence store protocol ({e})",
                        self.name
                    )))
                }
                Err(e) => {
                    if Instant::now() >= deadline {
                        return Err(StoreError::Unreachable {
                            addr: self.name.clone(),
                            detail: format!(
                                "did not answer within {:.1}s ({e})",
                                started.elapsed().as_secs_f64()
                            ),
                        });
                    }
                    if let Some(prefix) = log {
                        if Instant::now() >= next_notice {
                            stderr_line!(
                                "{prefix}: INFO waiting {:.0}s for the Store at {} ({e})",
                                started.elapsed().as_secs_f64(),
                                self.name
                            );
                            next_notice += WAIT_NOTICE;
                        }
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// One request; its answer's status and fields. A broken connection is
    /// opened again once, for the next request.
    fn request(
        &self,
        op: Op,
        fields: &[&[u8]],
        wait: Duration,
    ) -> Result<(Status, Vec<Vec<u8>>), StoreError> {
        let mut guard = self.conn.lock().unwrap();
        if guard.is_none() {
            *guard = Some(self.open(Instant::now() + Duration::from_secs(5), None)?);
        }
        let sock = guard.as_mut().expect("opened above");
        let ms = wait.as_millis().min(u32::MAX as u128) as u32;
        let mut head = [0u8; 5];
        head[0] = op as u8;
        head[1..].copy_from_slice(&ms.to_le_bytes());
        let answer = (|| -> Result<(u8, Vec<Vec<u8>>), wire::ReadError> {
            sock.set_read_timeout(Some(wait + ANSWER_GRACE))
                .map_err(wire::ReadError::Io)?;
            wire::write_message(sock, &head, fields).map_err(wire::ReadError::Io)?;
            let mut status = [0u8; 1];
            sock.read_exact(&mut status)?;
            let out = wire::read_fields(sock)?;
            Ok((status[0], out))
        })();
        match answer {
            Ok((s, out)) => match s {
                0 => Ok((Status::Ok, out)),
                1 => Ok((Status::Timeout, out)),
                2 => {
                    let why = out.first().map(|m| String::from_utf8_lossy(m).into_owned());
                    Err(StoreError::Protocol(why.unwrap_or_default()))
                }
                s => {
                    *guard = None;
                    Err(StoreError::Protocol(format!(
                        "status {s} from {}",
                        self.name
                    )))
                }
            },
            Err(e) => {
                *guard = None;
                Err(e.into_store_error(&self.name))
            }
        }
    }

    fn ok(
        &self,
        op: Op,
        fields: &[&[u8]],
        key: &str,
        wait: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        match self.request(op, fields, wait)? {
            (Status::Ok, out) => Ok(out),
            _ => Err(StoreError::Timeout {
                key: key.to_string(),
                secs: wait.as_secs_f64(),
            }),
        }
    }

    fn field(out: Vec<Vec<u8>>, what: &str) -> Result<Vec<u8>, StoreError> {
        out.into_iter()
            .next()
            .ok_or_else(|| StoreError::Protocol(format!("{what}: answer without a value")))
    }

    /// Waits (the client's timeout) for every key to be set.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let f: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        self.ok(Op::Wait, &f, keys.first().copied().unwrap_or(""), timeout)
            .map(drop)
    }
    /// Adds `delta` to the counter at `key` (missing: 0) and returns it.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let d = delta.to_le_bytes();
        let v = Self::field(
            self.ok(Op::Add, &[key.as_bytes(), &d], key, Duration::ZERO)?,
            "add",
        )?;
        let b: [u8; 8] = v
            .try_into()
            .map_err(|_| StoreError::Protocol("add: not an 8-byte counter".into()))?;
        Ok(i64::from_le_bytes(b))
    }
    /// Whether every key is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let f: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let v = Self::field(self.ok(Op::Check, &f, "", Duration::ZERO)?, "check")?;
        Ok(v.first() == Some(&1))
    }
    /// Sets `key` to `desired` if it holds `expected` (missing matches an
    /// empty `expected`); returns what it holds afterwards.
    pub fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        Self::field(
            self.ok(
                Op::CompareSet,
                &[key.as_bytes(), expected, desired],
                key,
                Duration::ZERO,
            )?,
            "compare_set",
        )
    }
    /// Removes `key`; whether it was there.
    pub fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let v = Self::field(
            self.ok(Op::Delete, &[key.as_bytes()], key, Duration::ZERO)?,
            "delete",
        )?;
        Ok(v.first() == Some(&1))
    }
    /// How many keys the store holds.
    pub fn num_keys(&self) -> Result<u64, StoreError> {
        let v = Self::field(self.ok(Op::NumKeys, &[], "", Duration::ZERO)?, "num_keys")?;
        let b: [u8; 8] = v
            .try_into()
            .map_err(|_| StoreError::Protocol("num_keys: not an 8-byte count".into()))?;
        Ok(u64::from_le_bytes(b))
    }
}

impl Store for StoreClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.ok(Op::Set, &[key.as_bytes(), value], key, Duration::ZERO)
            .map(drop)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        Self::field(self.ok(Op::Get, &[key.as_bytes()], key, timeout)?, "get")
    }
}
