//! The entry points: one call ([`simulate`], [`simulate_with`]), calls back
//! to back ([`simulate_calls`]) and programs of calls and gaps
//! ([`simulate_program`]). Each rank's schedules are built and compiled in
//! parallel, then the executor runs them.

use super::compile::{compile, Compiled};
use super::executor::Sim;
use super::fault::{Fault, Hung};
use super::model::Model;
use super::records::{Recorded, Recorder};
use crate::schedule::Schedule;

/// What a simulation found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Seconds until the last rank finished.
    pub seconds: f64,
    /// Messages that crossed the modeled network (shared memory included).
    pub messages: u64,
    /// Per call ([`simulate_calls`]), when the last rank was done with it.
    pub call_ends: Vec<f64>,
}

/// Simulated seconds for every rank's schedule (`schedules[r]` is rank r's)
/// to finish on `model`, elements of `elem_size` bytes. Err when the
/// schedules do not match up (a send without its receive, sizes that
/// differ, a cyclic wait), which the verifier rules out for the library's.
pub fn simulate(schedules: &[Schedule], model: &Model, elem_size: usize) -> Result<f64, String> {
    let n = schedules.len();
    if n != model.topo.nranks() {
        return Err(format!("{n} schedules for {} ranks", model.topo.nranks()));
    }
    simulate_with(|r| Ok(schedules[r].clone()), model, elem_size).map(|o| o.seconds)
}

/// As [`simulate`], with rank r's schedule from `build(r)`: each is
/// compiled as it is built and dropped (in parallel over the machine's
/// cores), so thousands of ranks need only the compact form in memory.
pub fn simulate_with<F>(build: F, model: &Model, elem_size: usize) -> Result<Outcome, String>
where
    F: Fn(usize) -> Result<Schedule, String> + Sync,
{
    simulate_calls(build, model, elem_size, 1)
}

/// As [`simulate_with`], every rank making `calls` such calls back to back,
/// as a benchmark's timed loop does: a rank starts its next call when its
/// own part of the last one is done (no look-ahead across calls: a call
/// returns first), so calls overlap across ranks, and shaped links carry
/// their buckets' state from one to the next. [`Outcome::call_ends`] says
/// when each call was done on every rank.
pub fn simulate_calls<F>(
    build: F,
    model: &Model,
    elem_size: usize,
    calls: usize,
) -> Result<Outcome, String>
where
    F: Fn(usize) -> Result<Schedule, String> + Sync,
{
    let program = vec![Unit::Call(0); calls.max(1)];
    let no_gap = |_| Err("the program has no gap".to_string());
    simulate_program(|r, _| build(r), no_gap, &program, model, elem_size)
}

/// A rank's compiled program, and the phase index at which each unit ends.
type Program = (Compiled, Vec<usize>);

/// One call of a program ([`simulate_program`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    /// A collective being simulated: which of the program's calls (several
    /// take turns, as `cadence bench --algo all` times its algorithms).
    Call(usize),
    /// What a benchmark runs between its samples (a barrier): its own
    /// schedule, so its messages and the links' idle time are modeled.
    Gap,
}

/// Every rank makes the calls of `program` in order, back to back: `Call(k)`
/// runs `build(r, k)`'s schedule, `Gap` runs `gap(r)`'s. A rank starts a call
/// when its own part of the one before is done (no look-ahead across
/// calls), and shaped links carry their buckets' state from call to call.
/// [`Outcome::call_ends`] has an entry per unit of `program`.
pub fn simulate_program<F, G>(
    build: F,
    gap: G,
    program: &[Unit],
    model: &Model,
    elem_size: usize,
) -> Result<Outcome, String>
where
    F: Fn(usize, usize) -> Result<Schedule, String> + Sync,
    G: Fn(usize) -> Result<Schedule, String> + Sync,
{
    model.check()?;
    let (progs, unit_ends) = compile_programs(&build, &gap, program, model, &|_| program.len())?;
    Sim::new(model, elem_size, progs, unit_ends, program.len()).run()
}

