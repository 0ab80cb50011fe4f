//! Configuration, read once from the environment (NCCL's conventions with a
//! `CADENCE_` prefix). Unknown or malformed values are errors, not silently
//! ignored: a typo in `CADENCE_ALGO` should not quietly benchmark the default.

use crate::choice::overrides::parse_size;
use crate::choice::overrides::AlgoOverride;
use crate::choice::tuned::TuningFile;
use crate::fabric::file::TopoFile;
use crate::transport::shm::{ShmConfig, Streamed};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    Off,
    Warn,
    Info,
    Trace,
}

/// `CADENCE_SHM_STREAM`: the collectives whose large messages stream
/// through shared memory instead of going by single copy, a list from
/// `reduce` and `broadcast`, or `none`.
fn parse_streamed(v: &str) -> Result<Streamed, String> {
    let mut out = Streamed::NONE;
    for item in v.split([',', ';']).map(str::trim).filter(|s| !s.is_empty()) {
        match item {
            "reduce" => out.reduce = true,
            "broadcast" => out.broadcast = true,
            "none" => {}
            _ => {
                return Err(format!(
                    "CADENCE_SHM_STREAM={v:?}: a list from reduce, broadcast (or none)"
                ))
            }
        }
    }
    Ok(out)
}

/// When TCP links to other hosts are made (`CADENCE_CONNECT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectMode {
    /// On first use: a rank holds links to the peers it talks to.
    Lazy,
    /// Every link at set-up (the full mesh).
    Eager,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub timeout: Duration,
    pub algo: AlgoOverride,
    pub shm: ShmConfig,
    pub nstreams: usize,
    /// When TCP links are made (`CADENCE_CONNECT`): on first use (`lazy`,
    /// the default) or every one at set-up (`eager`: the full mesh, every
    /// link proven before the first operation).
    pub connect: ConnectMode,
    /// Whether a split uses its root's TCP links (`CADENCE_SPLIT_LINKS`:
    /// `share`, the default) or makes its own (`own`: for programs whose
    /// ranks call the communicators in different orders).
    pub share_split_links: bool,
    pub flight_recorder: usize,
    /// Messages kept in the flight recorder's message ring
    /// (`CADENCE_RECORD_MESSAGES`; 0: no per-message records).
    pub record_messages: usize,
    pub dump_dir: Option<PathBuf>,
    pub debug: DebugLevel,
    /// The tuning file in force (`CADENCE_TUNING_FILE`, else the default
    /// location when a file is there), with the hash of its text.
    pub tuning: Option<LoadedTuning>,
    /// Measure the cost model at start-up when a job spans hosts and no
    /// tuning table gives one (`CADENCE_CALIBRATE`, on by default; `0` turns
    /// it off: see `comm/calibrate.rs`; rank 0's value decides for everyone).
    pub calibrate: bool,
    /// `CADENCE_SPIN_US` / `CADENCE_YIELD_US`: how long an idle wait spins,
    /// then yields, before it sleeps; unset: the engine's policy (which
    /// depends on whether ranks outnumber cores). For measuring a machine.
    pub spin: Option<Duration>,
    pub yield_for: Option<Duration>,
    /// Where the ring order comes from (`CADENCE_TOPO_FILE`): a topology
    /// file, `none` (hosts by lowest rank), or, unset, a profile of the
    /// network at start-up (`comm/order.rs`).
    pub topo: TopoSource,
    /// `CADENCE_TOPO_PAIRS_MAX`: most hosts whose every pair the start-up
    /// profile measures alone (4); beyond, it runs shifted rounds only
    /// (`fabric::probe`).
    pub topo_pairs_max: usize,
    /// `CADENCE_PATH_TIMEOUT`: how long one path of a TCP link (a NIC pair)
    /// may hold bytes while its peer answers nothing before its chunks go
    /// again on the other paths. Far below `timeout`.
    pub path_timeout: Duration,
    /// The cluster's path planner (`CADENCE_PLANNER`, with the token in
    /// `CADENCE_PLANNER_TOKEN_FILE`): TCP streams bind the source ports it
    /// plans (`fabric::planner`).
    pub planner: Option<crate::fabric::planner::PlannerAddr>,
}

/// A file a `CADENCE_*_FILE` variable named, parsed, with the hash of its
/// text (every rank publishes it at bootstrap: ranks must load alike).
#[derive(Clone, Debug)]
pub struct Loaded<T> {
    pub path: PathBuf,
    pub file: Arc<T>,
    pub hash: u64,
}

