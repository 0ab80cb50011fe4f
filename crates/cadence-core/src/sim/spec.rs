//! Cluster specs: the simulator's input, JSON a person writes.
//!
//! ```json
//! {"version": 1, "kind": "cadence-cluster",
//!  "note": "Nurion-like: 100 Gbit/s OPA, 50 % blocking fat tree",
//!  "hosts": 64, "ranks_per_host": 1,
//!  "nic": {"count": 1, "rate": "100gbit", "latency_us": 2.0},
//!  "fabric": {"kind": "fat_tree", "hosts_per_leaf": 16,
//!             "oversubscription": 2.0, "hop_latency_us": 1.0},
//!  "shm": {"rate": "10GB/s", "latency_us": 1.0, "host_memory": "40GB/s"},
//!  "cpu": {"reduce": "4GB/s"},
//!  "eager": {"tcp": "4MiB", "shm": "256KiB"}}
//! ```
//!
//! - **hosts** (optional): how many; without it `--ranks` decides (ranks /
//!   ranks_per_host hosts), so one spec describes a fabric at every scale.
//! - **nic**: per host, `count` NICs of `rate` each (cadence stripes a link
//!   over all of them), the one-way latency of a message between hosts
//!   (`latency_us`, default 10) and the sender's CPU time per message
//!   (`overhead_us`, default 2; messages start one after another).
//! - **fabric**: `single_switch` (non-blocking); `rails` (NIC k of every
//!   host on switch k, non-blocking: the same as one switch to a flow model
//!   whose links are the hosts' NICs); `fat_tree` (leaf switches of
//!   `hosts_per_leaf` hosts, each leaf's uplinks carrying its hosts' NIC
//!   rate over `oversubscription`: 2.0 is 50 % blocking; the spine is
//!   non-blocking; `hop_latency_us` more for a message that crosses it);
//!   `racks` (`"rack_of": [0, 1, 0, 1]`, each host's rack, and `"uplink":
//!   "250mbit"`, what each rack's uplink carries each way: the emulated
//!   cluster's racks, any placement); `measured` (`"file": "topo.json"`,
//!   what `cadence topo profile`
//!   wrote: its hosts, their NIC rates and its groups' shared capacities).
//! - **shm**, **cpu**, **eager**: what a message on one host, a reduction
//!   and the transports' buffering cost (defaults: 10 GB/s, 1 µs latency,
//!   0.2 µs overhead, 4 GB/s,
//!   4 MiB over TCP, 256 KiB in shared memory). Calibration writes these.
//!   `cpu` may also say `"shared_cores": 2` (every rank of the cluster
//!   runs on those cores: an emulated cluster on one machine) and
//!   `"loaded_overhead_us"` (what a message costs those cores at least when
//!   every rank is busy), `"call_overhead_us"` (what each rank spends on
//!   a call before its first message) and `"stack_rate"` (what one of
//!   those cores moves through the hosts' network stacks: a message
//!   between hosts costs the cores its bytes over it); `cadence sim
//!   calibrate` writes them where the ranks outnumber the machine's cores.
//! - **shaper** (optional): the NICs and uplinks are shaped by token
//!   buckets, as `tc tbf` shapes the emulated cluster's (`cadence sim
//!   --cluster` writes it): after an idle spell a link passes `burst_us` of
//!   its rate at `peak` (what the path does unshaped), then its rate. Real
//!   NICs have no such credit: leave it out.
//!
//! Rates are strings with a unit: `bit`, `kbit`, `mbit`, `gbit` (bits per
//! second, as `tc` and `cadence cluster` write them) or `B/s`, `KB/s`, `MB/s`,
//! `GB/s` (bytes, decimal). Sizes: bytes, or a string with `KiB`, `MiB`,
//! `GiB`. Unknown fields are mistakes, as are rates ≤ 0 and ranks that do
//! not fill whole hosts: each is one line naming the field.
//!
//! A topology file (`"kind": "cadence-topology"`) is also accepted as a
//! spec on its own: the default costs, its hosts and rates.

