//! The ring order of a communicator: which host rings and chains go to
//! next. Default: hosts by lowest rank. From a topology (a file named by
//! `CADENCE_TOPO_FILE`, or a profile measured at start-up when it is unset):
//! the path finder's widest ring over the measured rates and group
//! bottlenecks (`fabric::pathfind`), when it is clearly wider than the
//! default ([`WIDER`]); the choice and its reason go to `CADENCE_DEBUG=INFO`
//! and `dump_records()`.
//!
//! **Start-up profile** ([`Comm::order_from_profile`]), when
//! `CADENCE_TOPO_FILE` is unset and the job spans 3 hosts or more (two
//! hosts make one ring whatever the order): rank 0 looks for a profile of
//! the same hosts it cached less than [`CACHE_FRESH`] ago
//! (`CADENCE_TOPO_CACHE`, default `~/.cache/cadence`, file
//! `topo-<hash of the host names>.json`) and sends its text to everyone;
//! otherwise every rank takes part in a profile (`profile.rs`, without the
//! ring rounds) and rank 0 caches it. Up to `CADENCE_TOPO_PAIRS_MAX` hosts
//! (16) the profile measures every pair alone; beyond, only rounds of
//! shifted flows, about 2·log2(n) of them (`fabric::probe`). Cost: a
//! profile once per host set and day (4 hosts at 1 Gbit/s: about 1–2 s),
//! then a file read.

use super::profile::ProfileOptions;
use super::Comm;
use crate::config::{DebugLevel, TopoSource};
use crate::error::{ErrorKind, Result};
use crate::fabric::file::TopoFile;
use crate::fabric::pathfind::{widest_ring, Fabric};
use crate::schedule::Topology;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The found ring replaces the default order only when at least this much
/// wider: measurements differ by a few percent from run to run, and on a
/// flat network every order is as good.
pub const WIDER: f64 = 1.1;
/// How long each flow of the start-up profile takes on the fastest pair.
const START_SECONDS: f64 = 0.05;
/// A cached start-up profile younger than this is used as is.
pub const CACHE_FRESH: Duration = Duration::from_secs(24 * 3600);

/// How the ring order was chosen (reported, not used for scheduling). The
/// hosts in ring order are the topology's ([`ring_hosts`]): a name a host
/// kept here for the job's life would be one more allocation per host on
/// every rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OrderChoice {
    /// `"default"`, the topology file's path, the cached profile's path, or
    /// `"profile at start-up"`.
    pub source: String,
    /// One line for people: why this order.
    pub why: String,
    /// The path finder's bottleneck (bytes/s per flow with every ring edge
    /// busy) of the chosen order and of the default one, when a topology
    /// was used.
    pub score: Option<f64>,
    pub default_score: Option<f64>,
    /// Seconds the start-up profile took (when one ran).
    pub profile_seconds: Option<f64>,
}

/// Rank r's host name, by rank.
pub type HostNames<'a> = dyn Fn(usize) -> &'a str + 'a;

/// The hosts in `t`'s ring order, by name.
pub fn ring_hosts(t: &Topology, host_names: &HostNames) -> Vec<String> {
    t.host_order()
        .into_iter()
        .map(|h| host_names(t.leader(h)).to_string())
        .collect()
}

fn default_choice(why: String) -> OrderChoice {
    OrderChoice {
        source: "default".into(),
        why,
        ..OrderChoice::default()
    }
}

/// The ring order, why, and the measured network between the job's hosts
/// (indexed like the topology's hosts) when there is one: the cost model
/// prices algorithms on it (`schedule::cost`).
pub type Chosen = (Topology, OrderChoice, Option<Fabric>);

/// `topo` (in the default order) with the ring order `src` gives before
/// any start-up profile, and why.
pub fn choose(topo: Topology, host_names: &HostNames, src: &TopoSource) -> Chosen {
    let why = match src {
        TopoSource::File(loaded) => {
            return choose_by(
                topo,
                host_names,
                &loaded.file,
                &loaded.path.display().to_string(),
            )
        }
        TopoSource::Off => "hosts by lowest rank (CADENCE_TOPO_FILE=none)".to_string(),
        TopoSource::Profile { .. } => "hosts by lowest rank (no CADENCE_TOPO_FILE)".to_string(),
    };
    let choice = default_choice(why);
    (topo, choice, None)
}

