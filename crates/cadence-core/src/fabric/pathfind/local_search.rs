//! Local search on routes (paths inside a group, rings of groups): 2-opt
//! and or-opt moves on a route's narrowest element, and seeded
//! double-bridge kicks around them.

use super::grouped::{GroupStop, GroupTables};

/// Or-opt moves runs of up to this many stops divided by the route's
/// length, and at least [`MIN_RELOCATED`]: a pass then costs O(this).
const RELOCATION_WORK: usize = 1 << 14;
/// The shortest longest run or-opt moves, however long the route.
const MIN_RELOCATED: usize = 3;
/// Kicks of the iterated local search: KICK_WORK / route length (each
/// kick costs a local search), at most [`MAX_KICKS`].
const KICK_WORK: usize = 1 << 9;
/// The most kicks on a short route.
const MAX_KICKS: usize = 32;

/// A route under local search: stops in order, the first and the last held
/// in place (a cycle is a path from a stop back to a copy of it). Its width
/// is the least of every stop's own width and every link between
/// neighbours.
pub(super) trait Route {
    type Stop: Copy;
    /// The width of the link from one stop's exit to the next one's entry.
    fn link(&self, from: Self::Stop, to: Self::Stop) -> f64;
    /// The width of a stop itself (a group's inner path).
    fn inner(&self, stop: Self::Stop) -> f64;
    /// The stop traversed the other way.
    fn flip(&self, stop: Self::Stop) -> Self::Stop;
}

/// Hosts of one group, linked by their measured rates.
pub(super) struct HostRoute<'a> {
    pub(super) rate: &'a [Vec<f64>],
}

impl Route for HostRoute<'_> {
    type Stop = usize;
    fn link(&self, from: usize, to: usize) -> f64 {
        self.rate[from][to]
    }
    fn inner(&self, _: usize) -> f64 {
        f64::INFINITY
    }
    fn flip(&self, stop: usize) -> usize {
        stop
    }
}

/// Groups of a contiguous ring, each with its entry and exit.
pub(super) struct GroupRoute<'t, 'f> {
    pub(super) tables: &'t GroupTables<'f>,
}

impl Route for GroupRoute<'_, '_> {
    type Stop = GroupStop;
    fn link(&self, from: GroupStop, to: GroupStop) -> f64 {
        self.tables.fabric.contiguous_rate(from.exit, to.entry)
    }
    fn inner(&self, stop: GroupStop) -> f64 {
        if stop.closing {
            f64::INFINITY
        } else {
            self.tables.stop_width(stop)
        }
    }
    fn flip(&self, stop: GroupStop) -> GroupStop {
        GroupStop {
            entry: stop.exit,
            exit: stop.entry,
            ..stop
        }
    }
}

/// Where a route is narrowest: a stop itself, or the link after stop i.
#[derive(Clone, Copy)]
enum Narrowest {
    Stop(usize),
    Link(usize),
}

/// The route's narrowest element (the first of equals) and its width; None
/// when nothing limits it.
fn narrowest<R: Route>(route: &R, stops: &[R::Stop]) -> Option<(f64, Narrowest)> {
    let mut found: Option<(f64, Narrowest)> = None;
    let mut consider = |width: f64, at: Narrowest| {
        if width < found.map_or(f64::INFINITY, |(w, _)| w) {
            found = Some((width, at));
        }
    };
    for (i, &stop) in stops.iter().enumerate() {
        consider(route.inner(stop), Narrowest::Stop(i));
        if let Some(&next) = stops.get(i + 1) {
            consider(route.link(stop, next), Narrowest::Link(i));
        }
    }
    found
}

pub(super) fn route_width<R: Route>(route: &R, stops: &[R::Stop]) -> f64 {
    narrowest(route, stops).map_or(f64::INFINITY, |(w, _)| w)
}

/// A change to a route: reverse stops lo..=hi (flipping each), or move
/// stops first..=end to just after stop `after`, reversed if `flipped`.
#[derive(Clone, Copy)]
enum Move {
    Reverse {
        lo: usize,
        hi: usize,
    },
    Relocate {
        first: usize,
        end: usize,
        after: usize,
        flipped: bool,
    },
}

