//! The cluster as the executor sees it ([`Model`]): hosts and their NICs,
//! groups and their uplinks, shared memory, shared cores, and what a
//! message and a byte of work cost, and the links of the flow model
//! ([`crate::sim::flows`]) that messages cross.

use crate::schedule::Topology;
use crate::sim::flows::{self, Bucket};

/// A cluster as the executor sees it: where ranks live, what links their
/// messages cross, and what things cost.
#[derive(Clone, Debug)]
pub struct Model {
    pub topo: Topology,
    /// Per host: bytes/s its NICs send and receive (all of them together:
    /// cadence stripes a link over every NIC).
    pub nic_out: Vec<f64>,
    pub nic_in: Vec<f64>,
    /// Per host its group (leaf switch, rack), and per group what flows
    /// out of and into it share (bytes/s; infinite: no shared uplink).
    pub group_of: Vec<usize>,
    pub group_out: Vec<f64>,
    pub group_in: Vec<f64>,
    /// Seconds from a message's last byte leaving to its arrival: between
    /// hosts, plus `hop_alpha` when it crosses groups; on one host.
    pub tcp_alpha: f64,
    pub hop_alpha: f64,
    pub shm_alpha: f64,
    /// Bytes/s a rank copies in from shared memory, and one host's memory
    /// moves for all its ranks together.
    pub shm_rate: f64,
    pub mem_rate: f64,
    /// Seconds of the sending rank's CPU per message (LogP's o), one message
    /// after another: concurrent messages overlap their latencies, not
    /// their start-up work. Between hosts and on one host.
    pub tcp_overhead: f64,
    pub shm_overhead: f64,
    /// Messages up to this many bytes leave before their receive is posted.
    pub tcp_eager: f64,
    pub shm_eager: f64,
    /// Seconds per byte of a local reduction or copy.
    pub gamma: f64,
    /// Token buckets in front of the NICs and uplinks (`tc tbf`, as the
    /// emulated cluster shapes its links); None on real hardware.
    pub shaper: Option<Shaper>,
    /// Cores that every rank of the cluster shares (an emulated cluster
    /// runs all its hosts on one machine); None: each rank has a core of
    /// its own. With it a message's overhead is work on those cores, shared
    /// by the messages being started at once (processor sharing, at most
    /// one core each), so a step in which every rank sends costs more than
    /// one in which two do.
    pub shared_cores: Option<f64>,
    /// With shared cores: the core time every message costs at least
    /// (seconds), what a loaded machine spends switching its receiver in
    /// and out, over shared memory as over TCP.
    pub loaded_overhead: f64,
    /// With shared cores: seconds of those cores per byte of a message
    /// between hosts (the hosts' network stacks: TCP, the veths and
    /// shapers, the copies in and out); 0: free. The stacks' bytes and the
    /// messages' start-up work then share the same cores, so a step in
    /// which every rank sends costs their sum, not the larger of the two.
    pub stack_cost: f64,
    /// With shared cores: the core time each rank spends on a call before
    /// its first message (the binding, the schedule's lookup, the
    /// operation's record), shared with everything else on those cores.
    pub call_overhead: f64,
}

/// How shaped links pass traffic: after an idle spell each NIC or uplink
/// direction passes `burst` seconds of its rate at `peak` (bytes/s, what the
/// path does unshaped), then its rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shaper {
    pub burst: f64,
    pub peak: f64,
}

impl Model {
    /// A flat cluster: every host's NIC at `rate` both ways, one switch.
    pub fn flat(topo: Topology, rate: f64, tcp_alpha: f64) -> Model {
        let h = topo.nhosts();
        Model {
            topo,
            nic_out: vec![rate; h],
            nic_in: vec![rate; h],
            group_of: vec![0; h],
            group_out: vec![f64::INFINITY],
            group_in: vec![f64::INFINITY],
            tcp_alpha,
            hop_alpha: 0.0,
            shm_alpha: 1e-6,
            shm_rate: 8e9,
            mem_rate: f64::INFINITY,
            tcp_overhead: 0.0,
            shm_overhead: 0.0,
            tcp_eager: 4.0 * 1024.0 * 1024.0,
            shm_eager: 256.0 * 1024.0,
            gamma: 1.0 / 4e9,
            shaper: None,
            shared_cores: None,
            loaded_overhead: 0.0,
            stack_cost: 0.0,
            call_overhead: 0.0,
        }
    }

    pub(super) fn nhosts(&self) -> usize {
        self.topo.nhosts()
    }

    pub(super) fn ngroups(&self) -> usize {
        self.group_out.len()
    }

    /// Checks the model's shape and numbers: one line per mistake.
    pub fn check(&self) -> Result<(), String> {
        let (h, g) = (self.nhosts(), self.ngroups());
        if self.nic_out.len() != h || self.nic_in.len() != h || self.group_of.len() != h {
            return Err(format!("per-host lists do not have {h} entries"));
        }
        if self.group_in.len() != g || self.group_of.iter().any(|&x| x >= g) {
            return Err(format!("group lists do not match {g} groups"));
        }
        let rates = self
            .nic_out
            .iter()
            .chain(&self.nic_in)
            .chain(&self.group_out)
            .chain(&self.group_in)
            .chain([&self.shm_rate, &self.mem_rate]);
        if rates.into_iter().any(|&r| r.is_nan() || r <= 0.0) {
            return Err("every rate must be positive".into());
        }
        let times = [
            self.tcp_alpha,
            self.hop_alpha,
            self.shm_alpha,
            self.gamma,
            self.tcp_overhead,
            self.shm_overhead,
            self.tcp_eager,
            self.shm_eager,
            self.loaded_overhead,
            self.stack_cost,
            self.call_overhead,
        ];
        if times.iter().any(|&t| !t.is_finite() || t < 0.0) {
            return Err("latencies, overheads, γ and eager limits must be finite and ≥ 0".into());
        }
        if let Some(s) = self.shaper {
            if !(s.burst.is_finite() && s.burst >= 0.0 && s.peak > 0.0) {
                return Err("a shaper's burst must be ≥ 0 and its peak rate positive".into());
            }
        }
        Ok(())
    }

