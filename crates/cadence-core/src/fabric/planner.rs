//! The client of the cluster's path planner (`cadence planner`, C4P:
//! docs/traffic.md): before a rank dials a peer over TCP it asks which
//! source ports put each stream of the link on the spine the planner chose
//! for it, and binds them. The planner's protocol is JSON lines
//! (`python/cadence/planner/protocol.py`); one connection per communicator
//! and rank is its lease, closed with the communicator.
//!
//! The planner is advice: when it cannot be reached, answers late or
//! refuses, the rank says so once and dials as before (the fabric's ECMP
//! picks the paths). A job never fails because of it.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// How long a rank waits for the planner at most, per request: a dial
/// waits for it (it is on the way to the link's first message).
pub const ANSWER_WITHIN: Duration = Duration::from_millis(500);

/// Where the planner listens and the cluster's token
/// (`CADENCE_PLANNER`, `CADENCE_PLANNER_TOKEN_FILE`).
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerAddr {
    pub address: String,
    pub token_file: String,
}

trait Conn: std::io::Read + Write + Send {}
impl<T: std::io::Read + Write + Send> Conn for T {}

/// One lease with the planner, and the ports it planned per link.
pub struct Planner {
    conn: BufReader<Box<dyn Conn>>,
    token: String,
    /// Per (peer, path): per stream, its source ports (best first; empty:
    /// the stream stays inside a rack, any port does).
    planned: HashMap<(usize, usize), Vec<Vec<u16>>>,
}

impl Planner {
    /// Opens the lease of `job` (the communicator and rank).
    pub fn connect(at: &PlannerAddr, job: &str) -> Result<Planner, String> {
        let token = std::fs::read_to_string(&at.token_file)
            .map_err(|e| format!("cannot read its token {}: {e}", at.token_file))?
            .trim()
            .to_string();
        let conn: Box<dyn Conn> = if let Some(path) = at.address.strip_prefix("unix:") {
            let s = UnixStream::connect(path).map_err(|e| format!("{}: {e}", at.address))?;
            s.set_read_timeout(Some(ANSWER_WITHIN)).ok();
            s.set_write_timeout(Some(ANSWER_WITHIN)).ok();
            Box::new(s)
        } else if let Some(hp) = at.address.strip_prefix("tcp:") {
            let addr: SocketAddr = hp
                .parse()
                .map_err(|_| format!("{}: not tcp:IP:PORT", at.address))?;
            let s = TcpStream::connect_timeout(&addr, ANSWER_WITHIN)
                .map_err(|e| format!("{}: {e}", at.address))?;
            s.set_read_timeout(Some(ANSWER_WITHIN)).ok();
            s.set_write_timeout(Some(ANSWER_WITHIN)).ok();
            Box::new(s)
        } else {
            return Err(format!(
                "CADENCE_PLANNER={:?}: expected unix:PATH or tcp:IP:PORT",
                at.address
            ));
        };
        let mut p = Planner {
            conn: BufReader::new(conn),
            token,
            planned: HashMap::new(),
        };
        p.request(json!({"op": "hello", "job": job}))?;
        Ok(p)
    }

    /// The source ports of each of `streams` streams from `src` to `dst`
    /// (the link to `peer` on path `path`), asked once per link; `bulk`:
    /// the link carries bulk data (weight 1 in the planner's balance, else
    /// 0: placed, not counted).
    pub fn ports(
        &mut self,
        peer: usize,
        path: usize,
        src: SocketAddr,
        dst: SocketAddr,
        streams: usize,
        bulk: bool,
    ) -> Result<&[Vec<u16>], String> {
        if !self.planned.contains_key(&(peer, path)) {
            let answer = self.request(json!({"op": "plan", "connections": [{
                "id": format!("{peer}/{path}"), "src": src.ip().to_string(),
                "dst": dst.ip().to_string(), "dport": dst.port(), "streams": streams,
                "weight": u8::from(bulk),
            }]}))?;
            let ports = parse_ports(&answer, streams)?;
            self.planned.insert((peer, path), ports);
        }
        Ok(&self.planned[&(peer, path)])
    }

    fn request(&mut self, mut req: Value) -> Result<Value, String> {
        req["v"] = json!(1);
        req["token"] = json!(self.token);
        let mut line = req.to_string();
        line.push('\n');
        let io = |e: std::io::Error| format!("no answer: {e}");
        self.conn.get_mut().write_all(line.as_bytes()).map_err(io)?;
        loop {
            let mut got = String::new();
            if self.conn.read_line(&mut got).map_err(io)? == 0 {
                return Err("it closed the connection".into());
            }
            let msg: Value =
                serde_json::from_str(&got).map_err(|e| format!("garbage answer: {e}"))?;
            if msg.get("event").is_some() {
                continue; // link events: not acted on yet (docs/traffic.md)
            }
            if msg["ok"] != json!(true) {
                return Err(format!(
                    "refused: {}",
                    msg["error"].as_str().unwrap_or("no reason given")
                ));
            }
            return Ok(msg);
        }
    }
}

/// Per stream, its ports, from a plan's answer of one connection.
fn parse_ports(answer: &Value, streams: usize) -> Result<Vec<Vec<u16>>, String> {
    let bad = || format!("a plan that is not {streams} streams: {answer}");
    let got = answer["paths"][0]["streams"].as_array().ok_or_else(bad)?;
    if got.len() != streams {
        return Err(bad());
    }
    got.iter()
        .map(|s| match &s["sports"] {
            Value::Array(ps) => ps
                .iter()
                .map(|p| {
                    p.as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .ok_or_else(bad)
                })
                .collect(),
            _ => Err(bad()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plans_ports_are_read_per_stream_and_a_short_plan_is_refused() {
        let answer = json!({"ok": true, "paths": [{"id": "1/0", "streams": [
            {"spine": 0, "sports": [20001, 20002]}, {"spine": null, "sports": []}]}]});
        assert_eq!(
            parse_ports(&answer, 2).unwrap(),
            vec![vec![20001, 20002], vec![]]
        );
        assert!(parse_ports(&answer, 3).is_err());
        let bad = json!({"ok": true, "paths": [{"streams": [{"sports": [70000]}]}]});
        assert!(parse_ports(&bad, 1).is_err());
    }

    #[test]
    fn an_unreachable_planner_is_an_error_not_a_wait() {
        let dir = std::env::temp_dir().join(format!("cadence-planner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "t\n").unwrap();
        let at = PlannerAddr {
            address: format!("unix:{}", dir.join("none.sock").display()),
            token_file: token.display().to_string(),
        };
        let t = std::time::Instant::now();
        assert!(Planner::connect(&at, "job").is_err());
        assert!(t.elapsed() < Duration::from_secs(2));
        let odd = PlannerAddr {
            address: "http://x".into(),
            ..at
        };
        assert!(Planner::connect(&odd, "job")
            .err()
            .unwrap()
            .contains("unix:PATH"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
