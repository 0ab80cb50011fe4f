//! [`PeerTable`]: every rank's record ([`PeerInfo`]), kept in memory that
//! grows by a few bytes a rank. A communicator holds the whole table for
//! its life (a split takes its members' rows), so what ranks of one host
//! share is kept once: the host's name, its machine, the files its ranks
//! loaded and its NIC addresses form a *site*; a rank keeps only its site,
//! its process id and its listening ports (8 bytes and 2 a NIC).

use super::peer_info::{Fields, PeerInfo};
use crate::schedule::Topology;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// Every rank's record, by rank.
#[derive(Clone)]
pub struct PeerTable {
    ranks: Vec<Row>,
    /// What ranks share (in practice one per host), shared by a split's
    /// tables.
    sites: Arc<Sites>,
    /// Each rank's listening port per NIC, in rank order.
    ports: Vec<u16>,
    /// Where each rank's ports start in `ports`.
    first_port: FirstPort,
}

#[derive(Clone, Copy)]
struct Row {
    site: u32,
    pid: u32,
}

/// Where rank r's ports start: r × the NICs every rank has (nothing kept
/// per rank), or, where ranks have different numbers of NICs, kept.
#[derive(Clone)]
enum FirstPort {
    Every(u32),
    At(Vec<u32>),
}

impl FirstPort {
    /// From each rank's number of ports, in rank order.
    fn of(counts: impl Iterator<Item = usize> + Clone) -> FirstPort {
        let mut all = counts.clone();
        let k = all.next().unwrap_or(0);
        if all.all(|c| c == k) {
            return FirstPort::Every(k as u32);
        }
        let mut at = 0;
        FirstPort::At(
            counts
                .map(|c| {
                    at += c as u32;
                    at - c as u32
                })
                .collect(),
        )
    }

    fn of_rank(&self, r: usize) -> usize {
        match self {
            FirstPort::Every(k) => r * *k as usize,
            FirstPort::At(at) => at[r] as usize,
        }
    }
}

#[derive(Default)]
struct Sites {
    sites: Vec<Site>,
    /// Strings, each once (host names, machine ids, file fingerprints),
    /// end to end: string i is `text[ends[i - 1]..ends[i]]`.
    text: String,
    ends: Vec<u32>,
    /// (machine, tuning, topo) as strings, each combination once: ranks of
    /// one job share one.
    files: Vec<[u32; 3]>,
    /// Addresses, one per NIC, each list once; as socket addresses of port
    /// 0, so that an IPv6 address keeps its scope (a link-local one).
    ips: Vec<SocketAddr>,
    /// Where each list of `ips` ends (list i is `ips[ips_end[i - 1]..ips_end[i]]`):
    /// one allocation for every host's, not one a host.
    ips_end: Vec<u32>,
}