use super::exec::{Model, Shaper as ModelShaper};
use crate::fabric::file::TopoFile;
use crate::fabric::infer::nic_estimates;
use crate::schedule::Topology;
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const VERSION: u32 = 1;
pub const KIND: &str = "cadence-cluster";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub version: u32,
    pub kind: String,
    #[serde(default)]
    pub note: String,
    #[serde(default)]
    pub hosts: Option<usize>,
    #[serde(default = "one")]
    pub ranks_per_host: usize,
    #[serde(default)]
    pub nic: Option<Nic>,
    #[serde(default)]
    pub fabric: Fabric,
    #[serde(default)]
    pub shm: Shm,
    #[serde(default)]
    pub cpu: Cpu,
    #[serde(default)]
    pub eager: Eager,
    #[serde(default)]
    pub shaper: Option<Shaper>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shaper {
    pub burst_us: f64,
    pub peak: String,
}

fn one() -> usize {
    1
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    #[serde(default = "one")]
    pub count: usize,
    #[serde(default)]
    pub rate: Option<String>,
    #[serde(default = "default_nic_latency")]
    pub latency_us: f64,
    #[serde(default = "default_nic_overhead")]
    pub overhead_us: f64,
}

fn default_nic_latency() -> f64 {
    10.0
}
fn default_nic_overhead() -> f64 {
    2.0
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fabric {
    #[default]
    SingleSwitch,
    Rails,
    FatTree {
        hosts_per_leaf: usize,
        oversubscription: f64,
        #[serde(default)]
        hop_latency_us: f64,
    },
    Racks {
        rack_of: Vec<usize>,
        uplink: String,
        #[serde(default)]
        hop_latency_us: f64,
    },
    Measured {
        file: String,
    },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shm {
    #[serde(default = "default_shm_rate")]
    pub rate: String,
    #[serde(default = "default_shm_latency")]
    pub latency_us: f64,
    #[serde(default = "default_shm_overhead")]
    pub overhead_us: f64,
    #[serde(default)]
    pub host_memory: Option<String>,
}

impl Default for Shm {
    fn default() -> Shm {
        Shm {
            rate: default_shm_rate(),
            latency_us: default_shm_latency(),
            overhead_us: default_shm_overhead(),
            host_memory: None,
        }
    }
}

fn default_shm_rate() -> String {
    "10GB/s".into()
}
fn default_shm_latency() -> f64 {
    1.0
}
fn default_shm_overhead() -> f64 {
    0.2
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cpu {
    #[serde(default = "default_reduce")]
    pub reduce: String,
    /// Cores every rank of the cluster shares (an emulated cluster on one
    /// machine); absent: each rank has a core of its own.
    #[serde(default)]
    pub shared_cores: Option<f64>,
    /// With `shared_cores`: the core time (µs) every message costs at least
    /// when all ranks are busy (`cadence sim calibrate` measures it).
    #[serde(default)]
    pub loaded_overhead_us: f64,
    /// With `shared_cores`: what one of those cores moves through the
    /// hosts' network stacks (a rate); absent: the stacks cost nothing.
    /// `cadence sim calibrate` fits it.
    #[serde(default)]
    pub stack_rate: Option<String>,
    /// With `shared_cores`: the core time (µs) each rank spends on a call
    /// before its first message (`cadence sim calibrate` measures it).
    #[serde(default)]
    pub call_overhead_us: f64,
}

impl Default for Cpu {
    fn default() -> Cpu {
        Cpu {
            reduce: default_reduce(),
            shared_cores: None,
            loaded_overhead_us: 0.0,
            stack_rate: None,
            call_overhead_us: 0.0,
        }
    }
}

fn default_reduce() -> String {
    "4GB/s".into()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Eager {
    #[serde(default = "default_tcp_eager")]
    pub tcp: Size,
    #[serde(default = "default_shm_eager")]
    pub shm: Size,
}

impl Default for Eager {
    fn default() -> Eager {
        Eager {
            tcp: default_tcp_eager(),
            shm: default_shm_eager(),
        }
    }
}

fn default_tcp_eager() -> Size {
    Size::Bytes(4 << 20)
}
fn default_shm_eager() -> Size {
    Size::Bytes(256 << 10)
}

/// Bytes as a number or a string with a binary unit.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    pub fn bytes(&self, field: &str) -> Result<f64, String> {
        match self {
            Size::Bytes(b) => Ok(*b as f64),
            Size::Text(t) => parse_size(t).ok_or_else(|| {
                format!("{field}: {t:?} is not a size (bytes, or a number with KiB, MiB, GiB)")
            }),
        }
    }
}

fn parse_size(t: &str) -> Option<f64> {
    let t = t.trim();
    let units = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    for (u, k) in units {
        if let Some(num) = t.strip_suffix(u) {
            let x: f64 = num.trim().parse().ok()?;
            return (x.is_finite() && x >= 0.0).then_some(x * k as f64);
        }
    }
    let x: f64 = t.parse().ok()?;
    (x.is_finite() && x >= 0.0).then_some(x)
}

/// Bytes per second from `"100gbit"`, `"250mbit"`, `"12.5GB/s"`; `None`
/// when it is not a rate. Zero and negative rates parse (the caller says
/// why they are wrong).
pub fn parse_rate(text: &str) -> Option<f64> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let bits = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)];
    for (u, k) in bits {
        if let Some(num) = lower.strip_suffix(u) {
            return num.trim().parse::<f64>().ok().map(|x| x * k / 8.0);
        }
    }
    let bytes = [("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3), ("B/s", 1.0)];
    for (u, k) in bytes {
        if let Some(num) = t.strip_suffix(u) {
            return num.trim().parse::<f64>().ok().map(|x| x * k);
        }
    }
    None
}

fn rate(text: &str, field: &str) -> Result<f64, String> {
    let r = parse_rate(text).ok_or_else(|| {
        format!("{field}: {text:?} is not a rate (e.g. \"100gbit\", \"250mbit\", \"12.5GB/s\")")
    })?;
    if !(r.is_finite() && r > 0.0) {
        return Err(format!("{field}: {text:?} must be a positive rate"));
    }
    Ok(r)
}

fn latency(us: f64, field: &str) -> Result<f64, String> {
    if !(us.is_finite() && us >= 0.0) {
        return Err(format!("{field}: {us} must be a latency ≥ 0 (µs)"));
    }
    Ok(us * 1e-6)
}

/// A spec, read: the model for `ranks` ranks (None: the spec's hosts ×
/// ranks_per_host) and, for a measured fabric, the file it came from (the
/// library orders its ring by it).
pub struct Loaded {
    pub model: Model,
    pub topo_file: Option<TopoFile>,
    pub note: String,
}

/// Reads a spec or topology file from `path` (errors name the file).
pub fn load(path: &Path, ranks: Option<usize>) -> Result<Loaded, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text, path, ranks).map_err(|e| format!("{}: {e}", path.display()))
}

