//! Configuration, read once from the environment (NCCL's conventions with a
//! `CADENCE_` prefix). Unknown or malformed values are errors, not silently
//! ignored: a typo in `CADENCE_ALGO` should not quietly benchmark the default.

use crate::fabric::file::TopoFile;
use crate::schedule::Algo;
use crate::transport::shm::{ShmConfig, Streamed};
use crate::tuning::TuningFile;
use crate::types::CollKind;
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

/// One `CADENCE_ALGO` entry that forces an algorithm for one collective at
/// the call sizes `lo..=hi` (bytes of the collective's full buffer, as
/// [`crate::schedule::default_algo`] counts them; `hi == u64::MAX` is `max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoRange {
    pub kind: CollKind,
    pub algo: Algo,
    pub lo: u64,
    pub hi: u64,
}

impl AlgoRange {
    pub fn contains(&self, bytes: u64) -> bool {
        self.lo <= bytes && bytes <= self.hi
    }
    pub fn all_sizes(&self) -> bool {
        self.lo == 0 && self.hi == u64::MAX
    }
}

impl std::fmt::Display for AlgoRange {
    /// As `CADENCE_ALGO` writes it: `allreduce:ring:8K-max`, or
    /// `allreduce:ring` for all sizes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.algo.name())?;
        if !self.all_sizes() {
            write!(f, ":{}-{}", fmt_size(self.lo), fmt_size(self.hi))?;
        }
        Ok(())
    }
}

/// A byte size as `CADENCE_ALGO` writes it: `max`, `64K`, `1M`, `8193`.
pub fn fmt_size(b: u64) -> String {
    const K: u64 = 1 << 10;
    if b == u64::MAX {
        return "max".into();
    }
    for (unit, m) in [("G", K * K * K), ("M", K * K), ("K", K)] {
        if b > 0 && b.is_multiple_of(m) {
            return format!("{}{unit}", b / m);
        }
    }
    b.to_string()
}

/// `CADENCE_ALGO`: which algorithms the automatic choice may or must use.
///
/// The value is a list of items separated by `;` or `,` (whitespace around
/// items and fields is ignored). Each item is one of:
///
/// | item | meaning |
/// | --- | --- |
/// | `algo` | force `algo` for every call it applies to (elsewhere: the default) |
/// | `^algo` | exclude `algo` from the automatic choice of every collective |
/// | `coll:algo` | force `algo` for every call of `coll` (= `coll:algo:0-max`) |
/// | `coll:^algo` | exclude `algo` from the automatic choice of `coll` |
/// | `coll:algo:lo-hi` | force `algo` for calls of `coll` of `lo..=hi` bytes |
/// | `algo:lo-hi` | the same, for the collective of the item just before |
///
/// So `allreduce:recursive_doubling:0-8K;ring:8193-max;broadcast:binomial_tree`
/// forces two allreduce ranges and every broadcast. The last form continues
/// only a collective named by the item directly before it (any `coll:` form
/// or another continuation); after a bare `algo` or `^algo` it is an error.
///
/// Sizes are bytes of the collective's full buffer, as
/// [`crate::schedule::default_algo`] counts them (the vector reduced or
/// broadcast, allgather's gathered output, reduce_scatter's input): a decimal
/// number with an optional suffix `K`, `M` or `G` (KiB, MiB, GiB; either
/// case), or `max` (no upper bound). Both ends are inclusive.
///
/// The grammar is unambiguous without knowing the names: a field that starts
/// with a digit or contains `-` is a size range (no algorithm or collective
/// name does either), one that starts with `^` an exclusion.
///
/// Choice, strongest first: the algorithm a call passes itself; the
/// `coll:` range containing the call's size (an error at call time if it
/// does not apply there); the first bare `algo` that applies; the size-based
/// default, or, if that is excluded, the first algorithm of
/// [`crate::schedule::algos_for`] that is neither excluded nor inapplicable.
/// Exclusions touch only the automatic choice, so `allreduce:ring:0-1M;
/// allreduce:^ring` means "ring up to 1 MiB and never above".
///
/// Errors (all name the offending item): unknown collective or algorithm,
/// an algorithm that is not one of the collective's, a malformed size, `lo >
/// hi`, two ranges of one collective that overlap (`coll:algo` covers all
/// sizes, so it overlaps any other range of `coll`), a range with no
/// collective before it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlgoOverride {
    /// `coll:algo[:lo-hi]` items, in the order given (never overlapping
    /// within one collective).
    pub ranges: Vec<AlgoRange>,
    /// Bare `algo` items, in the order given.
    pub everywhere: Vec<Algo>,
    /// `^algo` (`None`: every collective) and `coll:^algo` items.
    pub excluded: Vec<(Option<CollKind>, Algo)>,
}

