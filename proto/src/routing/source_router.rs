//! One server's part in source routing: forwarding frames by the route they carry (every
//! server does this), answering probes and reporting broken paths, and, when the server
//! itself source-routes, choosing paths for its flows with BSR ([`Bsr`]).
//!
//! The engine ([`crate::node::Node`]) hands source-routed frames here and asks here which
//! route a frame to a peer takes; the probe, reply and failure frames this queues go out
//! ahead of the engine's own traffic.

use std::collections::VecDeque;
use std::time::Duration;

use super::bsr::{Bsr, BsrConfig, BsrStats};
use super::load::LinkLoad;
use super::probe::{Probe, ProbeKind, PROBE_LEN};
use super::source::{self, Route, Step};
use super::{LinkView, RouteTable};
use crate::time::Time;
use crate::topology::{Coord, Dir, DirSet};
use crate::wire::{self, Dest, Header, Kind, HEADERS_LEN};

/// How long a server stays silent about a broken path between the same two servers after
/// reporting it once: the source moves within a round trip, and a burst of frames still on
/// the old path must not become a burst of reports.
const REPORT_HOLD: Duration = Duration::from_millis(1);
/// Replies and reports waiting to be sent, at most: a flood of probes (a hostile neighbour)
/// costs dropped answers, not memory.
const MAX_PENDING: usize = 4096;

/// Counters of source routing at one server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Source-routed frames passed on by their route.
    pub forwarded: u64,
    /// Source-routed frames refused: a malformed route, or one that ends elsewhere than
    /// the frame's destination.
    pub bad_route: u64,
    /// Source-routed frames whose next hop was down here.
    pub path_failed: u64,
    /// Path-failure reports sent.
    pub failures_sent: u64,
    /// Probes answered (this server was the destination).
    pub replies_sent: u64,
    /// Frames sent with a route of this server's choosing.
    pub routed_sent: u64,
    /// Path selection's own counters (when this server source-routes).
    pub bsr: BsrStats,
}

/// What a source-routed frame does at this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It is for this server: its route was taken out, and the frame now starts at this
    /// offset.
    Arrived(usize),
    /// Send it on this link.
    Next(Dir),
    /// Refused: a malformed route or one not ending at the frame's destination.
    BadRoute,
    /// The route's next hop is down here (its source was told).
    PathFailed,
}

/// A frame queued by source routing.
#[derive(Debug, Clone, Copy)]
enum Pending {
    /// A probe, along its path.
    Probe {
        dst: Coord,
        route: Route,
        probe: Probe,
    },
    /// A reply or failure report, to a server by next hops.
    Report { dst: Coord, probe: Probe },
}

/// Source routing at one server.
#[derive(Debug)]
pub struct SourceRouter {
    local: Coord,
    bsr: Option<Bsr>,
    /// Whether this server's own flows take source routes now (path selection may be
    /// set up yet inactive: the frames keep room for a route either way).
    active: bool,
    /// The sending services whose traffic is source-routed (`None`: all of it, and the
    /// connections' own frames too).
    services: Option<Vec<u16>>,
    loads: [LinkLoad; 6],
    /// Links the driver saw go down that the view may not show yet.
    down: DirSet,
    out: VecDeque<Pending>,
    reported: VecDeque<(Coord, Coord, Time)>,
    stats: SourceStats,
}

impl SourceRouter {
    /// Forwarding only (this server chooses no routes).
    pub fn new(local: Coord) -> SourceRouter {
        SourceRouter {
            local,
            bsr: None,
            active: false,
            services: None,
            loads: [LinkLoad::default(); 6],
            down: DirSet::EMPTY,
            out: VecDeque::new(),
            reported: VecDeque::new(),
            stats: SourceStats::default(),
        }
    }

    /// Makes this server choose source routes for its own flows.
    pub fn enable(&mut self, cfg: BsrConfig) {
        self.bsr = Some(Bsr::new(self.local, cfg));
        self.active = true;
    }

    /// Turns source routing of this server's own flows on or off (when enabled); off,
    /// its frames go by next hops again. False when it was never enabled.
    pub fn set_active(&mut self, on: bool) -> bool {
        if self.bsr.is_none() {
            return false;
        }
        self.active = on;
        true
    }

    /// Whether this server source-routes its own flows.
    pub fn is_enabled(&self) -> bool {
        self.bsr.is_some() && self.active
    }

    /// Source-routes only the traffic these services send (`None`: everything this server
    /// sends, ACKs included). The others keep link-state next hops.
    pub fn set_services(&mut self, services: Option<Vec<u16>>) {
        self.services = services;
    }

    /// The services source-routed (`None`: all).
    pub fn services(&self) -> Option<&[u16]> {
        self.services.as_deref()
    }

    /// Whether frames of `service` (`None`: the connection's own frames) are
    /// source-routed.
    fn routes_service(&self, service: Option<u16>) -> bool {
        match (&self.services, service) {
            (None, _) => true,
            (Some(set), Some(s)) => set.contains(&s),
            (Some(_), None) => false,
        }
    }

