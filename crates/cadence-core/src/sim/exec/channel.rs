//! Messages on their channels: the k-th send from a to b meets the k-th
//! receive at b from a; a message leaves when its send is released and
//! the one before it has left (and, past the eager limit, its receive is
//! released), crosses its route as a flow, and completes its receive once
//! it arrived.

use super::executor::{Kind, Sim, CPU_WORK};
use std::collections::VecDeque;

/// One end of a message: rank, phase, index in the rank's transfers.
#[derive(Clone, Copy, Debug)]
pub(super) struct End {
    pub(super) rank: u32,
    pub(super) phase: u32,
    pub(super) idx: u32,
}

#[derive(Default)]
pub(super) struct Msg {
    pub(super) bytes: f64,
    pub(super) reduce: bool,
    pub(super) send: Option<End>,
    pub(super) recv: Option<End>,
    /// When each end was released (it may start / complete).
    pub(super) send_ready: Option<f64>,
    pub(super) recv_ready: Option<f64>,
    pub(super) started: Option<f64>,
    pub(super) arrived: Option<f64>,
    pub(super) recv_scheduled: bool,
}

/// Messages between one sender and one receiver, in channel order.
pub(super) struct Chan {
    pub(super) src: u32,
    pub(super) dst: u32,
    /// Messages not yet received; `q[0]` has sequence number `base`.
    pub(super) q: VecDeque<Msg>,
    pub(super) base: u64,
    pub(super) sends: u64,
    pub(super) recvs: u64,
    /// The next message to leave, and whether one is on the wire.
    pub(super) next_out: u64,
    pub(super) busy: bool,
}

impl Chan {
    pub(super) fn msg(&mut self, seq: u64) -> &mut Msg {
        let i = (seq - self.base) as usize;
        while self.q.len() <= i {
            self.q.push_back(Msg::default());
        }
        &mut self.q[i]
    }
}

/// Messages on the channel's wire or waiting to leave with their send
/// released, from the one leaving now.
pub(super) fn ch_ready(ch: &Chan) -> usize {
    ch.q.iter()
        .skip((ch.next_out - ch.base) as usize)
        .take_while(|m| m.send_ready.is_some())
        .count()
        .max(1)
}