fn algo_named(name: &str, item: &str) -> Result<Algo, String> {
    Algo::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
        format!(
            "CADENCE_ALGO: unknown algorithm {name:?} in {item:?} (known: {})",
            known.join(", ")
        )
    })
}

fn algo_of_coll(kind: CollKind, name: &str, item: &str) -> Result<Algo, String> {
    let a = algo_named(name, item)?;
    let takes = crate::schedule::algos_for(kind);
    if !takes.contains(&a) {
        let names: Vec<&str> = takes.iter().map(|a| a.name()).collect();
        return Err(format!(
            "CADENCE_ALGO: {name} is not an algorithm of {kind} in {item:?} (it takes {})",
            names.join(", ")
        ));
    }
    Ok(a)
}

fn coll_named(name: &str, item: &str) -> Result<CollKind, String> {
    CollKind::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = CollKind::ALL.iter().map(|k| k.name()).collect();
        format!(
            "CADENCE_ALGO: unknown collective {name:?} in {item:?} (known: {})",
            known.join(", ")
        )
    })
}

/// Whether an item's field is a size range rather than a name.
fn is_range(field: &str) -> bool {
    field.starts_with(|c: char| c.is_ascii_digit()) || field.contains('-')
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

fn parse_size(s: &str, item: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("max") {
        return Ok(u64::MAX);
    }
    let bad = || {
        format!(
            "CADENCE_ALGO: bad size {s:?} in {item:?} (bytes, optionally with K, M or G, or max)"
        )
    };
    let (digits, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(bad()),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .filter(|&v| v != u64::MAX)
        .ok_or_else(|| format!("CADENCE_ALGO: size {s:?} in {item:?} is too large (use max)"))
}

fn parse_range(r: &str, item: &str) -> Result<(u64, u64), String> {
    let (lo, hi) = r.split_once('-').ok_or_else(|| {
        format!("CADENCE_ALGO: {r:?} in {item:?} is not a size range lo-hi (like 0-64K or 1M-max)")
    })?;
    let (lo, hi) = (parse_size(lo, item)?, parse_size(hi, item)?);
    if lo > hi {
        return Err(format!(
            "CADENCE_ALGO: range {r:?} in {item:?} is empty (lo > hi)"
        ));
    }
    Ok((lo, hi))
}

impl AlgoOverride {
    pub fn parse(s: &str) -> Result<AlgoOverride, String> {
        let mut out = AlgoOverride::default();
        // The item each range came from, for overlap messages.
        let mut sources: Vec<String> = Vec::new();
        // The collective a bare `algo:lo-hi` item continues.
        let mut context: Option<CollKind> = None;
        for item in s.split([';', ',']).map(str::trim).filter(|x| !x.is_empty()) {
            let fields: Vec<&str> = item.split(':').map(str::trim).collect();
            let range = match fields[..] {
                [f] => {
                    context = None;
                    match f.strip_prefix('^') {
                        Some(name) => out.excluded.push((None, algo_named(name.trim(), item)?)),
                        None => out.everywhere.push(algo_named(f, item)?),
                    }
                    None
                }
                [a, r] if is_range(r) => {
                    if CollKind::from_name(a).is_some() {
                        return Err(format!(
                            "CADENCE_ALGO: {item:?} names no algorithm (write {a}:ALGO:{r})"
                        ));
                    }
                    let Some(kind) = context else {
                        return Err(format!(
                            "CADENCE_ALGO: range {item:?} follows no collective \
                             (write COLLECTIVE:{item})"
                        ));
                    };
                    let algo = algo_of_coll(kind, a, item)?;
                    let (lo, hi) = parse_range(r, item)?;
                    Some(AlgoRange { kind, algo, lo, hi })
                }
                [c, a] => {
                    let kind = coll_named(c, item)?;
                    context = Some(kind);
                    match a.strip_prefix('^') {
                        Some(name) => {
                            let algo = algo_of_coll(kind, name.trim(), item)?;
                            out.excluded.push((Some(kind), algo));
                            None
                        }
                        None => Some(AlgoRange {
                            kind,
                            algo: algo_of_coll(kind, a, item)?,
                            lo: 0,
                            hi: u64::MAX,
                        }),
                    }
                }
                [c, a, r] => {
                    let kind = coll_named(c, item)?;
                    context = Some(kind);
                    if a.starts_with('^') {
                        return Err(format!(
                            "CADENCE_ALGO: {item:?}: an exclusion takes no size range"
                        ));
                    }
                    let algo = algo_of_coll(kind, a, item)?;
                    let (lo, hi) = parse_range(r, item)?;
                    Some(AlgoRange { kind, algo, lo, hi })
                }
                _ => {
                    return Err(format!(
                    "CADENCE_ALGO: {item:?} has too many ':' (at most collective:algorithm:lo-hi)"
                ))
                }
            };
            if let Some(r) = range {
                let clash = out
                    .ranges
                    .iter()
                    .position(|o| o.kind == r.kind && o.lo <= r.hi && r.lo <= o.hi);
                if let Some(i) = clash {
                    return Err(format!(
                        "CADENCE_ALGO: {item:?} overlaps {:?} (both cover {} sizes {}-{})",
                        sources[i],
                        r.kind,
                        fmt_size(r.lo.max(out.ranges[i].lo)),
                        fmt_size(r.hi.min(out.ranges[i].hi)),
                    ));
                }
                out.ranges.push(r);
                sources.push(item.to_string());
            }
        }
        Ok(out)
    }

    /// The range entry of `kind` that covers a call of `bytes`.
    pub fn range_for(&self, kind: CollKind, bytes: u64) -> Option<&AlgoRange> {
        self.ranges
            .iter()
            .find(|r| r.kind == kind && r.contains(bytes))
    }

    /// Whether `algo` is excluded from the automatic choice for `kind`.
    pub fn is_excluded(&self, kind: CollKind, algo: Algo) -> bool {
        self.excluded
            .iter()
            .any(|&(k, a)| a == algo && k.is_none_or(|k| k == kind))
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.everywhere.is_empty() && self.excluded.is_empty()
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub timeout: Duration,
    pub algo: AlgoOverride,
    pub shm: ShmConfig,
    pub nstreams: usize,
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
    /// `CADENCE_TOPO_PAIRS_MAX`: most hosts whose every pair a profile
    /// measures alone (16); beyond, it runs shifted rounds only
    /// (`fabric::probe`).
    pub topo_pairs_max: usize,
    /// `CADENCE_PATH_TIMEOUT`: how long one path of a TCP link (a NIC pair)
    /// may hold bytes while its peer answers nothing before its chunks go
    /// again on the other paths. Far below `timeout`.
    pub path_timeout: Duration,
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
    /// `~/.cache/cadence`; `none`: no cache, profile every time).
    Profile { cache: Option<PathBuf> },
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
            TopoSource::Profile { .. } => "#profile at start-up".into(),
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
            hash: crate::tuning::text_hash(&text),
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
            flight_recorder: 1024,
            record_messages: 4096,
            dump_dir: None,
            debug: DebugLevel::Warn,
            tuning: None,
            topo: TopoSource::Profile { cache: None },
            topo_pairs_max: crate::fabric::probe::PAIRS_MAX,
            calibrate: true,
            spin: None,
            yield_for: None,
            path_timeout: crate::transport::tcp::PATH_TIMEOUT,
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
            None => (crate::tuning::default_path(&get), false),
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
        c.topo = match get("CADENCE_TOPO_FILE").filter(|v| !v.is_empty()) {
            Some(v) if v.eq_ignore_ascii_case("none") => TopoSource::Off,
            Some(v) => TopoSource::File(Loaded::read(
                "CADENCE_TOPO_FILE",
                PathBuf::from(v),
                TopoFile::parse,
            )?),
            None => TopoSource::Profile {
                cache: match get("CADENCE_TOPO_CACHE").filter(|v| !v.is_empty()) {
                    Some(v) if v.eq_ignore_ascii_case("none") => None,
                    Some(v) => Some(PathBuf::from(v)),
                    None => crate::tuning::default_path(&get)
                        .and_then(|p| p.parent().map(PathBuf::from)),
                },
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
    fn algo_override_parses_old_forms() {
        let o = AlgoOverride::parse("allreduce:ring;^direct, recursive_doubling").unwrap();
        assert_eq!(
            o.range_for(CollKind::AllReduce, 12345),
            Some(&AlgoRange {
                kind: CollKind::AllReduce,
                algo: Algo::Ring,
                lo: 0,
                hi: u64::MAX
            })
        );
        assert_eq!(o.range_for(CollKind::AllGather, 0), None);
        assert_eq!(o.everywhere, vec![Algo::RecursiveDoubling]);
        assert_eq!(o.excluded, vec![(None, Algo::Direct)]);
        assert!(o.is_excluded(CollKind::AllGather, Algo::Direct));
        assert_eq!(o.ranges[0].to_string(), "allreduce:ring");
        // The strings the tests and the launcher write.
        let o = AlgoOverride::parse(
            "allgather:ring;reduce_scatter:ring;broadcast:scatter_allgather;\
             reduce:reduce_scatter_gather;alltoall:direct",
        )
        .unwrap();
        assert_eq!(o.ranges.len(), 5);
        assert!(AlgoOverride::parse("").unwrap().is_empty());
        assert!(AlgoOverride::parse(" ; ,").unwrap().is_empty());
    }

    #[test]
    fn algo_override_parses_ranges() {
        let o = AlgoOverride::parse(
            "allreduce:recursive_doubling:0-8192;ring:8193-max, broadcast:^scatter_allgather;\
             allgather : direct : 64k - 1M ; ring:1048577-MAX ; ^pairwise",
        )
        .unwrap();
        let at = |k, b| o.range_for(k, b).map(|r| r.algo);
        use CollKind as K;
        assert_eq!(at(K::AllReduce, 0), Some(Algo::RecursiveDoubling));
        assert_eq!(at(K::AllReduce, 8192), Some(Algo::RecursiveDoubling));
        assert_eq!(at(K::AllReduce, 8193), Some(Algo::Ring));
        assert_eq!(at(K::AllReduce, u64::MAX), Some(Algo::Ring));
        assert_eq!(at(K::AllGather, 65535), None);
        assert_eq!(at(K::AllGather, 65536), Some(Algo::Direct));
        assert_eq!(at(K::AllGather, 1 << 20), Some(Algo::Direct));
        assert_eq!(at(K::AllGather, (1 << 20) + 1), Some(Algo::Ring));
        assert_eq!(at(K::Broadcast, 10), None);
        assert!(o.is_excluded(K::Broadcast, Algo::ScatterAllgather));
        assert!(!o.is_excluded(K::Reduce, Algo::ScatterAllgather));
        assert!(o.is_excluded(K::AllToAll, Algo::Pairwise));
        let shown: Vec<String> = o.ranges.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            shown,
            [
                "allreduce:recursive_doubling:0-8K",
                "allreduce:ring:8193-max",
                "allgather:direct:64K-1M",
                "allgather:ring:1048577-max"
            ]
        );
        // A printed range parses back to itself.
        let again = AlgoOverride::parse(&shown.join(";")).unwrap();
        assert_eq!(again.ranges, o.ranges);
        let o =
            AlgoOverride::parse("reduce:binomial_tree:1G-2g;reduce_scatter_gather:3G-3G").unwrap();
        assert_eq!((o.ranges[0].lo, o.ranges[0].hi), (1 << 30, 2 << 30));
        assert_eq!((o.ranges[1].lo, o.ranges[1].hi), (3 << 30, 3 << 30));
        // Exclusion and forcing of one algorithm: forced below, excluded above.
        let o = AlgoOverride::parse("allreduce:ring:0-1M;allreduce:^ring").unwrap();
        assert!(o.is_excluded(CollKind::AllReduce, Algo::Ring));
        assert_eq!(o.ranges.len(), 1);
    }

    #[test]
    fn algo_override_errors_name_the_item() {
        // (string, pieces the message must contain)
        let cases: &[(&str, &[&str])] = &[
            ("allreduce:rign", &["unknown algorithm", "\"rign\""]),
            ("allredux:ring", &["unknown collective", "\"allredux\""]),
            ("^tree", &["unknown algorithm", "\"tree\""]),
            ("rign", &["unknown algorithm", "\"rign\""]),
            (
                "broadcast:ring",
                &["ring is not an algorithm of broadcast", "binomial_tree"],
            ),
            ("allreduce:^pairwise", &["not an algorithm of allreduce"]),
            (
                "allreduce:ring:0-1K;direct:1025-max;binomial_tree:2M-max",
                &["\"binomial_tree:2M-max\"", "not an algorithm of allreduce"],
            ),
            (
                "allreduce:ring:0-8192;direct:8192-max",
                &[
                    "\"direct:8192-max\" overlaps \"allreduce:ring:0-8192\"",
                    "allreduce sizes 8K-8K",
                ],
            ),
            (
                "allreduce:ring;allreduce:direct:1M-2M",
                &["\"allreduce:direct:1M-2M\" overlaps \"allreduce:ring\""],
            ),
            ("allreduce:ring;allreduce:direct", &["overlaps"]),
            ("allreduce:ring:9K-8K", &["\"9K-8K\"", "lo > hi"]),
            (
                "allreduce:ring:0-12Q",
                &["bad size \"12Q\"", "\"allreduce:ring:0-12Q\""],
            ),
            ("allreduce:ring:x-12", &["bad size \"x\""]),
            ("allreduce:ring:-12", &["bad size \"\""]),
            ("allreduce:ring:1.5K-2K", &["bad size \"1.5K\""]),
            ("allreduce:ring:0-99999999999999999999", &["too large"]),
            ("allreduce:ring:0-16777216T", &["bad size"]),
            ("allreduce:ring:0-17179869184G", &["too large"]),
            ("allreduce:ring:4096", &["\"4096\"", "not a size range"]),
            ("ring:0-8K", &["\"ring:0-8K\" follows no collective"]),
            (
                "allreduce:ring:0-1K;^direct;ring:2K-4K",
                &["follows no collective"],
            ),
            ("allreduce:0-8K", &["names no algorithm"]),
            ("allreduce:^ring:0-8K", &["exclusion takes no size range"]),
            ("allreduce:ring:0-1K:2K", &["too many ':'"]),
        ];
        for (s, pieces) in cases {
            let e = AlgoOverride::parse(s).expect_err(s);
            assert!(e.starts_with("CADENCE_ALGO: "), "{s}: {e}");
            for p in *pieces {
                assert!(e.contains(p), "{s}: {e:?} lacks {p:?}");
            }
        }
    }

    #[test]
    fn sizes_print_as_written() {
        assert_eq!(fmt_size(0), "0");
        assert_eq!(fmt_size(8193), "8193");
        assert_eq!(fmt_size(8192), "8K");
        assert_eq!(fmt_size(3 << 20), "3M");
        assert_eq!(fmt_size(1 << 30), "1G");
        assert_eq!(fmt_size(u64::MAX), "max");
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
            matches!(&unset.topo, TopoSource::Profile { cache: Some(p) } if p == Path::new("/h/.cache/cadence")),
            "{:?}",
            unset.topo
        );
        let here = Config::from_lookup(env(&[("HOME", "/h"), ("CADENCE_TOPO_CACHE", "/c")]));
        assert!(
            matches!(here.unwrap().topo, TopoSource::Profile { cache: Some(p) } if p == Path::new("/c"))
        );
        let nowhere = Config::from_lookup(env(&[("CADENCE_TOPO_CACHE", "none")]));
        assert!(matches!(
            nowhere.unwrap().topo,
            TopoSource::Profile { cache: None }
        ));
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