    /// The route frames of `service` to `dst` take now (`None`: next hops).
    pub fn route_for(&self, dst: Coord, service: Option<u16>) -> Option<Route> {
        if !self.routes_service(service) {
            return None;
        }
        self.route_to(dst)
    }

    /// Counters.
    pub fn stats(&self) -> SourceStats {
        let mut s = self.stats;
        if let Some(b) = &self.bsr {
            s.bsr = b.stats();
        }
        s
    }

    /// Path selection, for reports.
    pub fn bsr(&self) -> Option<&Bsr> {
        self.bsr.as_ref()
    }

    /// The load of link `dir`, as the driver measured it.
    pub fn set_load(&mut self, dir: Dir, load: LinkLoad) {
        self.loads[usize::from(dir.index())] = load;
    }

    /// The load of link `dir`.
    pub fn load(&self, dir: Dir) -> LinkLoad {
        self.loads[usize::from(dir.index())]
    }

    /// The driver saw link `dir` go down (or come back): source-routed frames stop using
    /// it at once, before the view says so.
    pub fn set_link_up(&mut self, now: Time, view: &LinkView, dir: Dir, up: bool) {
        let was = !self.down.contains(dir);
        self.down = if up {
            self.down.without(dir)
        } else {
            self.down.with(dir)
        };
        if was && !up {
            if let Some(b) = &mut self.bsr {
                b.on_link_down(now, view, self.local, dir);
            }
        }
    }

    fn usable(&self, view: &LinkView, dir: Dir) -> bool {
        view.live_dirs(self.local).contains(dir) && !self.down.contains(dir)
    }

    /// Free capacity of a link, Mb/s (unmeasured links count as free).
    fn free(&self, dir: Dir, sending: bool) -> u32 {
        let l = self.load(dir);
        if l.capacity_bps == 0 {
            return u32::MAX;
        }
        if sending {
            l.tx_free_mbps()
        } else {
            l.rx_free_mbps()
        }
    }

    /// `service` is about to send to `dst`: the flow's route now (starting the flow if
    /// new), when that service's traffic is source-routed.
    pub fn touch(&mut self, now: Time, view: &LinkView, dst: Coord, service: u16) {
        if self.bsr.is_none() || !self.active || !self.routes_service(Some(service)) {
            return;
        }
        let mut free = [0u32; 6];
        for d in Dir::ALL {
            free[usize::from(d.index())] = self.free(d, true);
        }
        if let Some(b) = &mut self.bsr {
            b.route(now, view, dst, &free);
        }
    }

    /// The route frames to `dst` take now, if this server source-routes to it.
    pub fn route_to(&self, dst: Coord) -> Option<Route> {
        if !self.active {
            return None;
        }
        self.bsr.as_ref()?.current(dst).map(|(_, r)| r)
    }

    /// Writes the route of the frame `buf[..len]` of `service` (`None`: the connection's
    /// own) when it goes to a source-routed peer on that route's first hop: the new length.
    pub fn stamp(&mut self, buf: &mut [u8], len: usize, link: Dir, service: Option<u16>) -> usize {
        let Some(Dest::Server(dst)) = wire::FrameView::new_checked(&buf[..len])
            .ok()
            .map(|v| v.dst())
        else {
            return len;
        };
        match self.route_for(dst, service) {
            Some(r) if r.first() == link => match source::insert(buf, len, &r) {
                Some(n) => {
                    self.stats.routed_sent += 1;
                    if let Some(b) = &mut self.bsr {
                        b.on_sent(dst, n);
                    }
                    n
                }
                None => len,
            },
            _ => len,
        }
    }

    /// Handles a source-routed frame of `frame_len` bytes that reached this server
    /// (`frame` holds at least its headers and route), its header `h` parsed, having come
    /// in on `in_link`.
    pub fn on_frame(
        &mut self,
        now: Time,
        view: &LinkView,
        in_link: Option<Dir>,
        h: &Header,
        frame: &mut [u8],
        frame_len: usize,
    ) -> Fate {
        let dst = match h.dst {
            Dest::Server(d) => d,
            Dest::Key(_) => {
                self.stats.bad_route += 1;
                return Fate::BadRoute;
            }
        };
        match source::step(frame, frame_len) {
            Err(_) => {
                self.stats.bad_route += 1;
                Fate::BadRoute
            }
            Ok(Step::Arrived) if dst != self.local => {
                self.stats.bad_route += 1;
                Fate::BadRoute
            }
            Ok(Step::Arrived) => Fate::Arrived(source::strip(frame)),
            Ok(Step::Next { index, dir }) => {
                if !self.usable(view, dir) {
                    self.stats.path_failed += 1;
                    self.report_failure(now, h, index, dir);
                    return Fate::PathFailed;
                }
                if h.kind == Kind::Probe {
                    let mut mbps = self.free(dir, true);
                    if let Some(i) = in_link {
                        mbps = mbps.min(self.free(i, false));
                    }
                    let at = HEADERS_LEN + usize::from(h.route_len);
                    if let Some(p) = frame.get_mut(at..at + PROBE_LEN) {
                        Probe::lower(p, mbps);
                    }
                }
                self.stats.forwarded += 1;
                Fate::Next(dir)
            }
        }
    }