pub type LoadedTuning = Loaded<TuningFile>;
pub type LoadedTopo = Loaded<TopoFile>;

/// Where a communicator's ring order comes from.
#[derive(Clone, Debug)]
pub enum TopoSource {
    /// `CADENCE_TOPO_FILE=none`: hosts by lowest rank.
    Off,
    /// `CADENCE_TOPO_FILE=PATH`: the path finder over that file.
    File(LoadedTopo),
    /// Unset: a job across three hosts or more profiles the network at
    /// start-up (rank 0 decides), or reads the profile rank 0 cached for
    /// the same hosts in `cache` (`CADENCE_TOPO_CACHE`, default
    /// `~/.cache/cadence`; `none`: no cache, profile every time). Hosts
    /// emulated on loopback have no network between them to profile and
    /// are not, unless `loopback` (`CADENCE_TOPO_FILE=profile`).
    Profile {
        cache: Option<PathBuf>,
        loopback: bool,
    },
}

impl TopoSource {
    /// The file in force, if one was named.
    pub fn file(&self) -> Option<&LoadedTopo> {
        match self {
            TopoSource::File(f) => Some(f),
            _ => None,
        }
    }

    /// What each rank publishes at bootstrap: ranks must agree.
    pub fn fingerprint(&self) -> String {
        match self {
            TopoSource::Off => String::new(),
            TopoSource::File(t) => format!("{}#{:016x}", t.path.display(), t.hash),
            TopoSource::Profile {
                loopback: false, ..
            } => "#profile at start-up".into(),
            TopoSource::Profile { loopback: true, .. } => {
                "#profile at start-up, loopback too".into()
            }
        }
    }
}

