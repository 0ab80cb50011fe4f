//! [`PeerInfo`]: what the ranks of a communicator know of each other from
//! set-up on (where each listens, which host and machine it is on, the
//! files it loaded), and its compact encoding for the peer-table exchange
//! (`gather.rs`), whose bytes per rank grow with n.

use serde::{Deserialize, Serialize};

/// What each rank tells the others at set-up.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerInfo {
    pub rank: usize,
    /// Host identity (`CADENCE_HOST`): same host = shared memory.
    pub host: String,
    /// The physical machine (its boot id). Emulated hosts (network
    /// namespaces) are different hosts on one machine: they share its cores,
    /// which decides how a rank should wait.
    #[serde(default)]
    pub machine: String,
    /// The tuning table this rank loaded (`path#hash`, empty for none):
    /// ranks that would choose algorithms differently must not start.
    #[serde(default)]
    pub tuning: String,
    /// The topology file this rank loaded (`path#hash`, empty for none,
    /// `#profile at start-up` when unset): ranks that would order rings
    /// differently must not start.
    #[serde(default)]
    pub topo: String,
    pub pid: u32,
    /// The listener of its first NIC.
    pub addr: String,
    /// One listener per NIC (`CADENCE_SOCKET_IFNAME=eth0,eth1`), the first
    /// being `addr`; empty from a rank that publishes one address only.
    #[serde(default)]
    pub addrs: Vec<String>,
}

impl PeerInfo {
    /// Where the rank listens, one address per NIC, in its NICs' order.
    pub fn nic_addrs(&self) -> Vec<&str> {
        if self.addrs.is_empty() {
            vec![self.addr.as_str()]
        } else {
            self.addrs.iter().map(String::as_str).collect()
        }
    }
}

/// Strings of a record are at most this long (a host name, a path#hash).
const MAX_STR: usize = u16::MAX as usize;

impl PeerInfo {
    /// Appends the record to `out`: little-endian numbers and strings
    /// prefixed with their u16 length.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let put = |out: &mut Vec<u8>, s: &str| {
            let b = &s.as_bytes()[..s.len().min(MAX_STR)];
            out.extend_from_slice(&(b.len() as u16).to_le_bytes());
            out.extend_from_slice(b);
        };
        out.extend_from_slice(&(self.rank as u32).to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        for s in [
            &self.host,
            &self.machine,
            &self.tuning,
            &self.topo,
            &self.addr,
        ] {
            put(out, s);
        }
        out.push(self.addrs.len().min(255) as u8);
        for a in self.addrs.iter().take(255) {
            put(out, a);
        }
    }

    /// Reads one record from the front of `b`, advancing it.
    pub fn decode(b: &mut &[u8]) -> Result<PeerInfo, String> {
        let r = Fields::read(b)?;
        Ok(PeerInfo {
            rank: r.rank,
            host: r.host.to_owned(),
            machine: r.machine.to_owned(),
            tuning: r.tuning.to_owned(),
            topo: r.topo.to_owned(),
            pid: r.pid,
            addr: r.addr.to_owned(),
            addrs: r.addrs.iter().map(|a| a.to_string()).collect(),
        })
    }

    /// Steps over one record at the front of `b`, checking only that its
    /// parts fit: the exchange finds where each record it passes on starts
    /// (n per rank in all), and reads each once, when it builds the table.
    pub fn skip(b: &mut &[u8]) -> Result<(), String> {
        fn take(b: &mut &[u8], n: usize) -> Result<(), String> {
            if b.len() < n {
                return Err("a peer record cut short".into());
            }
            *b = &b[n..];
            Ok(())
        }
        fn string(b: &mut &[u8]) -> Result<(), String> {
            let n = b.get(..2).ok_or("a peer record cut short")?;
            let n = u16::from_le_bytes([n[0], n[1]]) as usize;
            take(b, 2 + n)
        }
        take(b, 8)?; // rank, pid
        for _ in 0..5 {
            string(b)?; // host, machine, tuning, topo, addr
        }
        let naddrs = *b.first().ok_or("a peer record cut short")?;
        take(b, 1)?;
        (0..naddrs).try_for_each(|_| string(b))
    }
}

/// A record's fields, borrowed from its encoding.
pub(super) struct Fields<'a> {
    pub rank: usize,
    pub pid: u32,
    pub host: &'a str,
    pub machine: &'a str,
    pub tuning: &'a str,
    pub topo: &'a str,
    addr: &'a str,
    addrs: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    /// One address per NIC (see [`PeerInfo::nic_addrs`]).
    pub fn nic_addrs(&self) -> &[&'a str] {
        if self.addrs.is_empty() {
            std::slice::from_ref(&self.addr)
        } else {
            &self.addrs
        }
    }

    pub fn read(b: &mut &'a [u8]) -> Result<Fields<'a>, String> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
            if b.len() < n {
                return Err("a peer record cut short".into());
            }
            let (h, t) = b.split_at(n);
            *b = t;
            Ok(h)
        }
        fn u32_of(b: &mut &[u8]) -> Result<u32, String> {
            Ok(u32::from_le_bytes(take(b, 4)?.try_into().unwrap()))
        }
        fn str_of<'a>(b: &mut &'a [u8]) -> Result<&'a str, String> {
            let n = u16::from_le_bytes(take(b, 2)?.try_into().unwrap()) as usize;
            std::str::from_utf8(take(b, n)?).map_err(|_| "a peer record with bad text".into())
        }
        let rank = u32_of(b)? as usize;
        let pid = u32_of(b)?;
        let host = str_of(b)?;
        let machine = str_of(b)?;
        let tuning = str_of(b)?;
        let topo = str_of(b)?;
        let addr = str_of(b)?;
        let naddrs = take(b, 1)?[0] as usize;
        let addrs = (0..naddrs).map(|_| str_of(b)).collect::<Result<_, _>>()?;
        Ok(Fields {
            rank,
            pid,
            host,
            machine,
            tuning,
            topo,
            addr,
            addrs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_its_encoding() {
        let p = PeerInfo {
            rank: 70000,
            host: "h3".into(),
            machine: "boot-id".into(),
            tuning: String::new(),
            topo: "#profile at start-up".into(),
            pid: 4242,
            addr: "10.0.0.3:4000".into(),
            addrs: vec!["10.0.0.3:4000".into(), "10.1.0.3:4001".into()],
        };
        let mut buf = Vec::new();
        p.encode(&mut buf);
        p.encode(&mut buf);
        let mut b = buf.as_slice();
        for _ in 0..2 {
            let mut ahead = b;
            PeerInfo::skip(&mut ahead).unwrap();
            let q = PeerInfo::decode(&mut b).unwrap();
            assert_eq!(ahead.len(), b.len(), "skip steps over what decode reads");
            assert_eq!(
                serde_json::to_string(&q).unwrap(),
                serde_json::to_string(&p).unwrap()
            );
        }
        assert!(b.is_empty());
        // Every cut is refused, never misread.
        for cut in 0..buf.len() / 2 {
            let mut b = &buf[..cut];
            assert!(PeerInfo::decode(&mut b).is_err(), "cut at {cut}");
            let mut b = &buf[..cut];
            assert!(PeerInfo::skip(&mut b).is_err(), "cut at {cut}");
        }
    }
}
