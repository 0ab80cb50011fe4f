//! Topology files: what `cadence topo profile` measured, read back at
//! start-up (`CADENCE_TOPO_FILE`).
//!
//! A topology file is JSON, meant to be read by people too:
//!
//! ```json
//! {"version": 1, "kind": "cadence-topology",
//!  "note": "cadence topo profile --cluster tr, 2026-11-24",
//!  "hosts": ["tr-h0", "tr-h1", "tr-h2", "tr-h3"],
//!  "rates": [[0, 3.0e7, 1.2e8, 3.0e7], ...],
//!  "groups": [[0, 2], [1, 3]],
//!  "group_out": [3.0e7, 3.0e7],
//!  "group_in": [3.0e7, 3.0e7],
//!  "patterns": [...]}
//! ```
//!
//! - **hosts**: host identities as cadence knows them (`CADENCE_HOST`, else
//!   the host name): a job uses the file when every one of its hosts is
//!   there, whatever the order of its ranks; hosts the job does not use are
//!   left out of its path search.
//! - **rates**: bytes/s one flow from host a to host b got alone (the
//!   diagonal is unused, 0).
//! - **host_rates** (in place of `rates`, as a profile by shifted rounds
//!   writes it: it measures no pair alone): `{"out": [...], "in": [...]}`,
//!   each host's best rate out and in; the alone rate a → b is then the
//!   smaller of a's out and b's in, and between groups no more than either
//!   group's capacity ([`estimated_rates`]). n numbers a direction where
//!   the matrix has n², which at a thousand hosts is tens of megabytes that
//!   every rank of a job would read back from the start-up cache.
//! - **groups**: hosts that share a bottleneck to the others (a rack), as
//!   inferred by the profiler; every host in exactly one group.
//! - **group_out** / **group_in**: what all flows out of (into) a group
//!   shared when measured together, bytes/s; `null`: not a bottleneck.
//! - **patterns**: the raw rounds the profiler ran (for `cadence topo
//!   show` and for people); the loader ignores them, as it does
//!   **profile** (flow size, seconds taken, ranks).
//!
//! Every rank must order its rings alike, so every rank publishes a hash of
//! the file it loaded at bootstrap and a communicator whose ranks loaded
//! different files refuses to start (as with tuning tables).

use super::pathfind::Fabric;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// The only version this cadence reads and writes.
pub const VERSION: u32 = 1;
pub const KIND: &str = "cadence-topology";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopoFile {
    pub version: u32,
    pub kind: String,
    #[serde(default)]
    pub note: String,
    pub hosts: Vec<String>,
    /// Filled on reading where the file has `host_rates` instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rates: Vec<Vec<f64>>,
    /// Written in place of `rates` where they follow from it ([`TopoFile::to_text`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_rates: Option<HostRates>,
    pub groups: Vec<Vec<usize>>,
    pub group_out: Vec<Option<f64>>,
    pub group_in: Vec<Option<f64>>,
    #[serde(default)]
    pub patterns: serde_json::Value,
    /// How the profile ran (flow size, seconds, ranks): for people.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub profile: serde_json::Value,
}

/// Each host's best rate out and in, bytes/s: what the alone rates follow
/// from when no pair was measured alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostRates {
    pub out: Vec<f64>,
    #[serde(rename = "in")]
    pub inn: Vec<f64>,
}

/// The alone rates a profile by shifted rounds estimates: a → b at the
/// smaller of a's best out and b's best in, and between groups no more
/// than a's group's capacity out or b's in (`group_of[h]`: h's group).
pub fn estimated_rates(
    host: &HostRates,
    group_of: &[usize],
    group_out: &[Option<f64>],
    group_in: &[Option<f64>],
) -> Vec<Vec<f64>> {
    let n = group_of.len();
    let cap = |c: &[Option<f64>], g: usize| c.get(g).copied().flatten();
    super::infer::pair_rates(n, |a, b| {
        let mut r = host.out[a].min(host.inn[b]);
        let (ga, gb) = (group_of[a], group_of[b]);
        if ga != gb {
            for c in [cap(group_out, ga), cap(group_in, gb)]
                .into_iter()
                .flatten()
            {
                r = r.min(c);
            }
        }
        r
    })
}

impl TopoFile {
    /// The file's text (pretty JSON): with `host_rates`, without the
    /// matrix they give.
    pub fn to_text(&self) -> String {
        let text = if self.host_rates.is_some() {
            let mut compact = self.clone();
            compact.rates.clear();
            serde_json::to_string_pretty(&compact)
        } else {
            serde_json::to_string_pretty(self)
        };
        text.expect("a topology file serializes") + "\n"
    }

