//! The ring order of a communicator: which host rings and chains go to
//! next. Default: hosts by lowest rank. With a topology file
//! (`CADENCE_TOPO_FILE`) that knows every host of the job, the path
//! finder's widest ring over the measured rates and group bottlenecks
//! (`fabric::pathfind`), when it is wider than the default; the choice and
//! its reason go to `CADENCE_DEBUG=INFO` and `dump_records()`.

use crate::config::Config;
use crate::fabric::pathfind::widest_ring;
use crate::schedule::Topology;
use serde::Serialize;

/// How the ring order was chosen (reported, not used for scheduling).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OrderChoice {
    /// The hosts in ring order, by name.
    pub hosts: Vec<String>,
    /// `"default"`, or the topology file's path.
    pub source: String,
    /// One line for people: why this order.
    pub why: String,
    /// The path finder's bottleneck (bytes/s per flow with every ring edge
    /// busy) of the chosen order and of the default one, when a topology
    /// file was used.
    pub score: Option<f64>,
    pub default_score: Option<f64>,
}

/// `topo` with the ring order `cfg` asks for, and why. `host_names[r]` is
/// rank r's host.
pub fn choose(topo: Topology, host_names: &[String], cfg: &Config) -> (Topology, OrderChoice) {
    let names_of = |t: &Topology| -> Vec<String> {
        t.host_order()
            .into_iter()
            .map(|h| host_names[t.ranks_on(h)[0]].clone())
            .collect()
    };
    let default = |why: String| OrderChoice {
        hosts: names_of(&topo),
        source: "default".into(),
        why,
        ..OrderChoice::default()
    };
    let Some(loaded) = &cfg.topo else {
        let choice = default("hosts by lowest rank (no CADENCE_TOPO_FILE)".into());
        return (topo, choice);
    };
    let path = loaded.path.display().to_string();
    if topo.nhosts() < 3 {
        // Two hosts (or one) make one ring, whatever the order.
        let choice = default(format!(
            "hosts by lowest rank: {} host(s) leave nothing to order ({path} unused)",
            topo.nhosts()
        ));
        return (topo, choice);
    }
    let fabric = match loaded.file.fabric_for(&names_of(&topo)) {
        Ok(f) => f,
        Err(e) => {
            let choice = default(format!("hosts by lowest rank: {path}: {e}"));
            return (topo, choice);
        }
    };
    let natural: Vec<usize> = (0..fabric.nhosts()).collect();
    let found = widest_ring(&fabric);
    let (score, default_score) = (fabric.ring_score(&found), fabric.ring_score(&natural));
    let mbit = |x: f64| x * 8.0 / 1e6;
    if score <= default_score {
        let mut choice = default(format!(
            "hosts by lowest rank: as wide as any ring by {path} ({:.0} Mbit/s per flow)",
            mbit(default_score)
        ));
        choice.score = Some(default_score);
        choice.default_score = Some(default_score);
        return (topo, choice);
    }
    let ordered = topo
        .with_host_order(&found)
        .expect("the path finder returns a permutation of the hosts");
    let choice = OrderChoice {
        hosts: names_of(&ordered),
        source: path.clone(),
        why: format!(
            "widest ring by {path}: {:.0} Mbit/s per flow with every edge busy, against {:.0} \
             in rank order ({:.2}x)",
            mbit(score),
            mbit(default_score),
            score / default_score
        ),
        score: Some(score),
        default_score: Some(default_score),
    };
    (ordered, choice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadedTopo;
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
            groups: vec![vec![0, 2], vec![1, 3]],
            group_out: vec![Some(slow); 2],
            group_in: vec![Some(slow); 2],
            patterns: serde_json::Value::Null,
        }
    }

    fn cfg(file: TopoFile) -> Config {
        Config {
            topo: Some(LoadedTopo {
                path: PathBuf::from("racks.json"),
                file: Arc::new(file),
                hash: 1,
            }),
            ..Config::default()
        }
    }

    #[test]
    fn interleaved_racks_get_a_ring_that_crosses_each_uplink_once() {
        // Two ranks per host, hosts in rank order a, b, c, d.
        let names: Vec<String> = ["a", "a", "b", "b", "c", "c", "d", "d"]
            .map(String::from)
            .to_vec();
        let topo = Topology::from_hosts(&names);
        let (t, why) = choose(topo, &names, &cfg(racks()));
        assert_eq!(why.source, "racks.json");
        // a, c (rack 0), then b and d (rack 1) in either order.
        let hosts = t.host_order();
        assert!(hosts == [0, 2, 1, 3] || hosts == [0, 2, 3, 1], "{why:?}");
        let ranks: Vec<usize> = hosts.iter().flat_map(|&h| [2 * h, 2 * h + 1]).collect();
        assert_eq!(t.ring_order(), ranks);
        let names: Vec<&str> = hosts.iter().map(|&h| ["a", "b", "c", "d"][h]).collect();
        assert_eq!(why.hosts, names);
        assert_eq!(why.score, Some(3.125e7));
        assert_eq!(why.default_score, Some(3.125e7 / 2.0));
        assert!(why.why.contains("2.00x"), "{}", why.why);
    }

    #[test]
    fn without_a_usable_file_the_order_stays_and_says_why() {
        let names: Vec<String> = ["a", "b", "c", "z"].map(String::from).to_vec();
        let topo = Topology::from_hosts(&names);
        let (t, why) = choose(topo.clone(), &names, &cfg(racks()));
        assert!(t.is_default_order());
        assert!(why.why.contains("does not know host(s) z"), "{}", why.why);
        let (t, why) = choose(topo, &names, &Config::default());
        assert!(t.is_default_order());
        assert_eq!(why.source, "default");
        // Blocked racks: rank order is already the widest.
        let names: Vec<String> = ["a", "c", "b", "d"].map(String::from).to_vec();
        let (t, why) = choose(Topology::from_hosts(&names), &names, &cfg(racks()));
        assert!(t.is_default_order(), "{why:?}");
        assert!(why.why.contains("as wide as any ring"), "{}", why.why);
    }
}