impl Sim<'_> {
    pub(super) fn chan(&mut self, a: u32, b: u32) -> u32 {
        let next = self.chans.len() as u32;
        let c = *self.chan_of.entry((a, b)).or_insert(next);
        if c == next {
            self.chans.push(Chan {
                src: a,
                dst: b,
                q: VecDeque::new(),
                base: 0,
                sends: 0,
                recvs: 0,
                next_out: 0,
                busy: false,
            });
        }
        c
    }

    /// Puts transfer `idx` (phase `phase`) of rank r on its channel,
    /// released now or held.
    pub(super) fn register(
        &mut self,
        r: usize,
        phase: usize,
        idx: usize,
        ready: bool,
    ) -> Result<(u32, u64), String> {
        let x = self.progs[r].xfers[idx];
        let n = self.progs.len() as u32;
        if x.peer >= n || x.peer as usize == r {
            return Err(format!("rank {r} names peer {} of {n} ranks", x.peer));
        }
        let (a, b) = if x.send {
            (r as u32, x.peer)
        } else {
            (x.peer, r as u32)
        };
        let c = self.chan(a, b);
        let bytes = x.len as f64 * self.es;
        let now = self.now;
        let ch = &mut self.chans[c as usize];
        let seq = if x.send { &mut ch.sends } else { &mut ch.recvs };
        *seq += 1;
        let seq = *seq - 1;
        let m = ch.msg(seq);
        if (m.send.is_some() || m.recv.is_some()) && m.bytes != bytes {
            return Err(format!(
                "message {seq} from rank {a} to rank {b}: {} bytes sent, {} received",
                if x.send { bytes } else { m.bytes },
                if x.send { m.bytes } else { bytes },
            ));
        }
        m.bytes = bytes;
        let end = Some(End {
            rank: r as u32,
            phase: phase as u32,
            idx: idx as u32,
        });
        let at = ready.then_some(now);
        if x.send {
            m.send = end;
            m.send_ready = at;
        } else {
            m.recv = end;
            m.reduce = x.reduce;
            m.recv_ready = at;
        }
        Ok((c, seq))
    }

    /// A transfer's end may go on: its message may leave or complete.
    pub(super) fn poke(&mut self, c: u32, seq: u64) {
        self.try_leave(c);
        self.maybe_receive(c, seq);
    }

    pub(super) fn release(&mut self, c: u32, seq: u64, send: bool) {
        let now = self.now;
        let m = self.chans[c as usize].msg(seq);
        if send {
            m.send_ready = Some(now);
        } else {
            m.recv_ready = Some(now);
        }
        self.poke(c, seq);
    }

    /// Starts the channel's next message when the wire is free and it may go.
    pub(super) fn try_leave(&mut self, c: u32) {
        let ch = &self.chans[c as usize];
        if ch.busy {
            return;
        }
        let Some(m) = ch.q.get((ch.next_out - ch.base) as usize) else {
            return;
        };
        if m.send_ready.is_none() {
            return;
        }
        if let (Some(h), Some(send)) = (self.hung, m.send) {
            // A hung link: the message never leaves (nor the ones behind it).
            if h.holds(ch.src, ch.dst, send.phase) {
                return;
            }
        }
        let (a, b) = (ch.src as usize, ch.dst as usize);
        if m.bytes > self.model.eager(a, b) && m.recv_ready.is_none() {
            return;
        }
        self.chans[c as usize].busy = true;
        if self.model.shared_cores.is_some() {
            let work = self.model.overhead(a, b).max(self.model.loaded_overhead);
            self.flows.start(
                CPU_WORK | c as usize,
                self.model.cpu_route(a),
                work / self.model.cpu_unit(),
            );
            return;
        }
        // The sender's CPU starts messages one at a time.
        let st = &mut self.ranks[a];
        let at = self.now.max(st.inject_free) + self.model.overhead(a, b);
        st.inject_free = at;
        self.push(at, Kind::Leave(c));
    }

    pub(super) fn leave(&mut self, c: u32) {
        let now = self.now;
        let ch = &mut self.chans[c as usize];
        let (a, b) = (ch.src as usize, ch.dst as usize);
        let seq = ch.next_out;
        let m = ch.msg(seq);
        m.started = Some(now);
        let bytes = m.bytes;
        let send = m.send;
        self.messages += 1;
        if let (Some(rec), Some(e)) = (&mut self.rec, send) {
            // The transport takes its first bytes as it leaves.
            rec.first(e.rank as usize, e.idx as usize, now);
        }
        // A busy link is shared in proportion to the messages each channel
        // has ready (this one and the released ones behind it), as counted
        // when this one leaves: TCP gives a connection that always has data
        // more of a link than one the application leaves idle between
        // messages (a larger congestion window); equal shares made a double
        // binary tree's slots wait for the inner pair far longer than the
        // engine does.
        let weight = ch_ready(&self.chans[c as usize]) as f64;
        self.flows
            .start_weighted(c as usize, self.model.route(a, b), bytes, weight);
    }

    /// The channel's message on the wire has left entirely.
    pub(super) fn left(&mut self, c: u32) -> Result<(), String> {
        let at = self.now + {
            let ch = &self.chans[c as usize];
            self.model.alpha(ch.src as usize, ch.dst as usize)
        };
        let ch = &mut self.chans[c as usize];
        ch.busy = false;
        let seq = ch.next_out;
        ch.next_out += 1;
        let m = ch.msg(seq);
        m.arrived = Some(at);
        let send = m.send.expect("a message leaves once its send is posted");
        self.end_done(send)?;
        self.maybe_receive(c, seq);
        self.try_leave(c);
        Ok(())
    }

    /// Schedules a message's receive once it arrived and is released.
    pub(super) fn maybe_receive(&mut self, c: u32, seq: u64) {
        let ch = &mut self.chans[c as usize];
        if seq < ch.base {
            return;
        }
        let (src, dst) = (ch.src as usize, ch.dst as usize);
        let m = ch.msg(seq);
        let (Some(arrived), Some(ready)) = (m.arrived, m.recv_ready) else {
            return;
        };
        if m.recv_scheduled {
            return;
        }
        m.recv_scheduled = true;
        // Its first bytes land α after they left (the flow's first byte
        // crosses at its rate, not after its whole length, so nothing but
        // the latency separates them) and are taken in once the receive is
        // released.
        let first = m
            .started
            .map(|started| (started + self.model.alpha(src, dst)).max(ready));
        let waiting = arrived <= ready;
        let recv = m.recv;
        let mut at = arrived.max(ready);
        if m.reduce {
            // The engine reduces pieces as they land: the CPU's work runs
            // beside the arrival, one reduction at a time per rank. The CPU
            // is busy for the work only, not for the whole arrival: the
            // reductions of messages arriving together (direct's incast)
            // share the time their bytes take to come in, and the rank is
            // CPU-bound only when their work adds up to more.
            let begun = m.started.unwrap_or(arrived).max(ready);
            let st = &mut self.ranks[dst];
            let work = m.bytes * self.model.gamma;
            let done = st.cpu_free.max(begun) + work;
            st.cpu_free = done;
            at = at.max(done);
        }
        if let (Some(rec), Some(e), Some(first)) = (&mut self.rec, recv, first) {
            // A message all there when its receive is released is read (and
            // reduced) in one go: the engine's first and last progress of it
            // coincide, and it shows no rate.
            rec.first(dst, e.idx as usize, if waiting { at } else { first });
        }
        self.push(at, Kind::Received(c, seq));
    }

    pub(super) fn received(&mut self, c: u32, seq: u64) -> Result<(), String> {
        let ch = &mut self.chans[c as usize];
        let m = ch.msg(seq);
        let end = m.recv.expect("received means posted");
        m.recv_scheduled = false;
        m.arrived = None;
        m.send = None;
        m.recv = None;
        m.bytes = -1.0; // consumed
        while ch.q.front().is_some_and(|m| m.bytes < 0.0) {
            ch.q.pop_front();
            ch.base += 1;
        }
        self.end_done(end)
    }
}