    pub fn parse(text: &str, origin: &Path) -> Result<TopoFile, String> {
        let at = |e: String| format!("topology file {}: {e}", origin.display());
        let mut f: TopoFile = serde_json::from_str(text).map_err(|e| at(e.to_string()))?;
        if f.kind != KIND {
            return Err(at(format!("kind {:?}, not {KIND:?}", f.kind)));
        }
        if f.version != VERSION {
            return Err(at(format!(
                "version {} (this cadence reads version {VERSION})",
                f.version
            )));
        }
        let mut groups_of = vec![0usize; f.hosts.len()];
        for (g, members) in f.groups.iter().enumerate() {
            for &h in members {
                let slot = groups_of
                    .get_mut(h)
                    .ok_or_else(|| at(format!("group {g} lists host {h}, which is not a host")))?;
                *slot += 1;
            }
        }
        if let Some(h) = groups_of.iter().position(|&k| k != 1) {
            return Err(at(format!(
                "host {h} ({:?}) is in {} groups; every host must be in exactly one",
                f.hosts[h], groups_of[h]
            )));
        }
        match (&f.host_rates, f.rates.is_empty()) {
            (Some(_), false) => {
                return Err(at("it has both rates and host_rates; give one".into()));
            }
            (Some(hr), true) => {
                let n = f.hosts.len();
                if hr.out.len() != n || hr.inn.len() != n {
                    return Err(at(format!(
                        "host_rates has {} out and {} in; expected {n} each (one per host)",
                        hr.out.len(),
                        hr.inn.len()
                    )));
                }
                if hr
                    .out
                    .iter()
                    .chain(&hr.inn)
                    .any(|r| !(r.is_finite() && *r >= 0.0))
                {
                    return Err(at("host_rates must be finite and ≥ 0".into()));
                }
                let group_of = f.fabric().group_of;
                f.rates = estimated_rates(hr, &group_of, &f.group_out, &f.group_in);
            }
            (None, true) => return Err(at("it has neither rates nor host_rates".into())),
            (None, false) => {}
        }
        f.fabric().check().map_err(at)?;
        let mut seen = HashMap::new();
        for (i, h) in f.hosts.iter().enumerate() {
            if let Some(j) = seen.insert(h.as_str(), i) {
                return Err(at(format!("host {h:?} is listed twice ({j} and {i})")));
            }
        }
        Ok(f)
    }