/// Improves a route by 2-opt (segment reversal) and or-opt (moving a run
/// of stops elsewhere, as it is or reversed) moves that take out its
/// narrowest element. A move is taken only if everything it adds is wider
/// than the route's width m, so each one either widens the route or leaves
/// fewer elements at m: the search ends. Among such moves the one whose
/// added elements are widest wins (first of equals). Runs of up to
/// RELOCATION_WORK / len stops move (at least [`MIN_RELOCATED`]), so each
/// pass is O(len + RELOCATION_WORK); at most 4 len + 16 passes.
pub(super) fn improve_route<R: Route>(route: &R, stops: &mut Vec<R::Stop>) {
    let longest_run = (RELOCATION_WORK / stops.len().max(1)).max(MIN_RELOCATED);
    for _ in 0..4 * stops.len() + 16 {
        let Some((floor, weak)) = narrowest(route, stops) else {
            return;
        };
        let mut search = MoveSearch {
            route,
            stops,
            floor,
            best: None,
        };
        match weak {
            Narrowest::Stop(i) => {
                search.reversals_from(i);
                search.reversals_to(i);
            }
            Narrowest::Link(i) => {
                search.reversals_from(i + 1);
                search.reversals_to(i);
                search.relocations_from(i + 1, longest_run);
                search.relocations_to(i, longest_run);
            }
        }
        let Some((_, chosen)) = search.best else {
            return;
        };
        apply_move(route, stops, chosen);
    }
}

fn apply_move<R: Route>(route: &R, stops: &mut Vec<R::Stop>, chosen: Move) {
    match chosen {
        Move::Reverse { lo, hi } => {
            stops[lo..=hi].reverse();
            for stop in &mut stops[lo..=hi] {
                *stop = route.flip(*stop);
            }
        }
        Move::Relocate {
            first,
            end,
            after,
            flipped,
        } => {
            let mut run: Vec<R::Stop> = stops.drain(first..=end).collect();
            if flipped {
                run.reverse();
                for stop in &mut run {
                    *stop = route.flip(*stop);
                }
            }
            let at = if after < first {
                after + 1
            } else {
                after + 1 - run.len()
            };
            stops.splice(at..at, run);
        }
    }
}

/// The moves that take out one narrow element, scored by the narrowest
/// element each adds. Only interior stops (not the first or the last) move.
struct MoveSearch<'a, R: Route> {
    route: &'a R,
    stops: &'a [R::Stop],
    floor: f64,
    best: Option<(f64, Move)>,
}