    /// Link capacities: NIC out per host, NIC in per host, group out, group
    /// in, each rank's shared-memory copy-in, each host's memory.
    pub(super) fn links(&self) -> Vec<f64> {
        let mut cap = self.nic_out.clone();
        cap.extend(&self.nic_in);
        cap.extend(&self.group_out);
        cap.extend(&self.group_in);
        cap.extend(std::iter::repeat_n(self.shm_rate, self.topo.nranks()));
        cap.extend(std::iter::repeat_n(self.mem_rate, self.nhosts()));
        if let Some(cores) = self.shared_cores {
            // Each rank's thread, then the machine, in units of work that
            // messages between hosts also spend (see `cpu_unit`).
            let unit = self.cpu_unit();
            cap.extend(std::iter::repeat_n(1.0 / unit, self.topo.nranks()));
            cap.push(cores / unit);
        }
        cap
    }

    /// Seconds of core time in one unit of the cores' links: a byte's
    /// worth of the network stacks where they cost something (so that the
    /// bytes of a message between hosts cross the cores' link as they
    /// cross a NIC, one unit a byte), else one second.
    pub(super) fn cpu_unit(&self) -> f64 {
        if self.stack_cost > 0.0 {
            self.stack_cost
        } else {
            1.0
        }
    }

    /// The machine's cores' link, when the ranks share cores.
    pub(super) fn cores_link(&self) -> Option<usize> {
        self.shared_cores?;
        let (h, g, n) = (self.nhosts(), self.ngroups(), self.topo.nranks());
        Some(2 * h + 2 * g + n + h + n)
    }

    /// The links a message's start-up work on rank a's CPU crosses, when
    /// the ranks share cores: its thread and the machine's cores.
    pub(super) fn cpu_route(&self, a: usize) -> Vec<usize> {
        let (h, g, n) = (self.nhosts(), self.ngroups(), self.topo.nranks());
        let base = 2 * h + 2 * g + n + h;
        vec![base + a, base + n]
    }

    /// Per link of [`Model::links`], its token bucket: the NICs' and the
    /// groups' uplinks' when the model has a shaper.
    pub(super) fn buckets(&self) -> Vec<Option<Bucket>> {
        let cap = self.links();
        let shaped = 2 * self.nhosts() + 2 * self.ngroups();
        cap.iter()
            .enumerate()
            .map(|(l, &c)| {
                let s = self.shaper?;
                (l < shaped && c.is_finite()).then(|| Bucket {
                    depth: c * s.burst,
                    peak: s.peak.max(c),
                })
            })
            .collect()
    }

    /// The links a message from rank a to rank b crosses.
    pub fn route(&self, a: usize, b: usize) -> Vec<usize> {
        let (h, g, n) = (self.nhosts(), self.ngroups(), self.topo.nranks());
        let (ha, hb) = (self.topo.host_of(a), self.topo.host_of(b));
        if ha == hb {
            return vec![2 * h + 2 * g + b, 2 * h + 2 * g + n + ha];
        }
        let (ga, gb) = (self.group_of[ha], self.group_of[hb]);
        let mut r = vec![ha, h + hb];
        if ga != gb {
            r.extend([2 * h + ga, 2 * h + g + gb]);
        }
        if self.stack_cost > 0.0 {
            r.extend(self.cores_link());
        }
        r
    }

    /// Rates (bytes/s) of flows between hosts (not ranks) started at
    /// once, by max-min fair sharing of the NICs and the groups' uplinks:
    /// what a profile's round measures on this model (each host's flow
    /// leaves from its first rank, as the profile's leaders do).
    pub fn host_flow_rates(&self, flows: &[(usize, usize)]) -> Vec<f64> {
        let leader = |h: usize| self.topo.leader(h);
        let routes: Vec<Vec<usize>> = flows
            .iter()
            .map(|&(a, b)| self.route(leader(a), leader(b)))
            .collect();
        let refs: Vec<&[usize]> = routes.iter().map(Vec::as_slice).collect();
        flows::max_min_rates(&self.links(), &refs)
    }

    pub(super) fn alpha(&self, a: usize, b: usize) -> f64 {
        let (ha, hb) = (self.topo.host_of(a), self.topo.host_of(b));
        if ha == hb {
            self.shm_alpha
        } else if self.group_of[ha] != self.group_of[hb] {
            self.tcp_alpha + self.hop_alpha
        } else {
            self.tcp_alpha
        }
    }

    pub(super) fn overhead(&self, a: usize, b: usize) -> f64 {
        if self.topo.host_of(a) == self.topo.host_of(b) {
            self.shm_overhead
        } else {
            self.tcp_overhead
        }
    }

    pub(super) fn eager(&self, a: usize, b: usize) -> f64 {
        if self.topo.host_of(a) == self.topo.host_of(b) {
            self.shm_eager
        } else {
            self.tcp_eager
        }
    }
}