    fn report_failure(&mut self, now: Time, h: &Header, hop: usize, dir: Dir) {
        let Dest::Server(dst) = h.dst else {
            return;
        };
        if h.src == self.local {
            return;
        }
        self.reported
            .retain(|(_, _, t)| now.since(*t) < REPORT_HOLD);
        if self
            .reported
            .iter()
            .any(|(s, d, _)| *s == h.src && *d == dst)
        {
            return;
        }
        self.reported.push_back((h.src, dst, now));
        if self.out.len() >= MAX_PENDING {
            return;
        }
        self.stats.failures_sent += 1;
        self.out.push_back(Pending::Report {
            dst: h.src,
            probe: Probe {
                kind: ProbeKind::Failure {
                    hop: hop as u8,
                    dir,
                },
                path: 0,
                round: 0,
                avail_mbps: 0,
                flow_dst: dst,
            },
        });
    }

    /// A probe frame for this server (its route, if any, taken out): a probe is answered,
    /// a reply or failure report goes to path selection. Malformed payloads are ignored.
    pub fn on_probe_here(
        &mut self,
        now: Time,
        view: &LinkView,
        in_link: Option<Dir>,
        h: &Header,
        payload: &[u8],
    ) {
        let Some(mut p) = Probe::parse(payload) else {
            return;
        };
        match p.kind {
            ProbeKind::Probe => {
                if let Some(i) = in_link {
                    p.avail_mbps = p.avail_mbps.min(self.free(i, false));
                }
                if self.out.len() >= MAX_PENDING {
                    return;
                }
                p.kind = ProbeKind::Reply;
                self.stats.replies_sent += 1;
                self.out.push_back(Pending::Report {
                    dst: h.src,
                    probe: p,
                });
            }
            _ => {
                if let Some(b) = &mut self.bsr {
                    b.on_probe(now, view, h.src, &p);
                }
            }
        }
    }

    /// The view changed.
    pub fn on_view(&mut self, now: Time, view: &LinkView) {
        if let Some(b) = &mut self.bsr {
            b.on_view(now, view);
        }
    }

    /// When [`SourceRouter::handle_timeout`] must run.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.bsr.as_ref()?.poll_timeout()
    }

    /// Runs path selection's timers.
    pub fn handle_timeout(&mut self, now: Time, view: &LinkView) {
        if let Some(b) = &mut self.bsr {
            b.handle_timeout(now, view);
        }
    }

    /// Whether frames of source routing wait to be sent.
    pub fn has_pending(&self) -> bool {
        !self.out.is_empty() || self.bsr.as_ref().is_some_and(Bsr::has_probes)
    }

    /// Writes the next probe, reply or failure report into `buf`, on a link in `room`.
    pub fn poll_transmit(
        &mut self,
        view: &LinkView,
        routes: &RouteTable,
        room: DirSet,
        buf: &mut [u8],
    ) -> Option<(Dir, usize)> {
        if let Some(b) = &mut self.bsr {
            while let Some(p) = b.poll_probe() {
                let mut free = u32::MAX;
                let first = p.route.first();
                let l = self.loads[usize::from(first.index())];
                if l.capacity_bps != 0 {
                    free = l.tx_free_mbps();
                }
                self.out.push_back(Pending::Probe {
                    dst: p.dst,
                    route: p.route,
                    probe: Probe {
                        kind: ProbeKind::Probe,
                        path: p.path,
                        round: p.round,
                        avail_mbps: free,
                        flow_dst: p.dst,
                    },
                });
            }
        }
        for _ in 0..self.out.len() {
            let p = self.out.pop_front()?;
            let (dst, dir, route, probe) = match p {
                Pending::Probe { dst, route, probe } => {
                    if !self.usable(view, route.first()) {
                        continue; // the round's deadline counts it failed
                    }
                    (dst, Some(route.first()), Some(route), probe)
                }
                Pending::Report { dst, probe } => (
                    dst,
                    routes.next_hops(dst).iter().find(|d| room.contains(*d)),
                    None,
                    probe,
                ),
            };
            if routes.next_hops(dst).is_empty() && route.is_none() {
                continue; // the server it answers is out of reach: nothing to tell
            }
            let Some(dir) = dir.filter(|d| room.contains(*d)) else {
                self.out.push_back(p);
                continue;
            };
            let mut h = Header::new(Kind::Probe, self.local, Dest::Server(dst));
            h.payload_len = PROBE_LEN as u16;
            let len = HEADERS_LEN + PROBE_LEN;
            if buf.len() < len + wire::MAX_ROUTE_HOPS || h.emit(buf).is_err() {
                return None;
            }
            probe.emit(&mut buf[HEADERS_LEN..len])?;
            let len = match route {
                Some(r) => source::insert(buf, len, &r)?,
                None => len,
            };
            return Some((dir, len));
        }
        None
    }
}