/// `topo` (in the default order) in the widest ring order by `file` (found
/// in `source`, for the messages), when clearly wider than the default.
pub fn choose_by(topo: Topology, host_names: &HostNames, file: &TopoFile, source: &str) -> Chosen {
    let fabric = match file.fabric_for(&ring_hosts(&topo, host_names)) {
        Ok(f) => f,
        Err(e) => {
            let why = format!("hosts by lowest rank: {source}: {e}");
            let choice = default_choice(why);
            return (topo, choice, None);
        }
    };
    if topo.nhosts() < 3 {
        // Two hosts (or one) make one ring, whatever the order.
        let why = format!(
            "hosts by lowest rank: {} host(s) leave nothing to order (rates from {source})",
            topo.nhosts()
        );
        let choice = default_choice(why);
        return (topo, choice, Some(fabric));
    }
    let natural: Vec<usize> = (0..fabric.nhosts()).collect();
    let found = widest_ring(&fabric);
    let (score, default_score) = (fabric.ring_score(&found), fabric.ring_score(&natural));
    let mbit = |x: f64| x * 8.0 / 1e6;
    if score < WIDER * default_score {
        let mut choice = default_choice(format!(
            "hosts by lowest rank: {:.0} Mbit/s per flow by {source}, within {:.0} % of the \
                 widest ring ({:.0})",
            mbit(default_score),
            (WIDER - 1.0) * 100.0,
            mbit(score)
        ));
        choice.score = Some(default_score);
        choice.default_score = Some(default_score);
        return (topo, choice, Some(fabric));
    }
    let ordered = topo
        .with_host_order(&found)
        .expect("the path finder returns a permutation of the hosts");
    let choice = OrderChoice {
        source: source.to_string(),
        why: format!(
            "widest ring by {source}: {:.0} Mbit/s per flow with every edge busy, against {:.0} \
             in rank order ({:.2}x)",
            mbit(score),
            mbit(default_score),
            score / default_score
        ),
        score: Some(score),
        default_score: Some(default_score),
        profile_seconds: None,
    };
    (ordered, choice, Some(fabric))
}

/// The cache file of a start-up profile of `hosts` (any order) in `dir`.
pub fn cache_file(dir: &Path, hosts: &[String]) -> PathBuf {
    let mut sorted: Vec<&str> = hosts.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let key = crate::choice::tuned::text_hash(&sorted.join("\n"));
    dir.join(format!("topo-{key:016x}.json"))
}

/// The text of a cached profile that is fresh and knows every host, with
/// its age; `None` otherwise (missing, old, unreadable: profile again).
fn read_cache(path: &Path, hosts: &[String]) -> Option<(String, Duration)> {
    let age = std::fs::metadata(path)
        .ok()?
        .modified()
        .ok()?
        .elapsed()
        .ok()?;
    if age > CACHE_FRESH {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let file = TopoFile::parse(&text, path).ok()?;
    file.fabric_for(hosts).ok()?;
    Some((text, age))
}

/// Writes `text` to `path` whole or not at all (aside, then renamed).
fn write_cache(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let aside = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&aside, text)?;
    std::fs::rename(&aside, path)
}

impl Comm {
    /// Start-up, collective: with `CADENCE_TOPO_FILE` unset, orders rings by
    /// a profile of the network (cached by rank 0, see the module's
    /// comment). Before the communicator is shared with any thread.
    pub(super) fn order_from_profile(&mut self) -> Result<()> {
        let TopoSource::Profile { cache, loopback } = &self.shared.cfg.topo else {
            return Ok(());
        };
        let peers = self.shared.peers.clone();
        let host_names = |r| peers.host(r);
        let topo = peers.topology();
        let n = topo.nhosts();
        if n < 3 {
            return Ok(());
        }
        let info = self.shared.cfg.debug >= DebugLevel::Info && self.rank() == 0;
        let say = |m: &str| {
            if info {
                stderr_line!("cadence rank 0 INFO: topology: {m}");
            }
        };
        // Every rank sees the same table, so every rank skips alike.
        if !loopback && (0..peers.len()).all(|r| peers.on_loopback(r)) {
            say(&format!(
                "{n} hosts emulated on loopback: no network between them to profile \
                 (CADENCE_TOPO_FILE=profile measures them anyway)"
            ));
            return Ok(());
        }
        let hosts = ring_hosts(&topo, &host_names);
        let cache = cache.as_ref().map(|dir| cache_file(dir, &hosts));
        // Rank 0 decides, for everyone: a fresh cached profile, or measure.
        let cached = match (&cache, self.rank()) {
            (Some(path), 0) => read_cache(path, &hosts),
            _ => None,
        };
        let mut use_cache = [u8::from(cached.is_some())];
        self.run(super::calibrate::broadcast(&mut use_cache))?;
        let started = Instant::now();
        let (file, source, took) = if use_cache[0] == 1 {
            let (text, age) = cached.unwrap_or_default();
            let mut len = (text.len() as u64).to_le_bytes();
            self.run(super::calibrate::broadcast(&mut len))?;
            let mut bytes = text.into_bytes();
            bytes.resize(u64::from_le_bytes(len) as usize, 0);
            self.run(super::calibrate::broadcast(&mut bytes))?;
            let path = cache.clone().unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            // Rank 0 parsed the same text already: an error here is a bug.
            let file = TopoFile::parse(&text, &path).map_err(|e| {
                self.shared.err(
                    ErrorKind::Setup {
                        detail: e,
                        culprit: None,
                    },
                    None,
                )
            })?;
            say(&format!(
                "the profile cached {:.0} min ago in {}",
                age.as_secs_f64() / 60.0,
                path.display()
            ));
            (file, path.display().to_string(), None)
        } else {
            let opts = ProfileOptions {
                seconds: START_SECONDS,
                rings: false,
                pairs_max: self.shared.cfg.topo_pairs_max,
                note: format!("profiled at start-up by communicator {}", self.id()),
            };
            let file = self.profile_topology(&opts, &say)?;
            if let (Some(path), 0) = (&cache, self.rank()) {
                match write_cache(path, &file.to_text()) {
                    Ok(()) => say(&format!("cached in {}", path.display())),
                    Err(e) => {
                        if self.shared.cfg.debug >= DebugLevel::Warn {
                            stderr_line!(
                                "cadence rank 0 WARN: cannot cache the topology profile in {}: \
                                 {e} (the next job profiles again)",
                                path.display()
                            );
                        }
                    }
                }
            }
            (
                file,
                "profile at start-up".to_string(),
                Some(started.elapsed()),
            )
        };
        let (ordered, mut choice, fabric) = choose_by(topo, &host_names, &file, &source);
        choice.profile_seconds = took.map(|t| (t.as_secs_f64() * 1000.0).round() / 1000.0);
        // The profile's rounds may have started the progress thread; it
        // holds the shared state, which is about to change.
        self.close();
        self.shared.inner.lock().unwrap().forget_schedules();
        let shared = self.exclusive("ordering rings")?;
        shared.chosen.get_mut().unwrap().clear();
        shared.auto.topo = ordered;
        shared.auto.order = choice;
        shared.auto.fabric = fabric.map(Arc::new);
        shared.profile = Some(Arc::new(file));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, LoadedTopo};
    use crate::fabric::file::TopoFile;
    use std::path::PathBuf;
    use std::sync::Arc;