impl<T> Loaded<T> {
    /// Reads and parses the file `var` names (errors name both).
    fn read(
        var: &str,
        path: PathBuf,
        parse: impl Fn(&str, &Path) -> Result<T, String>,
    ) -> Result<Loaded<T>, String> {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{var}: cannot read {}: {e}", path.display()))?;
        let file = parse(&text, &path)?;
        Ok(Loaded {
            path,
            file: Arc::new(file),
            hash: crate::choice::tuned::text_hash(&text),
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            algo: AlgoOverride::default(),
            shm: ShmConfig::default(),
            nstreams: 2,
            connect: ConnectMode::Lazy,
            share_split_links: true,
            flight_recorder: 1024,
            record_messages: 4096,
            dump_dir: None,
            debug: DebugLevel::Warn,
            tuning: None,
            topo: TopoSource::Profile {
                cache: None,
                loopback: false,
            },
            topo_pairs_max: crate::fabric::probe::STARTUP_PAIRS_MAX,
            calibrate: true,
            spin: None,
            yield_for: None,
            path_timeout: crate::transport::tcp::PATH_TIMEOUT,
            planner: None,
        }
    }
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{name}={v:?} is not a valid number"))
}

/// A positive, finite number of seconds.
fn seconds(name: &str, v: &str) -> Result<Duration, String> {
    let secs: f64 = num(name, v)?;
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(format!("{name}={v:?} must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl Config {
    /// Reads the `CADENCE_*` variables through `get` (the environment in
    /// production, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = get("CADENCE_TIMEOUT") {
            c.timeout = seconds("CADENCE_TIMEOUT", &v)?;
        }
        if let Some(v) = get("CADENCE_PATH_TIMEOUT") {
            c.path_timeout = seconds("CADENCE_PATH_TIMEOUT", &v)?;
        }
        if let Some(address) = get("CADENCE_PLANNER").filter(|v| !v.trim().is_empty()) {
            let token_file = get("CADENCE_PLANNER_TOKEN_FILE").ok_or_else(|| {
                format!(
                    "CADENCE_PLANNER={address:?} needs CADENCE_PLANNER_TOKEN_FILE (the \
                     cluster token's file)"
                )
            })?;
            c.planner = Some(crate::fabric::planner::PlannerAddr {
                address: address.trim().to_string(),
                token_file,
            });
        }
        if let Some(v) = get("CADENCE_ALGO") {
            c.algo = AlgoOverride::parse(&v)?;
        }
        for old in ["CADENCE_SHM_SLOT_BYTES", "CADENCE_SHM_SLOTS"] {
            if get(old).is_some() {
                return Err(format!(
                    "{old} is gone: shared-memory rings now have CADENCE_SHM_FRAME_BYTES \
                     (the largest frame), CADENCE_SHM_FRAMES (frames in flight) and \
                     CADENCE_SHM_RING_BYTES (payload space)"
                ));
            }
        }
        let bytes = |name: &str, v: &str, pow2: bool| -> Result<usize, String> {
            let b = parse_size(v, v).ok().and_then(|b| usize::try_from(b).ok());
            match b {
                Some(b)
                    if (4096..1 << 31).contains(&b)
                        && b.is_multiple_of(128)
                        && (!pow2 || b.is_power_of_two()) =>
                {
                    Ok(b)
                }
                _ => Err(format!(
                    "{name}={v:?}: bytes (K, M allowed) from 4096 below 2G, {}",
                    if pow2 {
                        "a power of two"
                    } else {
                        "a multiple of 128"
                    }
                )),
            }
        };
        if let Some(v) = get("CADENCE_SHM_FRAME_BYTES") {
            c.shm.frame_bytes = bytes("CADENCE_SHM_FRAME_BYTES", &v, false)?;
        }
        if let Some(v) = get("CADENCE_SHM_RING_BYTES") {
            c.shm.ring_bytes = bytes("CADENCE_SHM_RING_BYTES", &v, true)?;
        }
        if c.shm.ring_bytes < c.shm.frame_bytes {
            return Err(format!(
                "CADENCE_SHM_RING_BYTES ({}) must be at least CADENCE_SHM_FRAME_BYTES ({})",
                c.shm.ring_bytes, c.shm.frame_bytes
            ));
        }
        if let Some(v) = get("CADENCE_SHM_FRAMES") {
            let n = num::<usize>("CADENCE_SHM_FRAMES", &v)?;
            if !(2..=1 << 20).contains(&n) || !n.is_power_of_two() {
                return Err(format!(
                    "CADENCE_SHM_FRAMES={v:?}: a power of two from 2 to 1048576"
                ));
            }
            c.shm.nframes = n;
        }
        if let Some(v) = get("CADENCE_SHM_CMA_MIN") {
            let bytes = parse_size(&v, &v).map_err(|_| {
                format!("CADENCE_SHM_CMA_MIN={v:?}: bytes, optionally with K, M or G (0: off)")
            })?;
            c.shm.cma_min = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        if let Some(v) = get("CADENCE_SHM_STREAM") {
            c.shm.stream = parse_streamed(&v)?;
        }
        if let Some(v) = get("CADENCE_TOPO_PAIRS_MAX") {
            c.topo_pairs_max = num::<usize>("CADENCE_TOPO_PAIRS_MAX", &v)?;
        }
        if let Some(v) = get("CADENCE_NSTREAMS") {
            c.nstreams = num::<usize>("CADENCE_NSTREAMS", &v)?.clamp(1, 64);
        }
        if let Some(v) = get("CADENCE_SPLIT_LINKS") {
            c.share_split_links = match v.trim().to_ascii_lowercase().as_str() {
                "share" | "" => true,
                "own" => false,
                _ => return Err(format!("CADENCE_SPLIT_LINKS={v:?}: use share or own")),
            };
        }
        if let Some(v) = get("CADENCE_CONNECT") {
            c.connect = match v.trim().to_ascii_lowercase().as_str() {
                "lazy" | "" => ConnectMode::Lazy,
                "eager" => ConnectMode::Eager,
                _ => return Err(format!("CADENCE_CONNECT={v:?}: use lazy or eager")),
            };
        }
        if let Some(v) = get("CADENCE_FLIGHT_RECORDER") {
            c.flight_recorder = num::<usize>("CADENCE_FLIGHT_RECORDER", &v)?.max(1);
        }
        if let Some(v) = get("CADENCE_RECORD_MESSAGES") {
            c.record_messages = num::<usize>("CADENCE_RECORD_MESSAGES", &v)?;
        }
        if let Some(v) = get("CADENCE_DUMP_DIR") {
            if !v.is_empty() {
                c.dump_dir = Some(PathBuf::from(v));
            }
        }
        if let Some(v) = get("CADENCE_SPIN_US") {
            c.spin = Some(Duration::from_micros(num("CADENCE_SPIN_US", &v)?));
        }
        if let Some(v) = get("CADENCE_YIELD_US") {
            c.yield_for = Some(Duration::from_micros(num("CADENCE_YIELD_US", &v)?));
        }
        if let Some(v) = get("CADENCE_CALIBRATE") {
            c.calibrate = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "on" | "yes" | "true" => true,
                "0" | "off" | "no" | "false" => false,
                _ => return Err(format!("CADENCE_CALIBRATE={v:?}: use 1 or 0")),
            };
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
        // An explicitly named file must exist; the default one may not;
        // `none` turns tuning tables off (tests use it, for the defaults).
        let (path, required) = match get("CADENCE_TUNING_FILE").filter(|v| !v.is_empty()) {
            Some(v) if v.eq_ignore_ascii_case("none") => (None, false),
            Some(v) => (Some(PathBuf::from(v)), true),
            None => (crate::choice::tuned::default_path(&get), false),
        };
        if let Some(path) = path {
            if required || path.exists() {
                c.tuning = Some(Loaded::read(
                    "CADENCE_TUNING_FILE",
                    path,
                    TuningFile::parse,
                )?);
            }
        }
        let cache = || match get("CADENCE_TOPO_CACHE").filter(|v| !v.is_empty()) {
            Some(v) if v.eq_ignore_ascii_case("none") => None,
            Some(v) => Some(PathBuf::from(v)),
            None => {
                crate::choice::tuned::default_path(&get).and_then(|p| p.parent().map(PathBuf::from))
            }
        };
        c.topo = match get("CADENCE_TOPO_FILE").filter(|v| !v.is_empty()) {
            Some(v) if v.eq_ignore_ascii_case("none") => TopoSource::Off,
            Some(v) if v.eq_ignore_ascii_case("profile") => TopoSource::Profile {
                cache: cache(),
                loopback: true,
            },
            Some(v) => TopoSource::File(Loaded::read(
                "CADENCE_TOPO_FILE",
                PathBuf::from(v),
                TopoFile::parse,
            )?),
            None => TopoSource::Profile {
                cache: cache(),
                loopback: false,
            },
        };
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
        let own = Config::from_lookup(env(&[("CADENCE_SPLIT_LINKS", "Own")])).unwrap();
        assert!(!own.share_split_links);
        assert!(Config::from_lookup(env(&[])).unwrap().share_split_links);
        let e = Config::from_lookup(env(&[("CADENCE_SPLIT_LINKS", "mine")])).unwrap_err();
        assert!(e.contains("share or own"), "{e}");
        let missing = Config::from_lookup(env(&[("CADENCE_TUNING_FILE", "/nonexistent/t.json")]));
        assert!(missing.unwrap_err().contains("/nonexistent/t.json"));
        let off = Config::from_lookup(env(&[("CADENCE_TUNING_FILE", "none"), ("HOME", "/")]));
        assert!(off.unwrap().tuning.is_none());
        let topo = Config::from_lookup(env(&[("CADENCE_TOPO_FILE", "/nonexistent/topo.json")]));
        assert!(topo
            .unwrap_err()
            .starts_with("CADENCE_TOPO_FILE: cannot read /nonexistent/topo.json"));
        let none = Config::from_lookup(env(&[("CADENCE_TOPO_FILE", "none")]));
        assert!(matches!(none.unwrap().topo, TopoSource::Off));
        // Unset: profile at start-up, cached beside the tuning table unless
        // CADENCE_TOPO_CACHE says otherwise.
        let unset = Config::from_lookup(env(&[("HOME", "/h")])).unwrap();
        assert!(
            matches!(&unset.topo, TopoSource::Profile { cache: Some(p), loopback: false } if p == Path::new("/h/.cache/cadence")),
            "{:?}",
            unset.topo
        );
        let here = Config::from_lookup(env(&[("HOME", "/h"), ("CADENCE_TOPO_CACHE", "/c")]));
        assert!(
            matches!(here.unwrap().topo, TopoSource::Profile { cache: Some(p), loopback: false } if p == Path::new("/c"))
        );
        let nowhere = Config::from_lookup(env(&[("CADENCE_TOPO_CACHE", "none")]));
        assert!(matches!(
            nowhere.unwrap().topo,
            TopoSource::Profile { cache: None, .. }
        ));
        // `profile`: hosts on loopback are profiled too.
        let forced = Config::from_lookup(env(&[("HOME", "/h"), ("CADENCE_TOPO_FILE", "PROFILE")]));
        assert!(matches!(
            forced.unwrap().topo,
            TopoSource::Profile {
                cache: Some(_),
                loopback: true
            }
        ));
        let e = Config::from_lookup(env(&[("CADENCE_PLANNER", "unix:/p.sock")])).unwrap_err();
        assert!(e.contains("CADENCE_PLANNER_TOKEN_FILE"), "{e}");
        let p = Config::from_lookup(env(&[
            ("CADENCE_PLANNER", " unix:/p.sock "),
            ("CADENCE_PLANNER_TOKEN_FILE", "/t"),
        ]));
        let at = p.unwrap().planner.unwrap();
        assert_eq!(
            (at.address.as_str(), at.token_file.as_str()),
            ("unix:/p.sock", "/t")
        );
        let e = Config::from_lookup(env(&[("CADENCE_ALGO", "allreduce:ring:8K-1K")])).unwrap_err();
        assert!(e.contains("CADENCE_ALGO") && e.contains("8K-1K"), "{e}");
        let c = Config::from_lookup(env(&[
            ("CADENCE_TIMEOUT", "2.5"),
            ("CADENCE_NSTREAMS", "4"),
        ]))
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.nstreams, 4);
        assert_eq!((c.spin, c.yield_for), (None, None));
        let w = Config::from_lookup(env(&[
            ("CADENCE_SPIN_US", "0"),
            ("CADENCE_YIELD_US", "20000"),
        ]))
        .unwrap();
        assert_eq!(w.spin, Some(Duration::ZERO));
        assert_eq!(w.yield_for, Some(Duration::from_millis(20)));
        let e = Config::from_lookup(env(&[("CADENCE_YIELD_US", "-5")])).unwrap_err();
        assert!(e.contains("CADENCE_YIELD_US"), "{e}");
        assert_eq!(c.shm.cma_min, 256 << 10);
        assert_eq!(
            (c.shm.frame_bytes, c.shm.nframes, c.shm.ring_bytes),
            (64 << 10, 64, 512 << 10)
        );
        let g = Config::from_lookup(env(&[
            ("CADENCE_SHM_FRAME_BYTES", "4K"),
            ("CADENCE_SHM_RING_BYTES", "8192"),
            ("CADENCE_SHM_FRAMES", "4"),
        ]))
        .unwrap();
        assert_eq!(
            (g.shm.frame_bytes, g.shm.nframes, g.shm.ring_bytes),
            (4096, 4, 8192)
        );
        for bad in [
            &[("CADENCE_SHM_SLOT_BYTES", "4096")][..],
            &[("CADENCE_SHM_FRAME_BYTES", "100")][..],
            &[("CADENCE_SHM_RING_BYTES", "12K")][..],
            &[("CADENCE_SHM_FRAMES", "3")][..],
            &[
                ("CADENCE_SHM_FRAME_BYTES", "1M"),
                ("CADENCE_SHM_RING_BYTES", "64K"),
            ][..],
        ] {
            let e = Config::from_lookup(env(bad)).unwrap_err();
            assert!(e.contains(bad.last().unwrap().0), "{e}");
        }
        let m = Config::from_lookup(env(&[("CADENCE_SHM_CMA_MIN", "1M")])).unwrap();
        assert_eq!(m.shm.cma_min, 1 << 20);
        let off = Config::from_lookup(env(&[("CADENCE_SHM_CMA_MIN", "0")])).unwrap();
        assert_eq!(off.shm.cma_min, 0);
        let e = Config::from_lookup(env(&[("CADENCE_SHM_CMA_MIN", "lots")])).unwrap_err();
        assert!(e.contains("CADENCE_SHM_CMA_MIN"), "{e}");
        assert_eq!(m.shm.stream, Streamed::DEFAULT);
        let none = Config::from_lookup(env(&[("CADENCE_SHM_STREAM", "none")])).unwrap();
        assert_eq!(none.shm.stream, Streamed::NONE);
        let b = Config::from_lookup(env(&[("CADENCE_SHM_STREAM", "broadcast")])).unwrap();
        let (reduce, broadcast) = (false, true);
        assert_eq!(b.shm.stream, Streamed { reduce, broadcast });
        let both = Config::from_lookup(env(&[("CADENCE_SHM_STREAM", "reduce, broadcast")]));
        let (reduce, broadcast) = (true, true);
        assert_eq!(both.unwrap().shm.stream, Streamed { reduce, broadcast });
        let e = Config::from_lookup(env(&[("CADENCE_SHM_STREAM", "allgather")])).unwrap_err();
        assert!(
            e.contains("CADENCE_SHM_STREAM") && e.contains("reduce, broadcast"),
            "{e}"
        );
    }
}