/// As [`load`], from text; relative `measured` files are found beside
/// `origin`.
pub fn parse(text: &str, origin: &Path, ranks: Option<usize>) -> Result<Loaded, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind == crate::fabric::file::KIND {
        let file = TopoFile::parse(text, origin)?;
        let spec = Spec {
            version: VERSION,
            kind: KIND.into(),
            note: file.note.clone(),
            hosts: None,
            ranks_per_host: 1,
            nic: None,
            fabric: Fabric::Measured {
                file: origin.display().to_string(),
            },
            shm: Shm::default(),
            cpu: Cpu::default(),
            eager: Eager::default(),
            shaper: None,
        };
        return build(&spec, Some(file), ranks);
    }
    let spec: Spec = serde_json::from_value(value).map_err(|e| e.to_string())?;
    if spec.kind != KIND {
        return Err(format!(
            "kind {:?}: a spec is {KIND:?} (or a topology file, {:?})",
            spec.kind,
            crate::fabric::file::KIND
        ));
    }
    if spec.version != VERSION {
        return Err(format!(
            "version {} (this cadence reads version {VERSION})",
            spec.version
        ));
    }
    let file = match &spec.fabric {
        Fabric::Measured { file } => {
            let mut p = PathBuf::from(file);
            if p.is_relative() {
                if let Some(dir) = origin.parent() {
                    p = dir.join(p);
                }
            }
            Some(TopoFile::load(&p)?)
        }
        _ => None,
    };
    build(&spec, file, ranks)
}