    /// Racks {a, c} and {b, d} (interleaved), 1 Gbit/s hosts, 250 Mbit/s uplinks.
    fn racks() -> TopoFile {
        let (fast, slow) = (1.25e8, 3.125e7);
        let rack = |h: usize| h % 2;
        let rates = (0..4)
            .map(|a| {
                (0..4)
                    .map(|b| match (a == b, rack(a) == rack(b)) {
                        (true, _) => 0.0,
                        (false, true) => fast,
                        (false, false) => slow,
                    })
                    .collect()
            })
            .collect();
        TopoFile {
            version: 1,
            kind: "cadence-topology".into(),
            note: String::new(),
            hosts: ["a", "b", "c", "d"].map(String::from).to_vec(),
            rates,
            host_rates: None,
            groups: vec![vec![0, 2], vec![1, 3]],
            group_out: vec![Some(slow); 2],
            group_in: vec![Some(slow); 2],
            patterns: serde_json::Value::Null,
            profile: serde_json::Value::Null,
        }
    }

    fn cfg(file: TopoFile) -> TopoSource {
        TopoSource::File(LoadedTopo {
            path: PathBuf::from("racks.json"),
            file: Arc::new(file),
            hash: 1,
        })
    }

    #[test]
    fn interleaved_racks_get_a_ring_that_crosses_each_uplink_once() {
        // Two ranks per host, hosts in rank order a, b, c, d.
        let names: Vec<String> = ["a", "a", "b", "b", "c", "c", "d", "d"]
            .map(String::from)
            .to_vec();
        let topo = Topology::from_hosts(&names);
        let (t, why, _) = choose(topo, &|r| names[r].as_str(), &cfg(racks()));
        assert_eq!(why.source, "racks.json");
        // a, c (rack 0), then b and d (rack 1) in either order.
        let hosts = t.host_order();
        assert!(hosts == [0, 2, 1, 3] || hosts == [0, 2, 3, 1], "{why:?}");
        let ranks: Vec<usize> = hosts.iter().flat_map(|&h| [2 * h, 2 * h + 1]).collect();
        assert_eq!(t.ring_order(), ranks);
        let want: Vec<&str> = hosts.iter().map(|&h| ["a", "b", "c", "d"][h]).collect();
        assert_eq!(ring_hosts(&t, &|r| names[r].as_str()), want);
        assert_eq!(why.score, Some(3.125e7));
        assert_eq!(why.default_score, Some(3.125e7 / 2.0));
        assert!(why.why.contains("2.00x"), "{}", why.why);
    }

    #[test]
    fn without_a_usable_file_the_order_stays_and_says_why() {
        let names: Vec<String> = ["a", "b", "c", "z"].map(String::from).to_vec();
        let topo = Topology::from_hosts(&names);
        let (t, why, _) = choose(topo.clone(), &|r| names[r].as_str(), &cfg(racks()));
        assert!(t.is_default_order());
        assert!(why.why.contains("does not know host(s) z"), "{}", why.why);
        let (t, why, _) = choose(topo, &|r| names[r].as_str(), &Config::default().topo);
        assert!(t.is_default_order());
        assert_eq!(why.source, "default");
        // Blocked racks: rank order is already the widest.
        let names: Vec<String> = ["a", "c", "b", "d"].map(String::from).to_vec();
        let (t, why, _) = choose(
            Topology::from_hosts(&names),
            &|r| names[r].as_str(),
            &cfg(racks()),
        );
        assert!(t.is_default_order(), "{why:?}");
        assert!(why.why.contains("within 10 % of the widest"), "{}", why.why);
    }
}
