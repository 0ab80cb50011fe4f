//! Configuration, read once from the environment (NCCL's conventions with a
//! `CADENCE_` prefix). Unknown or malformed values are errors, not silently
//! ignored: a typo in `CADENCE_ALGO` should not quietly benchmark the default.

use crate::schedule::Algo;
use crate::transport::shm::ShmConfig;
use crate::types::CollKind;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    Off,
    Warn,
    Info,
    Trace,
}

/// `CADENCE_ALGO`: `allreduce:ring;broadcast:binomial_tree` forces an
/// algorithm per collective; a bare `ring` forces it wherever it applies;
/// `^direct` excludes an algorithm from automatic choice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlgoOverride {
    pub forced: Vec<(Option<CollKind>, Algo)>,
    pub excluded: Vec<Algo>,
}

impl AlgoOverride {
    pub fn parse(s: &str) -> Result<AlgoOverride, String> {
        let mut out = AlgoOverride::default();
        for item in s.split([';', ',']).map(str::trim).filter(|x| !x.is_empty()) {
            let algo_of = |name: &str| {
                Algo::from_name(name).ok_or_else(|| {
                    let known: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
                    format!(
                        "CADENCE_ALGO: unknown algorithm {name:?} (known: {})",
                        known.join(", ")
                    )
                })
            };
            if let Some(name) = item.strip_prefix('^') {
                out.excluded.push(algo_of(name)?);
            } else if let Some((coll, name)) = item.split_once(':') {
                let kind = CollKind::from_name(coll)
                    .ok_or_else(|| format!("CADENCE_ALGO: unknown collective {coll:?}"))?;
                out.forced.push((Some(kind), algo_of(name)?));
            } else {
                out.forced.push((None, algo_of(item)?));
            }
        }
        Ok(out)
    }

    /// The forced algorithm for `kind`, if any (a per-collective entry beats a
    /// bare one).
    pub fn forced_for(&self, kind: CollKind) -> Option<(Algo, bool)> {
        if let Some((_, a)) = self.forced.iter().find(|(k, _)| *k == Some(kind)) {
            return Some((*a, true));
        }
        self.forced
            .iter()
            .find(|(k, _)| k.is_none())
            .map(|(_, a)| (*a, false))
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub timeout: Duration,
    pub algo: AlgoOverride,
    pub shm: ShmConfig,
    pub nstreams: usize,
    pub flight_recorder: usize,
    pub dump_dir: Option<PathBuf>,
    pub debug: DebugLevel,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            algo: AlgoOverride::default(),
            shm: ShmConfig::default(),
            nstreams: 2,
            flight_recorder: 1024,
            dump_dir: None,
            debug: DebugLevel::Warn,
        }
    }
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{name}={v:?} is not a valid number"))
}

impl Config {
    /// Reads the `CADENCE_*` variables through `get` (the environment in
    /// production, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = get("CADENCE_TIMEOUT") {
            let secs: f64 = num("CADENCE_TIMEOUT", &v)?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(format!(
                    "CADENCE_TIMEOUT={v:?} must be a positive number of seconds"
                ));
            }
            c.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = get("CADENCE_ALGO") {
            c.algo = AlgoOverride::parse(&v)?;
        }
        if let Some(v) = get("CADENCE_SHM_SLOT_BYTES") {
            let b: usize = num("CADENCE_SHM_SLOT_BYTES", &v)?;
            if b < 4096 || !b.is_multiple_of(64) {
                return Err(
                    "CADENCE_SHM_SLOT_BYTES must be a multiple of 64, at least 4096".into(),
                );
            }
            c.shm.slot_bytes = b;
        }
        if let Some(v) = get("CADENCE_SHM_SLOTS") {
            c.shm.nslots = num::<usize>("CADENCE_SHM_SLOTS", &v)?.max(2);
        }
        if let Some(v) = get("CADENCE_NSTREAMS") {
            c.nstreams = num::<usize>("CADENCE_NSTREAMS", &v)?.clamp(1, 64);
        }
        if let Some(v) = get("CADENCE_FLIGHT_RECORDER") {
            c.flight_recorder = num::<usize>("CADENCE_FLIGHT_RECORDER", &v)?.max(1);
        }
        if let Some(v) = get("CADENCE_DUMP_DIR") {
            if !v.is_empty() {
                c.dump_dir = Some(PathBuf::from(v));
            }
        }
        if let Some(v) = get("CADENCE_DEBUG") {
            c.debug = match v.to_ascii_uppercase().as_str() {
                "" | "OFF" | "NONE" => DebugLevel::Off,
                "WARN" => DebugLevel::Warn,
                "INFO" => DebugLevel::Info,
                "TRACE" => DebugLevel::Trace,
                _ => return Err(format!("CADENCE_DEBUG={v:?}: use WARN, INFO or TRACE")),
            };
        }
        Ok(c)
    }

    pub fn from_env() -> Result<Config, String> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algo_override_parses_forms() {
        let o = AlgoOverride::parse("allreduce:ring;^direct, recursive_doubling").unwrap();
        assert_eq!(o.forced_for(CollKind::AllReduce), Some((Algo::Ring, true)));
        assert_eq!(
            o.forced_for(CollKind::AllGather),
            Some((Algo::RecursiveDoubling, false))
        );
        assert_eq!(o.excluded, vec![Algo::Direct]);
        assert!(AlgoOverride::parse("allreduce:rign")
            .unwrap_err()
            .contains("rign"));
        assert!(AlgoOverride::parse("allredux:ring")
            .unwrap_err()
            .contains("allredux"));
    }

    #[test]
    fn config_rejects_bad_values() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(Config::from_lookup(env(&[("CADENCE_TIMEOUT", "abc")])).is_err());
        assert!(Config::from_lookup(env(&[("CADENCE_TIMEOUT", "-1")])).is_err());
        assert!(Config::from_lookup(env(&[("CADENCE_DEBUG", "LOUD")])).is_err());
        let c = Config::from_lookup(env(&[
            ("CADENCE_TIMEOUT", "2.5"),
            ("CADENCE_NSTREAMS", "4"),
        ]))
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.nstreams, 4);
    }
}
