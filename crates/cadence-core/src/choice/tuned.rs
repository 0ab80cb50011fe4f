//! Tuning tables: what `cadence tune` measured, read back at start-up.
//!
//! A tuning file is JSON, meant to be read and edited by people:
//!
//! ```json
//! {"version": 1,
//!  "settings": [
//!   {"nranks": 8, "nhosts": 4, "ranks_per_host": 2,
//!    "note": "cadence tune --cluster tb --ranks-per-host 2, 2026-11-22",
//!    "model": {"shm": {"alpha": 2e-6, "beta": 1.2e-10},
//!              "tcp": {"alpha": 1.5e-4, "beta": 8.4e-9},
//!              "gamma": 2.5e-10, "incast": 0.1},
//!    "choices": [
//!     {"collective": "allreduce", "lo": 0, "hi": 8191, "algo": "recursive_doubling"},
//!     {"collective": "allreduce", "lo": 8192, "hi": null, "algo": "hierarchical"}]}]}
//! ```
//!
//! A **setting** is where a table applies: the number of ranks, of hosts, and
//! of ranks per host (0 when hosts differ). **Choices** are inclusive byte
//! ranges of a collective's full buffer (as `CADENCE_ALGO` counts them;
//! `hi: null` = no upper end). The optional **model** holds the cost model's
//! parameters measured on that setting, used for sizes and collectives the
//! choices do not cover.
//!
//! Every rank must choose alike, so every rank publishes a hash of the file
//! it loaded at bootstrap and a communicator whose ranks loaded different
//! tables refuses to start (see `comm::bootstrap`).

use crate::schedule::{Algo, CostModel, Topology};
use crate::types::CollKind;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub collective: String,
    pub lo: u64,
    pub hi: Option<u64>,
    pub algo: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Setting {
    pub nranks: usize,
    pub nhosts: usize,
    pub ranks_per_host: usize,
    #[serde(default)]
    pub note: String,
    #[serde(default)]
    pub model: Option<CostModel>,
    #[serde(default)]
    pub choices: Vec<Choice>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuningFile {
    pub version: u32,
    pub settings: Vec<Setting>,
}

/// A setting's choices, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    pub choices: Vec<(CollKind, u64, u64, Algo)>,
    pub model: Option<CostModel>,
    pub note: String,
}

impl Tuned {
    /// The tuned algorithm for `kind` at `bytes`, if a range covers it.
    pub fn lookup(&self, kind: CollKind, bytes: u64) -> Option<Algo> {
        self.choices
            .iter()
            .find(|(k, lo, hi, _)| *k == kind && (*lo..=*hi).contains(&bytes))
            .map(|c| c.3)
    }
}

/// The key a setting is found by.
pub fn setting_of(topo: &Topology) -> (usize, usize, usize) {
    (
        topo.nranks(),
        topo.nhosts(),
        topo.uniform_ranks_per_host().unwrap_or(0),
    )
}

/// Where `cadence tune` writes and start-up looks when `CADENCE_TUNING_FILE`
/// is not set: `$XDG_CACHE_HOME/cadence/tuning.json`, else
/// `~/.cache/cadence/tuning.json`.
/// (`get` reads the environment.)
pub fn default_path(get: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let base = get("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| get("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("cadence").join("tuning.json"))
}

impl TuningFile {
    pub fn parse(text: &str, origin: &Path) -> Result<TuningFile, String> {
        let f: TuningFile = serde_json::from_str(text)
            .map_err(|e| format!("tuning file {}: {e}", origin.display()))?;
        if f.version != 1 {
            return Err(format!(
                "tuning file {}: version {} (this cadence reads version 1)",
                origin.display(),
                f.version
            ));
        }
        for s in &f.settings {
            s.parsed()
                .map_err(|e| format!("tuning file {}: {e}", origin.display()))?;
        }
        Ok(f)
    }

    pub fn load(path: &Path) -> Result<TuningFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("tuning file {}: {e}", path.display()))?;
        TuningFile::parse(&text, path)
    }

    /// The table for this topology, if the file has one.
    pub fn for_topology(&self, topo: &Topology) -> Option<Tuned> {
        let key = setting_of(topo);
        self.settings
            .iter()
            .find(|s| (s.nranks, s.nhosts, s.ranks_per_host) == key)
            .map(|s| s.parsed().expect("checked when loaded"))
    }
}

impl Setting {
    fn parsed(&self) -> Result<Tuned, String> {
        let where_ = format!(
            "setting nranks {} nhosts {} ranks_per_host {}",
            self.nranks, self.nhosts, self.ranks_per_host
        );
        let mut choices = Vec::new();
        for c in &self.choices {
            let kind = CollKind::from_name(&c.collective)
                .ok_or_else(|| format!("{where_}: unknown collective {:?}", c.collective))?;
            let algo = Algo::from_name(&c.algo)
                .filter(|a| crate::schedule::algos_for(kind).contains(a))
                .ok_or_else(|| format!("{where_}: {:?} is not an algorithm of {kind}", c.algo))?;
            let hi = c.hi.unwrap_or(u64::MAX);
            if c.lo > hi {
                return Err(format!("{where_}: {kind} range {}-{hi} is empty", c.lo));
            }
            choices.push((kind, c.lo, hi, algo));
        }
        Ok(Tuned {
            choices,
            model: self.model,
            note: self.note.clone(),
        })
    }
}

/// A stable hash of a file's text (FNV-1a), to compare across ranks.
pub fn text_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"version": 1, "settings": [
        {"nranks": 4, "nhosts": 2, "ranks_per_host": 2,
         "choices": [
          {"collective": "allreduce", "lo": 0, "hi": 8191, "algo": "recursive_doubling"},
          {"collective": "allreduce", "lo": 8192, "hi": null, "algo": "hierarchical"}]}]}"#;

    #[test]
    fn a_table_applies_to_its_setting_only() {
        let f = TuningFile::parse(GOOD, Path::new("t.json")).unwrap();
        let two_by_two = Topology::from_hosts(&[0, 0, 1, 1]);
        let t = f.for_topology(&two_by_two).unwrap();
        assert_eq!(
            t.lookup(CollKind::AllReduce, 100),
            Some(Algo::RecursiveDoubling)
        );
        assert_eq!(
            t.lookup(CollKind::AllReduce, 1 << 40),
            Some(Algo::Hierarchical)
        );
        assert_eq!(t.lookup(CollKind::AllGather, 100), None);
        assert!(f.for_topology(&Topology::single_host(4)).is_none());
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let bad = GOOD.replace("hierarchical", "pairwise");
        let e = TuningFile::parse(&bad, Path::new("t.json")).unwrap_err();
        assert!(
            e.contains("\"pairwise\" is not an algorithm of allreduce"),
            "{e}"
        );
        let e = TuningFile::parse("{", Path::new("t.json")).unwrap_err();
        assert!(e.starts_with("tuning file t.json: "), "{e}");
        let e = TuningFile::parse(
            &GOOD.replace("\"version\": 1", "\"version\": 2"),
            Path::new("t.json"),
        )
        .unwrap_err();
        assert!(e.contains("version 2"), "{e}");
    }
}