/// Item `i` of a list kept end to end, by where each item ends.
fn item(ends: &[u32], i: u32) -> std::ops::Range<usize> {
    let start = if i == 0 { 0 } else { ends[i as usize - 1] };
    start as usize..ends[i as usize] as usize
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Site {
    host: u32,
    files: u32,
    ips: u32,
}

impl Sites {
    fn ip_list(&self, i: u32) -> &[SocketAddr] {
        &self.ips[item(&self.ips_end, i)]
    }

    fn text(&self, i: u32) -> &str {
        &self.text[item(&self.ends, i)]
    }
}

impl PeerTable {
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    fn site(&self, r: usize) -> Site {
        self.sites.sites[self.ranks[r].site as usize]
    }

    fn file(&self, r: usize, which: usize) -> &str {
        self.sites
            .text(self.sites.files[self.site(r).files as usize][which])
    }

    fn ips(&self, r: usize) -> &[SocketAddr] {
        self.sites.ip_list(self.site(r).ips)
    }

    /// Rank `r`'s host identity (`CADENCE_HOST`): same host, shared memory.
    pub fn host(&self, r: usize) -> &str {
        self.sites.text(self.site(r).host)
    }

    pub fn same_host(&self, a: usize, b: usize) -> bool {
        self.site(a).host == self.site(b).host
    }

    /// Rank `r`'s machine (its boot id; emulated hosts share one).
    pub fn machine(&self, r: usize) -> &str {
        self.file(r, 0)
    }

    pub fn same_machine(&self, a: usize, b: usize) -> bool {
        let files = &self.sites.files;
        files[self.site(a).files as usize][0] == files[self.site(b).files as usize][0]
    }

    /// Whether ranks `a` and `b` have the same machine, tuning table and
    /// topology file (one comparison, not three of text).
    pub fn same_files(&self, a: usize, b: usize) -> bool {
        self.site(a).files == self.site(b).files
    }

    /// The tuning table rank `r` loaded (`path#hash`, empty for none).
    pub fn tuning(&self, r: usize) -> &str {
        self.file(r, 1)
    }

    /// The topology file rank `r` loaded (see [`PeerInfo::topo`]).
    pub fn topo(&self, r: usize) -> &str {
        self.file(r, 2)
    }

    pub fn pid(&self, r: usize) -> u32 {
        self.ranks[r].pid
    }

    /// How many NICs rank `r` listens on.
    pub fn nics(&self, r: usize) -> usize {
        self.ips(r).len()
    }

    /// Where rank `r` listens on its NIC `k`.
    pub fn nic_addr(&self, r: usize, k: usize) -> SocketAddr {
        let mut a = self.ips(r)[k];
        a.set_port(self.ports[self.first_port.of_rank(r) + k]);
        a
    }

    /// Where rank `r` listens, one address per NIC, in its NICs' order.
    pub fn nic_addrs(&self, r: usize) -> Vec<SocketAddr> {
        (0..self.nics(r)).map(|k| self.nic_addr(r, k)).collect()
    }

    /// The paths between ranks `a` and `b`: NIC k of one with NIC k of the
    /// other (rails: on a multi-rail cluster NIC k of every host shares a
    /// switch), as many as the one with fewer NICs has.
    pub fn paths_between(&self, a: usize, b: usize) -> usize {
        self.nics(a).min(self.nics(b)).max(1)
    }

    /// Which ranks share a host, hosts numbered by their lowest rank.
    pub fn topology(&self) -> Topology {
        let keys: Vec<u32> = (0..self.len()).map(|r| self.site(r).host).collect();
        Topology::from_hosts(&keys)
    }

    /// Whether rank `r` listens on loopback addresses only.
    pub fn on_loopback(&self, r: usize) -> bool {
        self.ips(r).iter().all(|a| a.ip().is_loopback())
    }

    /// Rank `r`'s record, as it published it.
    pub fn record(&self, r: usize) -> PeerInfo {
        let addrs: Vec<String> = self.nic_addrs(r).iter().map(|a| a.to_string()).collect();
        PeerInfo {
            rank: r,
            host: self.host(r).to_string(),
            machine: self.machine(r).to_string(),
            tuning: self.tuning(r).to_string(),
            topo: self.topo(r).to_string(),
            pid: self.pid(r),
            addr: addrs[0].clone(),
            addrs: if addrs.len() > 1 { addrs } else { Vec::new() },
        }
    }

    /// The table of `records`, which must be ranks 0, 1, ... in order.
    pub fn from_records(records: &[PeerInfo]) -> Result<PeerTable, String> {
        let mut b = Builder::new(records.len());
        for p in records {
            let addrs = p.nic_addrs();
            b.add(
                p.rank,
                p.pid,
                [&p.host, &p.machine, &p.tuning, &p.topo],
                &addrs,
            )?;
        }
        b.finish()
    }

    /// The table of a split: the parent's ranks `members` (in the child's
    /// rank order), each now listening on `ports[i]` (one per NIC).
    pub fn subset(&self, members: &[usize], ports: &[Vec<u16>]) -> Result<PeerTable, String> {
        let mut ranks = Vec::with_capacity(members.len());
        let mut all = Vec::with_capacity(members.len());
        for (i, (&m, p)) in members.iter().zip(ports).enumerate() {
            if m >= self.len() {
                return Err(format!(
                    "member {i} of the split is rank {m}, not in the parent"
                ));
            }
            if p.len() != self.nics(m) {
                return Err(format!(
                    "rank {i} of the split listens on {} ports for {} NICs",
                    p.len(),
                    self.nics(m)
                ));
            }
            ranks.push(self.ranks[m]);
            all.extend_from_slice(p);
        }
        Ok(PeerTable {
            ranks,
            sites: self.sites.clone(),
            ports: all,
            first_port: FirstPort::of(ports.iter().map(Vec::len)),
        })
    }
}

/// Builds a [`PeerTable`] from records in any order, each read once.
pub(super) struct Builder<'a> {
    /// Each rank's row and where its ports start in `ports` (records
    /// arrive in any order).
    rows: Vec<Option<(Row, u32)>>,
    sites: Sites,
    ports: Vec<u16>,
    strings: HashMap<&'a str, u32>,
    files: HashMap<[u32; 3], u32>,
    ips: HashMap<Box<[SocketAddr]>, u32>,
    /// A host's ranks share a site unless they listen on different
    /// addresses or loaded different files.
    sites_by: HashMap<Site, u32>,
    /// The last record added and its site: records come in rank order and
    /// a host's ranks are mostly neighbours, so most records repeat the
    /// last one's site, which is then found by comparing text, without
    /// hashing or parsing an address (every rank builds the whole table).
    last: Option<(Fields<'a>, u32)>,
}

impl<'a> Builder<'a> {
    pub fn new(n: usize) -> Builder<'a> {
        Builder {
            rows: vec![None; n],
            sites: Sites::default(),
            ports: Vec::with_capacity(n),
            strings: HashMap::new(),
            files: HashMap::new(),
            ips: HashMap::new(),
            sites_by: HashMap::new(),
            last: None,
        }
    }

    fn intern(&mut self, s: &'a str) -> u32 {
        let Sites { text, ends, .. } = &mut self.sites;
        *self.strings.entry(s).or_insert_with(|| {
            text.push_str(s);
            ends.push(text.len() as u32);
            ends.len() as u32 - 1
        })
    }

    fn intern_files(&mut self, files: [u32; 3]) -> u32 {
        let all = &mut self.sites.files;
        *self.files.entry(files).or_insert_with(|| {
            all.push(files);
            all.len() as u32 - 1
        })
    }

    fn intern_ips(&mut self, ips: &[SocketAddr]) -> u32 {
        if let Some(&i) = self.ips.get(ips) {
            return i;
        }
        self.sites.ips.extend_from_slice(ips);
        self.sites.ips_end.push(self.sites.ips.len() as u32);
        let i = self.sites.ips_end.len() as u32 - 1;
        self.ips.insert(ips.into(), i);
        i
    }

    /// Adds the record read from the exchange.
    pub fn add_fields(&mut self, f: Fields<'a>) -> Result<(), String> {
        if let Some((last, site)) = &self.last {
            if same_site(last, &f) {
                let site = *site;
                self.check_free(f.rank)?;
                let first = self.ports.len() as u32;
                let ports = f.nic_addrs().iter().filter_map(|a| split_port(a));
                self.ports.extend(ports.map(|(_, port)| port));
                self.rows[f.rank] = Some((Row { site, pid: f.pid }, first));
                return Ok(());
            }
        }
        let addrs = f.nic_addrs();
        let site = self.add(f.rank, f.pid, [f.host, f.machine, f.tuning, f.topo], addrs)?;
        self.last = Some((f, site));
        Ok(())
    }

    fn check_free(&self, rank: usize) -> Result<(), String> {
        match self.rows.get(rank) {
            None => Err(format!(
                "a record of rank {rank} in a table of {}",
                self.rows.len()
            )),
            Some(Some(_)) => Err(format!("two records of rank {rank}")),
            Some(None) => Ok(()),
        }
    }

    /// Adds rank `rank`'s record: its strings (host, machine, tuning, topo)
    /// and its addresses, one per NIC; returns its site.
    fn add<S: AsRef<str>>(
        &mut self,
        rank: usize,
        pid: u32,
        strings: [&'a str; 4],
        addrs: &[S],
    ) -> Result<u32, String> {
        self.check_free(rank)?;
        let [host, machine, tuning, topo] = strings.map(|s| self.intern(s));
        let first_port = self.ports.len();
        let mut ips: Vec<SocketAddr> = Vec::with_capacity(addrs.len());
        for a in addrs {
            let a: SocketAddr = a
                .as_ref()
                .parse()
                .map_err(|_| format!("rank {rank} listens at a bad address {:?}", a.as_ref()))?;
            self.ports.push(a.port());
            let mut at = a;
            at.set_port(0);
            ips.push(at);
        }
        if ips.is_empty() {
            return Err(format!("rank {rank} listens nowhere"));
        }
        let site = Site {
            host,
            files: self.intern_files([machine, tuning, topo]),
            ips: self.intern_ips(&ips),
        };
        let sites = &mut self.sites.sites;
        let site = *self.sites_by.entry(site).or_insert_with(|| {
            sites.push(site);
            sites.len() as u32 - 1
        });
        self.rows[rank] = Some((Row { site, pid }, first_port as u32));
        Ok(site)
    }

    pub fn finish(self) -> Result<PeerTable, String> {
        let mut ranks = Vec::with_capacity(self.rows.len());
        let mut ports = Vec::with_capacity(self.ports.len());
        let nics = |row: &Row| {
            self.sites
                .ip_list(self.sites.sites[row.site as usize].ips)
                .len()
        };
        for (r, placed) in self.rows.iter().enumerate() {
            let (row, first) = placed.ok_or_else(|| format!("no record of rank {r}"))?;
            let first = first as usize;
            ports.extend_from_slice(&self.ports[first..first + nics(&row)]);
            ranks.push(row);
        }
        let first_port = FirstPort::of(ranks.iter().map(nics));
        Ok(PeerTable {
            ranks,
            sites: Arc::new(self.sites),
            ports,
            first_port,
        })
    }
}

/// Whether `f` has `last`'s site: the same strings, and addresses that
/// differ at most in their ports (each a valid one).
fn same_site(last: &Fields<'_>, f: &Fields<'_>) -> bool {
    let (was, now) = (last.nic_addrs(), f.nic_addrs());
    last.host == f.host
        && last.machine == f.machine
        && last.tuning == f.tuning
        && last.topo == f.topo
        && was.len() == now.len()
        && was.iter().zip(now).all(|(a, b)| {
            matches!((a.rsplit_once(':'), split_port(b)), (Some((ip_a, _)), Some((ip_b, _))) if ip_a == ip_b)
        })
}

/// "ip:port" or "[ip%scope]:port" as the text of its address and its port.
fn split_port(a: &str) -> Option<(&str, u16)> {
    let (ip, port) = a.rsplit_once(':')?;
    Some((ip, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(rank: usize, host: &str, addrs: &[&str]) -> PeerInfo {
        PeerInfo {
            rank,
            host: host.into(),
            machine: "boot".into(),
            tuning: String::new(),
            topo: "#profile at start-up".into(),
            pid: 100 + rank as u32,
            addr: addrs[0].into(),
            addrs: if addrs.len() > 1 {
                addrs.iter().map(|a| a.to_string()).collect()
            } else {
                Vec::new()
            },
        }
    }

    #[test]
    fn the_table_gives_back_every_record_and_shares_what_hosts_share() {
        let records = vec![
            record(0, "a", &["10.0.0.1:4000", "10.1.0.1:4001"]),
            record(1, "a", &["10.0.0.1:4002", "10.1.0.1:4003"]),
            record(2, "b", &["[fd00::2]:5000"]),
            record(3, "b", &["[fd00::2]:5001"]),
            // Same host name, another address: a site of its own.
            record(4, "b", &["10.9.0.2:5002"]),
            // A link-local address keeps its scope.
            record(5, "c", &["[fe80::1%2]:5003"]),
        ];
        let t = PeerTable::from_records(&records).unwrap();
        assert_eq!(t.len(), 6);
        for (r, p) in records.iter().enumerate() {
            assert_eq!(
                serde_json::to_string(&t.record(r)).unwrap(),
                serde_json::to_string(p).unwrap()
            );
        }
        assert_eq!(t.sites.sites.len(), 4);
        assert_eq!(t.sites.ends.len(), 6, "a, boot, empty, topo, b, c");
        assert_eq!((t.sites.files.len(), t.sites.ips_end.len()), (1, 4));
        match t.nic_addr(5, 0) {
            SocketAddr::V6(a) => assert_eq!((a.scope_id(), a.port()), (2, 5003)),
            other => panic!("{other}"),
        }
        assert!(t.same_host(2, 4) && !t.same_host(1, 2));
        assert_eq!(t.paths_between(0, 1), 2);
        assert_eq!(t.paths_between(0, 2), 1);
        assert_eq!(t.nic_addr(1, 1), "10.1.0.1:4003".parse().unwrap());
        assert!(!t.on_loopback(0));

        let child = t.subset(&[3, 0], &[vec![7000], vec![7001, 7002]]).unwrap();
        assert_eq!(child.len(), 2);
        assert_eq!(child.nic_addrs(0), ["[fd00::2]:7000".parse().unwrap()]);
        assert_eq!(child.nic_addr(1, 1), "10.1.0.1:7002".parse().unwrap());
        assert_eq!((child.host(1), child.pid(1)), ("a", 100));
        assert!(t.subset(&[0], &[vec![1]]).is_err(), "ports for each NIC");
        assert!(
            t.subset(&[6], &[vec![1]]).is_err(),
            "a member not in the parent"
        );
    }

    /// The table as the exchange builds it: from encoded records.
    fn from_wire(records: &[PeerInfo]) -> Result<PeerTable, String> {
        let mut bytes = Vec::new();
        records.iter().for_each(|p| p.encode(&mut bytes));
        let mut b = bytes.as_slice();
        let mut t = Builder::new(records.len());
        for _ in records {
            t.add_fields(Fields::read(&mut b)?)?;
        }
        t.finish()
    }

    #[test]
    fn records_that_repeat_the_last_site_share_it_and_others_do_not() {
        let records = vec![
            record(0, "a", &["10.0.0.1:4000", "10.1.0.1:4001"]),
            record(1, "a", &["10.0.0.1:4002", "10.1.0.1:4003"]),
            // The same host, one NIC's address another: a site of its own.
            record(2, "a", &["10.0.0.1:4004", "10.1.0.9:4005"]),
            record(3, "b", &["[fe80::1%2]:5000"]),
            record(4, "b", &["[fe80::1%2]:5001"]),
            // Back to the first site, not right after it.
            record(5, "a", &["10.0.0.1:4006", "10.1.0.1:4007"]),
        ];
        let t = from_wire(&records).unwrap();
        for (r, p) in records.iter().enumerate() {
            assert_eq!(
                serde_json::to_string(&t.record(r)).unwrap(),
                serde_json::to_string(p).unwrap()
            );
        }
        assert_eq!(t.sites.sites.len(), 3);
        assert_eq!(t.ranks[5].site, t.ranks[0].site);
        assert_eq!(t.ranks[1].site, t.ranks[0].site);
        assert_ne!(t.ranks[2].site, t.ranks[0].site);
        assert!(
            matches!(t.first_port, FirstPort::At(_)),
            "two NICs, then one"
        );
        let mut pair = records[3..5].to_vec();
        pair.iter_mut().enumerate().for_each(|(r, p)| p.rank = r);
        let one = from_wire(&pair).unwrap();
        assert!(matches!(one.first_port, FirstPort::Every(1)));
        assert_eq!(one.nic_addr(1, 0).port(), 5001);
        let child = t.subset(&[4, 0], &[vec![9], vec![7, 8]]).unwrap();
        assert_eq!(
            (child.nic_addr(0, 0).port(), child.nic_addr(1, 1).port()),
            (9, 8)
        );
        let mut bad = records.clone();
        bad[1].addrs[1] = "10.1.0.1:70000".into();
        assert!(from_wire(&bad).is_err(), "a bad port after a good record");
        let mut twice = records[..2].to_vec();
        twice[1].rank = 0;
        assert!(from_wire(&twice).is_err(), "rank 0 twice");
    }

    #[test]
    fn a_table_with_a_rank_missing_twice_or_misplaced_is_refused() {
        let a = record(0, "a", &["127.0.0.1:1"]);
        let b = record(1, "a", &["127.0.0.1:2"]);
        assert!(PeerTable::from_records(&[a.clone(), a.clone()]).is_err());
        assert!(PeerTable::from_records(std::slice::from_ref(&b)).is_err());
        let mut bad = b.clone();
        bad.addr = "somewhere".into();
        assert!(PeerTable::from_records(&[a.clone(), bad]).is_err());
        let mut b = Builder::new(2);
        b.add(1, 1, ["a", "m", "", ""], &["127.0.0.1:2"]).unwrap();
        assert!(b.finish().is_err(), "rank 0 has no record");
    }
}