impl<R: Route> MoveSearch<'_, R> {
    fn offer(&mut self, width: f64, candidate: Move) {
        if width > self.floor && self.best.is_none_or(|(w, _)| width > w) {
            self.best = Some((width, candidate));
        }
    }

    /// Reversals of lo..=hi for every hi, lo fixed.
    fn reversals_from(&mut self, lo: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if lo == 0 || lo >= last {
            return;
        }
        let mut inside = f64::INFINITY;
        for hi in lo..last {
            inside = inside.min(r.inner(r.flip(s[hi])));
            if hi > lo {
                inside = inside.min(r.link(r.flip(s[hi]), r.flip(s[hi - 1])));
            }
            if inside <= self.floor {
                return; // every longer segment holds this element too
            }
            let ends = r
                .link(s[lo - 1], r.flip(s[hi]))
                .min(r.link(r.flip(s[lo]), s[hi + 1]));
            self.offer(inside.min(ends), Move::Reverse { lo, hi });
        }
    }

    /// Reversals of lo..=hi for every lo, hi fixed.
    fn reversals_to(&mut self, hi: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if hi == 0 || hi >= last {
            return;
        }
        let mut inside = f64::INFINITY;
        for lo in (1..=hi).rev() {
            inside = inside.min(r.inner(r.flip(s[lo])));
            if lo < hi {
                inside = inside.min(r.link(r.flip(s[lo + 1]), r.flip(s[lo])));
            }
            if inside <= self.floor {
                return;
            }
            let ends = r
                .link(s[lo - 1], r.flip(s[hi]))
                .min(r.link(r.flip(s[lo]), s[hi + 1]));
            self.offer(inside.min(ends), Move::Reverse { lo, hi });
        }
    }

    /// Runs first..=end for every end (up to `longest` stops), first fixed.
    fn relocations_from(&mut self, first: usize, longest: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if first == 0 || first >= last {
            return;
        }
        let mut flipped_inside = f64::INFINITY;
        for end in first..last.min(first + longest) {
            flipped_inside = flipped_inside.min(r.inner(r.flip(s[end])));
            if end > first {
                flipped_inside = flipped_inside.min(r.link(r.flip(s[end]), r.flip(s[end - 1])));
            }
            self.relocations(first, end, flipped_inside);
        }
    }

    /// Runs first..=end for every first (up to `longest` stops), end fixed.
    fn relocations_to(&mut self, end: usize, longest: usize) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        if end == 0 || end >= last {
            return;
        }
        let mut flipped_inside = f64::INFINITY;
        for first in (1.max((end + 1).saturating_sub(longest))..=end).rev() {
            flipped_inside = flipped_inside.min(r.inner(r.flip(s[first])));
            if first < end {
                flipped_inside = flipped_inside.min(r.link(r.flip(s[first + 1]), r.flip(s[first])));
            }
            self.relocations(first, end, flipped_inside);
        }
    }

    /// Moving stops first..=end to every other gap, as they are or reversed
    /// (`flipped_inside`: the narrowest element inside the reversed run).
    fn relocations(&mut self, first: usize, end: usize, flipped_inside: f64) {
        let (r, s) = (self.route, self.stops);
        let last = s.len() - 1;
        let bridge = r.link(s[first - 1], s[end + 1]);
        if bridge <= self.floor {
            return;
        }
        let may_flip = flipped_inside > self.floor;
        for after in (0..first - 1).chain(end + 1..last) {
            let (before, behind) = (s[after], s[after + 1]);
            let moved = |flipped| Move::Relocate {
                first,
                end,
                after,
                flipped,
            };
            let kept = r.link(before, s[first]).min(r.link(s[end], behind));
            self.offer(bridge.min(kept), moved(false));
            if may_flip {
                let turned = r
                    .link(before, r.flip(s[end]))
                    .min(r.link(r.flip(s[first]), behind));
                self.offer(bridge.min(flipped_inside).min(turned), moved(true));
            }
        }
    }
}

/// Iterated local search: a fixed number of double-bridge kicks (the run
/// between two random cuts swapped with the next run, orientation kept),
/// each followed by [`improve_route`]; a kicked route is kept only if
/// strictly wider. The cuts come from a fixed-seed generator, so every
/// rank gets the same route. Kicks are fewer on long routes (each costs a
/// local search): about KICK_WORK / len of them.
pub(super) fn kicked<R: Route>(route: &R, mut best: Vec<R::Stop>) -> Vec<R::Stop> {
    let len = best.len();
    if len < 5 {
        return best;
    }
    let mut best_width = route_width(route, &best);
    let mut seed = 0x5eed_u64;
    let mut below = |n: usize| (split_mix(&mut seed) % n as u64) as usize;
    for _ in 0..(KICK_WORK / len).min(MAX_KICKS) {
        // Cuts 1 <= a < b < c <= len - 1: runs a..b and b..c swap.
        let a = 1 + below(len - 3);
        let b = a + 1 + below(len - 2 - a);
        let c = b + 1 + below(len - 1 - b);
        let mut trial = best.clone();
        trial[a..c].rotate_left(b - a);
        improve_route(route, &mut trial);
        let width = route_width(route, &trial);
        if width > best_width {
            (best, best_width) = (trial, width);
        }
    }
    best
}

/// splitmix64: a fixed, portable sequence.
fn split_mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