/// Every rank making `calls` calls of `build(r)`'s schedule back to back,
/// as [`simulate_calls`], with `fault` injected, and recorded: per rank
/// when it entered and finished each call, and when each transfer completed
/// or where it stood at the end. A run that stalls (a fault, or schedules
/// that wait on each other) is an outcome here, not an error: it ends when
/// nothing can move ([`Recorded::stalled_at`]). Err: the fault names what
/// does not exist, or a schedule cannot be built.
pub fn simulate_recorded<F>(
    build: F,
    model: &Model,
    elem_size: usize,
    calls: usize,
    fault: Fault,
) -> Result<Recorded, String>
where
    F: Fn(usize) -> Result<Schedule, String> + Sync,
{
    model.check()?;
    let calls = calls.max(1);
    fault.check(model.topo.nranks(), model.topo.nhosts(), calls)?;
    let program = vec![Unit::Call(0); calls];
    let no_gap = |_| Err("the program has no gap".to_string());
    let calls_of = |r| fault.calls_of(r, calls);
    let (progs, unit_ends) =
        compile_programs(&|r, _| build(r), &no_gap, &program, model, &calls_of)?;
    let faulty = fault.model(model);
    let mut sim = Sim::new(
        faulty.as_ref().unwrap_or(model),
        elem_size,
        progs,
        unit_ends,
        calls,
    );
    sim.rec = Some(Recorder::new(&sim.progs, calls));
    match fault {
        Fault::HungLink { src, dst, call } => {
            let from = call.checked_sub(1).map_or(0, |c| sim.unit_ends[src][c]);
            sim.hung = Some(Hung {
                src: src as u32,
                dst: dst as u32,
                from_phase: from as u32,
            });
        }
        Fault::SlowRank { rank, delay_s } => sim.late = Some((rank, delay_s)),
        _ => {}
    }
    sim.run_events()?;
    let rec = sim.rec.take().expect("recording");
    Ok(sim.into_recorded(rec))
}

/// Every rank's program compiled (in parallel over the machine's cores):
/// rank r makes the first `units_of(r)` units of `program`. Returns the
/// programs and per rank the phase at which each of its units ends.
fn compile_programs<F, G>(
    build: &F,
    gap: &G,
    program: &[Unit],
    model: &Model,
    units_of: &(dyn Fn(usize) -> usize + Sync),
) -> Result<(Vec<Compiled>, Vec<Vec<usize>>), String>
where
    F: Fn(usize, usize) -> Result<Schedule, String> + Sync,
    G: Fn(usize) -> Result<Schedule, String> + Sync,
{
    let n = model.topo.nranks();
    let with_gap = program.contains(&Unit::Gap);
    let variants = program
        .iter()
        .filter_map(|u| match u {
            Unit::Call(k) => Some(k + 1),
            Unit::Gap => None,
        })
        .max()
        .unwrap_or(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |w| w.get())
        .clamp(1, n.max(1));
    let mut progs: Vec<Option<Result<Program, String>>> = (0..n).map(|_| None).collect();
    std::thread::scope(|s| {
        for (w, part) in progs.chunks_mut(n.div_ceil(workers).max(1)).enumerate() {
            let base = w * n.div_ceil(workers).max(1);
            s.spawn(move || {
                for (i, slot) in part.iter_mut().enumerate() {
                    let r = base + i;
                    let bodies: Result<Vec<Compiled>, String> = (0..variants)
                        .map(|k| build(r, k).and_then(|sch| compile(&sch)))
                        .collect();
                    let pause = match with_gap {
                        true => gap(r).and_then(|sch| compile(&sch)),
                        false => Ok(Compiled::sequence(&[]).0),
                    };
                    *slot = Some(bodies.and_then(|b| {
                        pause.map(|g| {
                            let units: Vec<&Compiled> = program
                                .iter()
                                .take(units_of(r))
                                .map(|u| match u {
                                    Unit::Call(k) => &b[*k],
                                    Unit::Gap => &g,
                                })
                                .collect();
                            Compiled::sequence(&units)
                        })
                    }));
                }
            });
        }
    });
    Ok(progs
        .into_iter()
        .map(|p| p.expect("every rank built"))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip())
}