    pub fn load(path: &Path) -> Result<TopoFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("topology file {}: {e}", path.display()))?;
        TopoFile::parse(&text, path)
    }

    /// The whole file as a [`Fabric`] over its hosts. Shapes that do not fit
    /// (a group list that misses a host, say) come out as a fabric that
    /// fails [`Fabric::check`].
    pub fn fabric(&self) -> Fabric {
        let n = self.hosts.len();
        let mut group_of = vec![usize::MAX; n];
        for (g, members) in self.groups.iter().enumerate() {
            for &h in members {
                if h < n {
                    group_of[h] = g;
                }
            }
        }
        let cap = |c: &Option<f64>| c.unwrap_or(f64::INFINITY);
        Fabric {
            rate: self.rates.clone(),
            group_of,
            group_out: self.group_out.iter().map(cap).collect(),
            group_in: self.group_in.iter().map(cap).collect(),
        }
    }

    /// The fabric of a job's hosts (`hosts[i]`: the job's host i), with
    /// groups renumbered to those the job uses; Err names the hosts the file
    /// does not know.
    pub fn fabric_for(&self, hosts: &[String]) -> Result<Fabric, String> {
        let index: HashMap<&str, usize> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (h.as_str(), i))
            .collect();
        let missing: Vec<&str> = hosts
            .iter()
            .filter(|h| !index.contains_key(h.as_str()))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the topology file does not know host(s) {} (it has {})",
                missing.join(", "),
                self.hosts.join(", ")
            ));
        }
        let at: Vec<usize> = hosts.iter().map(|h| index[h.as_str()]).collect();
        let whole = self.fabric();
        // Groups in order of first use by the job's hosts.
        let mut renumber: HashMap<usize, usize> = HashMap::new();
        let mut used = Vec::new();
        let group_of = at
            .iter()
            .map(|&i| {
                let g = whole.group_of[i];
                *renumber.entry(g).or_insert_with(|| {
                    used.push(g);
                    used.len() - 1
                })
            })
            .collect();
        Ok(Fabric {
            rate: at
                .iter()
                .map(|&a| at.iter().map(|&b| whole.rate[a][b]).collect())
                .collect(),
            group_of,
            group_out: used.iter().map(|&g| whole.group_out[g]).collect(),
            group_in: used.iter().map(|&g| whole.group_in[g]).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"version": 1, "kind": "cadence-topology",
        "hosts": ["a", "b", "c", "d"],
        "rates": [[0, 3e7, 1.2e8, 3e7], [3e7, 0, 3e7, 1.2e8],
                  [1.2e8, 3e7, 0, 3e7], [3e7, 1.2e8, 3e7, 0]],
        "groups": [[0, 2], [1, 3]],
        "group_out": [3e7, null], "group_in": [3e7, 3e7]}"#;

    fn parse(text: &str) -> Result<TopoFile, String> {
        TopoFile::parse(text, Path::new("t.json"))
    }

    #[test]
    fn a_file_reads_back_and_restricts_to_a_jobs_hosts() {
        let f = parse(GOOD).unwrap();
        let whole = f.fabric();
        assert_eq!(whole.group_of, vec![0, 1, 0, 1]);
        assert_eq!(whole.group_out[1], f64::INFINITY);
        // A job on d, a, b (in that rank order): d's group comes first.
        let job = f.fabric_for(&["d".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(job.group_of, vec![0, 1, 0]);
        assert_eq!(job.rate[0][2], 1.2e8); // d -> b
        assert_eq!(job.rate[1][0], 3e7); // a -> d
        assert_eq!(job.group_out, vec![f64::INFINITY, 3e7]);
        job.check().unwrap();
        let e = f.fabric_for(&["a".into(), "z".into()]).unwrap_err();
        assert!(e.contains("host(s) z"), "{e}");
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let bad = |from: &str, to: &str, expect: &str| {
            let e = parse(&GOOD.replace(from, to)).unwrap_err();
            assert!(e.contains(expect), "{e}");
            assert!(e.starts_with("topology file t.json: "), "{e}");
        };
        bad(r#""version": 1"#, r#""version": 2"#, "version 2");
        bad("cadence-topology", "tuning", "kind");
        bad(r#""a", "b""#, r#""a", "a""#, "listed twice");
        bad(
            "[[0, 2], [1, 3]]",
            "[[0, 2], [1]]",
            "host 3 (\"d\") is in 0 groups",
        );
        bad("[[0, 2], [1, 3]]", "[[0, 2], [1, 3, 2]]", "is in 2 groups");
        bad("[[0, 2], [1, 3]]", "[[0, 2], [1, 3, 9]]", "lists host 9");
        bad("[3e7, null]", "[3e7]", "group");
        bad(r#""rates": [[0, 3e7"#, r#""rates": [[0, -3e7"#, "rate");
        assert!(parse("{").is_err());
    }

    /// GOOD with each host's best rates in place of its matrix.
    const BY_HOST: &str = r#"{"version": 1, "kind": "cadence-topology",
        "hosts": ["a", "b", "c", "d"],
        "host_rates": {"out": [1.2e8, 1.2e8, 1.2e8, 1e8], "in": [1.2e8, 1.1e8, 1.2e8, 1.2e8]},
        "groups": [[0, 2], [1, 3]],
        "group_out": [3e7, null], "group_in": [3e7, 3e7]}"#;

    #[test]
    fn a_file_of_host_rates_reads_back_as_the_matrix_they_give() {
        let f = parse(BY_HOST).unwrap();
        // In a group: the slower end's best; across: capped by the sending
        // group's out and the receiving group's in.
        assert_eq!(f.rates[0][2], 1.2e8);
        assert_eq!(f.rates[3][1], 1e8);
        assert_eq!(f.rates[0][1], 3e7);
        assert_eq!(f.rates[1][0], 3e7); // group 1 out: none; group 0 in: 3e7
        assert_eq!(f.rates[2][2], 0.0);
        // Written back without the matrix, and read back the same.
        let text = f.to_text();
        assert!(!text.contains("\"rates\""), "{text}");
        assert_eq!(parse(&text).unwrap(), f);
        // A file with a matrix keeps it.
        let g = parse(GOOD).unwrap();
        assert!(g.to_text().contains("\"rates\""));
        assert_eq!(parse(&g.to_text()).unwrap(), g);
    }

    #[test]
    fn host_rates_that_do_not_fit_are_refused() {
        let bad = |from: &str, to: &str, expect: &str| {
            let e = parse(&BY_HOST.replace(from, to)).unwrap_err();
            assert!(e.contains(expect), "{e}");
        };
        bad(
            "[1.2e8, 1.2e8, 1.2e8, 1e8]",
            "[1.2e8, 1e8]",
            "2 out and 4 in",
        );
        bad(
            "[1.2e8, 1.2e8, 1.2e8, 1e8]",
            "[1.2e8, 1.2e8, 1.2e8, -1]",
            "≥ 0",
        );
        bad(r#""groups""#, r#""rates": [[0]], "groups""#, "give one");
        bad(
            r#""host_rates""#,
            r#""host_ratez""#,
            "neither rates nor host_rates",
        );
    }
}