fn build(spec: &Spec, file: Option<TopoFile>, ranks: Option<usize>) -> Result<Loaded, String> {
    let rph = spec.ranks_per_host;
    if rph == 0 {
        return Err("ranks_per_host: must be at least 1".into());
    }
    let fixed_hosts = file.as_ref().map(|f| f.hosts.len()).or(spec.hosts);
    let hosts = match (fixed_hosts, ranks) {
        (Some(h), Some(n)) if h * rph != n => {
            return Err(format!(
                "{n} ranks do not fit {h} hosts × {rph} ranks per host ({} ranks)",
                h * rph
            ))
        }
        (Some(h), _) => h,
        (None, Some(n)) if n % rph != 0 => {
            return Err(format!(
                "{n} ranks do not fill whole hosts of {rph} ranks (ranks_per_host)"
            ))
        }
        (None, Some(n)) => n / rph,
        (None, None) => return Err("no hosts: give \"hosts\" or --ranks".into()),
    };
    if hosts == 0 {
        return Err("hosts: must be at least 1".into());
    }
    let keys: Vec<usize> = (0..hosts * rph).map(|r| r / rph).collect();
    let topo = Topology::from_hosts(&keys);
    let nic = spec.nic.clone().unwrap_or(Nic {
        count: 1,
        rate: None,
        latency_us: default_nic_latency(),
        overhead_us: default_nic_overhead(),
    });
    if nic.count == 0 {
        return Err("nic.count: must be at least 1".into());
    }
    let mut model = Model::flat(topo, 1.0, latency(nic.latency_us, "nic.latency_us")?);
    match (&nic.rate, &file) {
        (Some(r), _) => {
            let r = rate(r, "nic.rate")? * nic.count as f64;
            model.nic_out = vec![r; hosts];
            model.nic_in = vec![r; hosts];
        }
        (None, Some(f)) => {
            let (out, inn) = nic_estimates(&f.rates);
            model.nic_out = out;
            model.nic_in = inn;
        }
        (None, None) => return Err("nic.rate: missing (e.g. \"100gbit\")".into()),
    }
    match &spec.fabric {
        Fabric::SingleSwitch | Fabric::Rails => {}
        Fabric::FatTree {
            hosts_per_leaf,
            oversubscription,
            hop_latency_us,
        } => {
            if *hosts_per_leaf == 0 {
                return Err("fabric.hosts_per_leaf: must be at least 1".into());
            }
            if !(oversubscription.is_finite() && *oversubscription >= 1.0) {
                return Err(format!(
                    "fabric.oversubscription: {oversubscription} must be ≥ 1 (2.0: 50 % blocking)"
                ));
            }
            let leaves = hosts.div_ceil(*hosts_per_leaf);
            model.group_of = (0..hosts).map(|h| h / hosts_per_leaf).collect();
            // A leaf's uplinks: its hosts' NIC rate (a full leaf's, so a
            // partial last leaf is no more blocked than the others) over the
            // ratio.
            let up = model.nic_out[0] * *hosts_per_leaf as f64 / oversubscription;
            model.group_out = vec![up; leaves];
            model.group_in = vec![up; leaves];
            model.hop_alpha = latency(*hop_latency_us, "fabric.hop_latency_us")?;
        }
        Fabric::Racks {
            rack_of,
            uplink,
            hop_latency_us,
        } => {
            if rack_of.len() != hosts {
                return Err(format!(
                    "fabric.rack_of: {} entries for {hosts} hosts",
                    rack_of.len()
                ));
            }
            let racks = rack_of.iter().max().map_or(0, |&r| r + 1);
            if let Some(r) = (0..racks).find(|r| !rack_of.contains(r)) {
                return Err(format!(
                    "fabric.rack_of: rack {r} has no host (racks are 0..{racks})"
                ));
            }
            let up = rate(uplink, "fabric.uplink")?;
            model.group_of = rack_of.clone();
            model.group_out = vec![up; racks];
            model.group_in = vec![up; racks];
            model.hop_alpha = latency(*hop_latency_us, "fabric.hop_latency_us")?;
        }
        Fabric::Measured { .. } => {
            let f = file.as_ref().expect("a measured fabric has its file");
            let fab = f.fabric();
            model.group_of = fab.group_of.clone();
            let inf = |v: &Vec<f64>| {
                v.iter()
                    .map(|&x| if x > 0.0 { x } else { f64::INFINITY })
                    .collect()
            };
            model.group_out = inf(&fab.group_out);
            model.group_in = inf(&fab.group_in);
        }
    }
    model.shm_rate = rate(&spec.shm.rate, "shm.rate")?;
    model.shm_alpha = latency(spec.shm.latency_us, "shm.latency_us")?;
    model.tcp_overhead = latency(nic.overhead_us, "nic.overhead_us")?;
    model.shm_overhead = latency(spec.shm.overhead_us, "shm.overhead_us")?;
    if let Some(m) = &spec.shm.host_memory {
        model.mem_rate = rate(m, "shm.host_memory")?;
    }
    model.gamma = 1.0 / rate(&spec.cpu.reduce, "cpu.reduce")?;
    if let Some(c) = spec.cpu.shared_cores {
        if !(c.is_finite() && c >= 1.0) {
            return Err(format!("cpu.shared_cores: {c} (at least 1 core)"));
        }
        model.shared_cores = Some(c);
    }
    model.loaded_overhead = latency(spec.cpu.loaded_overhead_us, "cpu.loaded_overhead_us")?;
    model.call_overhead = latency(spec.cpu.call_overhead_us, "cpu.call_overhead_us")?;
    if let Some(r) = &spec.cpu.stack_rate {
        if model.shared_cores.is_none() {
            return Err("cpu.stack_rate needs cpu.shared_cores (the cores it is a rate of)".into());
        }
        model.stack_cost = 1.0 / rate(r, "cpu.stack_rate")?;
    }
    model.tcp_eager = spec.eager.tcp.bytes("eager.tcp")?;
    model.shm_eager = spec.eager.shm.bytes("eager.shm")?;
    if let Some(sh) = &spec.shaper {
        model.shaper = Some(ModelShaper {
            burst: latency(sh.burst_us, "shaper.burst_us")?,
            peak: rate(&sh.peak, "shaper.peak")?,
        });
    }
    model.check()?;
    Ok(Loaded {
        model,
        topo_file: file,
        note: spec.note.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, ranks: Option<usize>) -> Result<Loaded, String> {
        parse(text, Path::new("spec.json"), ranks)
    }

    const FAT: &str = r#"{"version": 1, "kind": "cadence-cluster",
        "ranks_per_host": 2,
        "nic": {"rate": "100gbit", "latency_us": 2},
        "fabric": {"kind": "fat_tree", "hosts_per_leaf": 4, "oversubscription": 2.0,
                   "hop_latency_us": 1}}"#;

    #[test]
    fn a_fat_tree_spec_becomes_leaves_with_blocked_uplinks() {
        let l = read(FAT, Some(20)).unwrap();
        let m = &l.model;
        assert_eq!(m.topo.nranks(), 20);
        assert_eq!(m.topo.nhosts(), 10);
        assert_eq!(m.group_of, vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
        assert_eq!(m.nic_out, vec![12.5e9; 10]);
        assert_eq!(m.group_out, vec![25e9; 3]);
        assert!((m.tcp_alpha - 2e-6).abs() < 1e-15 && (m.hop_alpha - 1e-6).abs() < 1e-15);
        assert!((m.gamma - 1.0 / 4e9).abs() < 1e-20);
    }

    #[test]
    fn racks_take_any_placement() {
        let text = r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4,
            "nic": {"rate": "1gbit"},
            "fabric": {"kind": "racks", "rack_of": [0, 1, 0, 1], "uplink": "250mbit"}}"#;
        let m = read(text, None).unwrap().model;
        assert_eq!(m.group_of, vec![0, 1, 0, 1]);
        assert_eq!(m.group_in, vec![250e6 / 8.0; 2]);
        let bad = text.replace("[0, 1, 0, 1]", "[0, 2, 0, 2]");
        let e = read(&bad, None).err().unwrap();
        assert!(e.contains("rack 1 has no host"), "{e}");
    }

    #[test]
    fn rates_and_sizes_read_as_people_write_them() {
        assert_eq!(parse_rate("250mbit"), Some(250e6 / 8.0));
        assert_eq!(parse_rate("1Gbit"), Some(1.25e8));
        assert_eq!(parse_rate("12.5GB/s"), Some(12.5e9));
        assert_eq!(parse_rate("fast"), None);
        assert_eq!(parse_size("4MiB"), Some(4.0 * 1048576.0));
        assert_eq!(parse_size("100"), Some(100.0));
    }

    #[test]
    fn every_mistake_is_one_line_naming_the_field() {
        let cases: &[(&str, Option<usize>, &str)] = &[
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"}, "speed": 3}"#,
                None,
                "unknown field `speed`",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "-1gbit"}}"#,
                None,
                "nic.rate: \"-1gbit\" must be a positive rate",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit", "latency_us": -3}}"#,
                None,
                "nic.latency_us: -3 must be a latency",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"}}"#,
                Some(6),
                "6 ranks do not fit 4 hosts × 1 ranks per host",
            ),
            (FAT, Some(7), "7 ranks do not fill whole hosts of 2 ranks"),
            (
                r#"{"version": 2, "kind": "cadence-cluster", "hosts": 4}"#,
                None,
                "version 2",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"},
                    "fabric": {"kind": "torus"}}"#,
                None,
                "unknown variant `torus`",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"},
                    "fabric": {"kind": "fat_tree", "hosts_per_leaf": 2, "oversubscription": 0.5}}"#,
                None,
                "fabric.oversubscription: 0.5 must be ≥ 1",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4}"#,
                None,
                "nic.rate: missing",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"},
                    "shaper": {"burst_us": -1, "peak": "1GB/s"}}"#,
                None,
                "shaper.burst_us: -1 must be a latency",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"},
                    "cpu": {"shared_cores": 0.5}}"#,
                None,
                "cpu.shared_cores: 0.5 (at least 1 core)",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"},
                    "cpu": {"stack_rate": "1GB/s"}}"#,
                None,
                "cpu.stack_rate needs cpu.shared_cores",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"},
                    "cpu": {"shared_cores": 2, "stack_rate": "-1GB/s"}}"#,
                None,
                "cpu.stack_rate",
            ),
            (
                r#"{"version": 1, "kind": "cadence-cluster", "hosts": 4, "nic": {"rate": "1gbit"},
                    "shaper": {"burst_us": 1000}}"#,
                None,
                "missing field `peak`",
            ),
        ];
        for (text, ranks, want) in cases {
            let e = read(text, *ranks)
                .err()
                .unwrap_or_else(|| panic!("{text} passed"));
            assert!(e.contains(want), "{e:?} does not say {want:?}");
            assert!(!e.contains('\n'), "{e:?} is more than one line");
        }
    }

    #[test]
    fn a_topology_file_is_a_spec_of_its_hosts() {
        let text = r#"{"version": 1, "kind": "cadence-topology",
            "hosts": ["a", "b", "c", "d"],
            "rates": [[0, 3e7, 1.2e8, 3e7], [3e7, 0, 3e7, 1.2e8],
                      [1.2e8, 3e7, 0, 3e7], [3e7, 1.2e8, 3e7, 0]],
            "groups": [[0, 2], [1, 3]],
            "group_out": [3e7, 3e7], "group_in": [3e7, null]}"#;
        let l = read(text, None).unwrap();
        assert_eq!(l.model.topo.nhosts(), 4);
        assert_eq!(l.model.nic_out, vec![1.2e8; 4]);
        assert_eq!(l.model.group_of, vec![0, 1, 0, 1]);
        assert_eq!(l.model.group_in[1], f64::INFINITY);
        assert!(l.topo_file.is_some());
        let e = read(text, Some(8)).err().unwrap();
        assert!(e.contains("8 ranks do not fit 4 hosts"), "{e}");
    }
}
