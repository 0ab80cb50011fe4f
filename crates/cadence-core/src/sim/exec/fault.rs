//! What goes wrong in a recorded run ([`super::simulate_recorded`]): the
//! faults whose records `cadence doctor` is meant to explain, injected
//! into the executor.

use super::model::Model;

/// A fault injected into a recorded run of `calls` calls.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Fault {
    #[default]
    None,
    /// Rank `rank` makes calls `0..call` only: it stops calling (stuck in
    /// its own code), and everyone else stalls in call `call`.
    Stop { rank: usize, call: usize },
    /// From call `call` on, no message from `src` to `dst` leaves its
    /// channel: the sender's send and the receiver's receive stay pending,
    /// and the ranks downstream stall.
    HungLink { src: usize, dst: usize, call: usize },
    /// Rank `rank` enters every call `delay_s` late (its own work between
    /// calls takes that long).
    SlowRank { rank: usize, delay_s: f64 },
    /// Host `host`'s NICs pass `factor` of their rate, both ways (a link
    /// that negotiated down, a flaky cable).
    SlowNic { host: usize, factor: f64 },
}

impl Fault {
    /// Whether the fault names ranks, hosts and calls that exist among
    /// `nranks` ranks on `nhosts` hosts making `calls` calls.
    pub fn check(&self, nranks: usize, nhosts: usize, calls: usize) -> Result<(), String> {
        let rank = |r: usize, what: &str| match r < nranks {
            true => Ok(()),
            false => Err(format!("{what} {r} is not a rank of {nranks}")),
        };
        let call = |c: usize| match c < calls {
            true => Ok(()),
            false => Err(format!(
                "call {c} is not one of the {calls} calls (0..{calls})"
            )),
        };
        match *self {
            Fault::None => Ok(()),
            Fault::Stop { rank: r, call: c } => rank(r, "rank").and(call(c)),
            Fault::HungLink { src, dst, .. } if src == dst => Err(format!(
                "a hung link joins two ranks, not rank {src} to itself"
            )),
            Fault::HungLink { src, dst, call: c } => {
                rank(src, "src").and(rank(dst, "dst")).and(call(c))
            }
            Fault::SlowRank { rank: r, delay_s } => {
                if !(delay_s.is_finite() && delay_s >= 0.0) {
                    return Err(format!("a rank's delay must be ≥ 0 s, not {delay_s}"));
                }
                rank(r, "rank")
            }
            Fault::SlowNic { host, factor } => {
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(format!("a NIC's rate factor must be > 0, not {factor}"));
                }
                match host < nhosts {
                    true => Ok(()),
                    false => Err(format!("host {host} is not one of the {nhosts} hosts")),
                }
            }
        }
    }

    /// How many of the `calls` calls rank r makes.
    pub(super) fn calls_of(&self, r: usize, calls: usize) -> usize {
        match *self {
            Fault::Stop { rank, call } if rank == r => call.min(calls),
            _ => calls,
        }
    }

    /// The model the run sees: a slow NIC's host runs slower than the one
    /// the library chose its algorithm for, as it would not know.
    pub(super) fn model(&self, model: &Model) -> Option<Model> {
        let Fault::SlowNic { host, factor } = *self else {
            return None;
        };
        let mut m = model.clone();
        m.nic_out[host] *= factor;
        m.nic_in[host] *= factor;
        Some(m)
    }
}

/// A hung link in the executor's terms: the channel `src -> dst`, from
/// the sender's phase `from_phase` (its first of the call) on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hung {
    pub(super) src: u32,
    pub(super) dst: u32,
    pub(super) from_phase: u32,
}

impl Hung {
    /// Whether a message of the channel `src -> dst`, sent in the sender's
    /// phase `phase`, never leaves.
    pub(super) fn holds(&self, src: u32, dst: u32, phase: u32) -> bool {
        src == self.src && dst == self.dst && phase >= self.from_phase
    }
}
