//! The control plane of one server, sans-IO (CamCube's bootstrap and link state,
//! CamCubeOS paper 3.1-3.3): coordinates from a wiring plan, neighbour discovery and miswiring
//! checks, hellos and failure detection per link, and a flooded link-state database from
//! which every server computes the whole torus's live-link view.
//!
//! Frames travel on EtherType 0x88B6, which the XDP program passes to the kernel, so the
//! control plane works whether or not the dataplane is running. Layout in docs/control.md.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::routing::LinkView;
use crate::time::Time;
use crate::topology::{Coord, Dims, Dir, DirSet};
use crate::wire::{ETHERTYPE_CONTROL, ETH_LEN};

/// Bytes of the control header after Ethernet: magic, version, type, flags, reserved.
const HDR: usize = 6;
/// Bytes of the authentication trailer (truncated HMAC-SHA256).
pub const MAC_LEN: usize = 16;
const HELLO: u8 = 1;
const LSA: u8 = 2;
const FLAG_AUTH: u8 = 1;
const HELLO_LEN: usize = ETH_LEN + HDR + 36;
const LSA_LEN: usize = ETH_LEN + HDR + 32;

/// Settings of the control plane of one server.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// This server's unique id (the lowest id becomes origin if none is configured).
    pub node_id: u64,
    /// The torus.
    pub dims: Dims,
    /// The directions this server has links in (the wiring plan).
    pub links: DirSet,
    /// This server is the origin, (0,0,0).
    pub origin: bool,
    /// Its coordinate, if already assigned (persisted from an earlier run).
    pub coord: Option<Coord>,
    /// Hello interval.
    pub hello: Duration,
    /// A link is down after this many hello intervals without one.
    pub dead_after: u32,
    /// How often a server re-floods its link-state record unchanged.
    pub refresh: Duration,
    /// A record not refreshed for this long is dropped (its server is gone).
    pub max_age: Duration,
    /// With no configured origin: how long to wait before the lowest id elects itself.
    pub election_delay: Duration,
    /// Cluster key: control frames carry an HMAC and unauthenticated ones are dropped.
    pub key: Option<Vec<u8>>,
    /// First sequence number of this incarnation (e.g. milliseconds since the epoch), so a
    /// restarted server's records are newer than its old ones.
    pub incarnation: u64,
    /// How long a server that comes (back) up relays traffic before it takes its keys. Its
    /// record carries the instant it takes them, so every server that has the record by
    /// then hands the keys over at the same moment: no key has two roots while the news
    /// spreads (the flood must reach everyone within this time).
    pub join_holddown: Duration,
    /// How long a change waits before the view is recomputed, so that the records a
    /// single event sets off (a dead server's neighbours all report it) cost one
    /// recomputation, not one each; OSPF's SPF delay. Take-over instants do not wait.
    pub spf_delay: Duration,
    /// The wall-clock time (nanoseconds since the Unix epoch) of this control plane's
    /// `Time::ZERO`: take-over instants travel as wall-clock times, so servers with
    /// synchronised clocks agree on them (a simulation gives every server the same epoch).
    pub epoch_unix_ns: u64,
}

impl ControlConfig {
    /// Defaults: 100 ms hellos, down after 3 missed, refresh every second, records live 3 s.
    pub fn new(node_id: u64, dims: Dims, links: DirSet) -> ControlConfig {
        ControlConfig {
            node_id,
            dims,
            links,
            origin: false,
            coord: None,
            hello: Duration::from_millis(100),
            dead_after: 3,
            refresh: Duration::from_secs(1),
            max_age: Duration::from_secs(3),
            election_delay: Duration::from_secs(1),
            key: None,
            incarnation: 0,
            join_holddown: Duration::from_millis(200),
            spf_delay: Duration::from_millis(10),
            epoch_unix_ns: 0,
        }
    }
}

/// What a neighbour said about itself in its last hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbor {
    /// Its node id.
    pub node_id: u64,
    /// Its MAC on this link.
    pub mac: [u8; 6],
    /// Its coordinate, once it has one.
    pub coord: Option<Coord>,
    /// The direction it gives this link.
    pub dir: Dir,
}

/// State of one link.
#[derive(Debug, Clone, Default)]
pub struct LinkState {
    /// Up: two-way hellos within the dead interval and consistent with the torus.
    pub up: bool,
    /// When the last hello arrived.
    pub last_hello: Option<Time>,
    /// Who is at the other end.
    pub neighbor: Option<Neighbor>,
    /// Why the link is not used although hellos arrive (miswiring), if so.
    pub miswired: Option<String>,
}

/// A record of the link-state database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The server's coordinate (None before it has one).
    pub coord: Option<Coord>,
    /// Its sequence number.
    pub seq: u64,
    /// Its live links.
    pub live: DirSet,
    /// When it takes its keys, wall-clock nanoseconds since the Unix epoch (0: it does).
    pub active_unix_ns: u64,
    /// When we last heard it.
    pub heard: Time,
}

/// Something the daemon should act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlEvent {
    /// This server's coordinate was assigned (persist it).
    CoordAssigned(Coord),
    /// A link is wired inconsistently with the torus.
    Miswired {
        /// The link.
        dir: Dir,
        /// What was expected and seen.
        detail: String,
    },
    /// A link came up.
    LinkUp(Dir),
    /// A link went down.
    LinkDown(Dir),
    /// The torus view changed; a new version is available.
    ViewChanged(u64),
    /// A frame was refused (malformed or unauthenticated).
    Refused(String),
}

/// The control plane of one server.
#[derive(Debug)]
pub struct ControlNode {
    cfg: ControlConfig,
    coord: Option<Coord>,
    links: [LinkState; 6],
    lsdb: BTreeMap<u64, Record>,
    seq: u64,
    last_flood: Option<Time>,
    next_hello: Time,
    started: Option<Time>,
    out: VecDeque<(Dir, Vec<u8>)>,
    events: VecDeque<ControlEvent>,
    view: Option<LinkView>,
    version: u64,
    dirty: bool,
    /// Since when a change waits for the view to be recomputed.
    dirty_since: Option<Time>,
    /// The latest time the driver gave (changes made without one are stamped with it).
    last_now: Time,
    /// The torus with everything up, kept so that a recomputation copies it instead of
    /// rebuilding the neighbour table.
    base: Option<LinkView>,
    /// Whether this server's dataplane runs: while it does not, the server advertises no
    /// live link, so nobody routes to or through a server that would drop every frame.
    dataplane_up: bool,
    /// Whether its dataplane serves (it has taken a view and runs): only then does a server
    /// that advertises links take its keys.
    serving: bool,
    /// When this server takes its keys: set when it starts advertising links after
    /// advertising none (a start, a restart, the end of an isolation) and serves.
    active_at: Option<Time>,
    /// The next instant a joining server (this one or another) takes its keys: the view
    /// changes then, without any frame saying so.
    next_activation: Option<Time>,
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn get64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

impl ControlNode {
    /// The control plane with `cfg`.
    pub fn new(cfg: ControlConfig) -> ControlNode {
        let coord = cfg.coord.or(if cfg.origin {
            Some(Coord::new(0, 0, 0))
        } else {
            None
        });
        let seq = cfg.incarnation;
        let mut n = ControlNode {
            cfg,
            coord,
            links: Default::default(),
            lsdb: BTreeMap::new(),
            seq,
            last_flood: None,
            next_hello: Time::ZERO,
            started: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            view: None,
            version: 0,
            dirty: true,
            dirty_since: None,
            last_now: Time::ZERO,
            base: None,
            dataplane_up: true,
            serving: true,
            active_at: None,
            next_activation: None,
        };
        if let (Some(c), None) = (n.coord, n.cfg.coord) {
            n.events.push_back(ControlEvent::CoordAssigned(c));
        }
        n
    }

    // ---- getters ----

    /// This server's coordinate, once assigned.
    pub fn coord(&self) -> Option<Coord> {
        self.coord
    }

    /// This server's node id.
    pub fn node_id(&self) -> u64 {
        self.cfg.node_id
    }

    /// The torus.
    pub fn dims(&self) -> Dims {
        self.cfg.dims
    }

    /// State of the link in direction `d`.
    pub fn link(&self, d: Dir) -> &LinkState {
        &self.links[usize::from(d.index())]
    }

    /// The link-state database: node id -> record.
    pub fn lsdb(&self) -> &BTreeMap<u64, Record> {
        &self.lsdb
    }

    /// When this server takes (took) its keys: `None` while it advertises no link.
    pub fn active_at(&self) -> Option<Time> {
        self.active_at
    }

    /// [`ControlNode::active_at`] on the wall clock, nanoseconds since the Unix epoch.
    pub fn active_at_unix_ns(&self) -> Option<u64> {
        self.active_at.map(|t| self.wall(t))
    }

    /// The current view and its version, once this server has a coordinate.
    pub fn view(&self) -> Option<(u64, &LinkView)> {
        self.view.as_ref().map(|v| (self.version, v))
    }

    // ---- frames in ----

    /// Handles a control frame received on link `dir` (Ethernet header included).
    pub fn handle_frame(&mut self, now: Time, dir: Dir, frame: &[u8]) {
        self.started.get_or_insert(now);
        self.last_now = self.last_now.max(now);
        match self.parse(frame) {
            Ok((ty, body)) => match ty {
                HELLO => self.on_hello(now, dir, frame, body),
                LSA => self.on_lsa(now, dir, body),
                _ => {}
            },
            Err(why) => self.events.push_back(ControlEvent::Refused(why)),
        }
    }

    /// Checks framing and authentication; the type and the body.
    fn parse<'a>(&self, frame: &'a [u8]) -> Result<(u8, &'a [u8]), String> {
        if frame.len() < ETH_LEN + HDR {
            return Err(format!(
                "control frame of {} bytes is too short",
                frame.len()
            ));
        }
        if frame[12..14] != ETHERTYPE_CONTROL.to_be_bytes()
            || frame[14] != b'T'
            || frame[15] != b'C'
        {
            return Err("not a torus control frame".into());
        }
        if frame[16] != 1 {
            return Err(format!("control version {} is not spoken here", frame[16]));
        }
        let ty = frame[17];
        let auth = frame[18] & FLAG_AUTH != 0;
        let want = match ty {
            HELLO => HELLO_LEN,
            LSA => LSA_LEN,
            t => return Err(format!("unknown control frame type {t}")),
        };
        let need = want + if auth { MAC_LEN } else { 0 };
        if frame.len() < need {
            return Err(format!(
                "control frame type {ty} truncated: {} of {need} bytes",
                frame.len()
            ));
        }
        match (&self.cfg.key, auth) {
            (Some(key), true) => {
                let mut m = Hmac::<Sha256>::new_from_slice(key).map_err(|e| e.to_string())?;
                m.update(&frame[ETH_LEN..want]);
                let tag = m.finalize().into_bytes();
                if tag[..MAC_LEN] != frame[want..want + MAC_LEN] {
                    return Err("control frame with a wrong cluster key".into());
                }
            }
            (Some(_), false) => {
                return Err("unauthenticated control frame (a cluster key is set)".into())
            }
            (None, _) => {}
        }
        Ok((ty, &frame[ETH_LEN + HDR..want]))
    }

    fn on_hello(&mut self, now: Time, dir: Dir, frame: &[u8], b: &[u8]) {
        if !self.cfg.links.contains(dir) {
            return;
        }
        let node_id = get64(b, 0);
        let has = b[8] != 0;
        let Some(their_dir) = Dir::from_index(b[9]) else {
            self.events.push_back(ControlEvent::Refused(format!(
                "hello with bad direction {}",
                b[9]
            )));
            return;
        };
        let their = Coord::new(get16(b, 10), get16(b, 12), get16(b, 14));
        let heard = get64(b, 16);
        let their_dims = (get16(b, 24), get16(b, 26), get16(b, 28));
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&frame[6..12]);
        let d = self.cfg.dims;
        let dims_ok = their_dims == (d.x(), d.y(), d.z());
        let coord = has.then_some(their).filter(|c| d.contains(*c));

        // Adopt a coordinate from the first neighbour that has one, when consistent.
        if self.coord.is_none() && dims_ok && their_dir == dir.opposite() {
            if let Some(c) = coord {
                let mine = d.neighbor(c, dir.opposite());
                self.assign(mine);
            }
        }
        let mut problem = None;
        if !dims_ok {
            problem = Some(format!(
                "neighbour node {node_id} runs a {}x{}x{} torus, this server {d}",
                their_dims.0, their_dims.1, their_dims.2
            ));
        } else if their_dir != dir.opposite() {
            problem = Some(format!(
                "expected the neighbour to call this link {}, it calls it {their_dir} (node {node_id})",
                dir.opposite()
            ));
        } else if let (Some(me), Some(c)) = (self.coord, coord) {
            let want = d.neighbor(me, dir);
            if c != want {
                problem = Some(format!(
                    "expected the neighbour at {want}, saw node {node_id} at {c}"
                ));
            }
        }
        let l = &mut self.links[usize::from(dir.index())];
        l.last_hello = Some(now);
        l.neighbor = Some(Neighbor {
            node_id,
            mac,
            coord,
            dir: their_dir,
        });
        if l.miswired != problem {
            if let Some(p) = &problem {
                self.events.push_back(ControlEvent::Miswired {
                    dir,
                    detail: p.clone(),
                });
            }
            l.miswired = problem.clone();
        }
        // Up only two-way (they hear us) and consistent.
        let up = problem.is_none() && heard == self.cfg.node_id;
        self.set_up(dir, up);
    }

    /// Takes a coordinate for good, and tells everyone (a new record).
    fn assign(&mut self, c: Coord) {
        self.coord = Some(c);
        self.events.push_back(ControlEvent::CoordAssigned(c));
        self.seq += 1;
        self.last_flood = None;
        self.touch();
    }

    fn set_up(&mut self, dir: Dir, up: bool) {
        let l = &mut self.links[usize::from(dir.index())];
        if l.up != up {
            l.up = up;
            self.events.push_back(if up {
                ControlEvent::LinkUp(dir)
            } else {
                ControlEvent::LinkDown(dir)
            });
            self.seq += 1;
            self.last_flood = None;
            self.touch();
            if up {
                // Database exchange, as OSPF does on adjacency: a neighbour that just
                // (re)started learns every record now instead of over a refresh period.
                for (origin, r) in &self.lsdb {
                    let f = self.lsa_frame(*origin, r.coord, r.live, r.seq, r.active_unix_ns);
                    self.out.push_back((dir, f));
                }
            }
        }
    }

    /// Whether every link a neighbour answers on is up (two-way, consistent) and at least
    /// one is: after a restart, the database exchange on those links has then begun.
    pub fn adjacent(&self) -> bool {
        let mut any = false;
        for d in self.cfg.links.iter() {
            let l = &self.links[usize::from(d.index())];
            if l.neighbor.is_some() && l.miswired.is_none() {
                if !l.up {
                    return false;
                }
                any = true;
            }
        }
        any
    }

    fn on_lsa(&mut self, now: Time, from: Dir, b: &[u8]) {
        let origin = get64(b, 0);
        let has = b[8] != 0;
        let live = DirSet::from_bits(b[9]);
        let c = Coord::new(get16(b, 10), get16(b, 12), get16(b, 14));
        let seq = get64(b, 16);
        let active_unix_ns = get64(b, 24);
        if origin == self.cfg.node_id {
            // Our own record came back; an older incarnation's makes us jump past it.
            if seq > self.seq {
                self.seq = seq + 1;
                self.last_flood = None;
            }
            return;
        }
        let coord = has.then_some(c).filter(|c| self.cfg.dims.contains(*c));
        let newer = self.lsdb.get(&origin).is_none_or(|r| seq > r.seq);
        if let Some(r) = self.lsdb.get_mut(&origin) {
            if seq == r.seq {
                r.heard = now;
                return;
            }
        }
        if !newer {
            return;
        }
        let changed = self.lsdb.get(&origin).is_none_or(|r| {
            r.coord != coord || r.live != live || r.active_unix_ns != active_unix_ns
        });
        self.lsdb.insert(
            origin,
            Record {
                coord,
                seq,
                live,
                active_unix_ns,
                heard: now,
            },
        );
        if changed {
            self.touch();
        }
        // Flood on every other up link.
        let frame = self.lsa_frame(origin, coord, live, seq, active_unix_ns);
        for d in self.cfg.links.iter() {
            if d != from && self.links[usize::from(d.index())].up {
                self.out.push_back((d, frame.clone()));
            }
        }
    }

    // ---- timers ----

    /// The next time `handle_timeout` must run.
    pub fn poll_timeout(&self) -> Option<Time> {
        // A change of this server's own record floods at once.
        let Some(f) = self.last_flood else {
            return Some(Time::ZERO);
        };
        let mut t = self.next_hello.min(f + self.cfg.refresh);
        if self.dirty {
            t = t.min(self.dirty_since.unwrap_or(Time::ZERO) + self.cfg.spf_delay);
        }
        if let Some(a) = self.next_activation {
            t = t.min(a);
        }
        // Link death is noticed at the next hello tick at the latest.
        Some(t)
    }

    /// Sends hellos, detects dead links, refreshes and ages records, elects an origin,
    /// recomputes the view.
    pub fn handle_timeout(&mut self, now: Time) {
        let started = *self.started.get_or_insert(now);
        self.last_now = self.last_now.max(now);
        let dead = self.cfg.hello * self.cfg.dead_after;
        for d in self.cfg.links.iter() {
            let l = &self.links[usize::from(d.index())];
            if l.up && l.last_hello.is_none_or(|t| now.since(t) > dead) {
                self.set_up(d, false);
            }
        }
        // Election: no origin anywhere, we waited, and no lower id is known.
        if self.coord.is_none() && now.since(started) >= self.cfg.election_delay {
            let anyone_placed = self.lsdb.values().any(|r| r.coord.is_some())
                || self
                    .links
                    .iter()
                    .any(|l| l.neighbor.is_some_and(|n| n.coord.is_some()));
            let lowest = self.lsdb.keys().all(|id| *id > self.cfg.node_id)
                && self
                    .links
                    .iter()
                    .all(|l| l.neighbor.is_none_or(|n| n.node_id > self.cfg.node_id));
            if !anyone_placed && lowest {
                self.assign(Coord::new(0, 0, 0));
            }
        }
        // Records age at hello ticks: a pass over the whole database per frame would cost
        // more than the frame, and a record's lifetime is seconds.
        if now >= self.next_hello {
            let before = self.lsdb.len();
            let max_age = self.cfg.max_age;
            self.lsdb.retain(|_, r| now.since(r.heard) <= max_age);
            if self.lsdb.len() != before {
                self.touch();
            }
        }
        // A take-over instant is the same for every server: recompute at it, not after it.
        let take_over = self.next_activation.is_some_and(|a| a <= now);
        if take_over {
            self.touch();
        }
        // A server that starts advertising links after advertising none joins: it takes its
        // keys a hold-down from now, an instant its record tells everyone.
        match (self.advertised().is_empty(), self.active_at) {
            (false, None) if self.serving => {
                self.active_at = Some(now + self.cfg.join_holddown);
                self.last_flood = None;
                self.touch();
            }
            (true, Some(_)) => self.active_at = None,
            _ => {}
        }
        if now >= self.next_hello {
            for d in self.cfg.links.iter() {
                let f = self.hello_frame(d);
                self.out.push_back((d, f));
            }
            self.next_hello = now + self.cfg.hello;
        }
        if self
            .last_flood
            .is_none_or(|t| now.since(t) >= self.cfg.refresh)
        {
            // Every flood is a new sequence number, so refreshes travel the whole torus
            // (receivers forward only newer records) and keep far records from ageing out.
            if self.last_flood.is_some() {
                self.seq += 1;
            }
            self.last_flood = Some(now);
            let active = self.active_at.map_or(0, |t| self.wall(t));
            let f = self.lsa_frame(
                self.cfg.node_id,
                self.coord,
                self.advertised(),
                self.seq,
                active,
            );
            for d in self.cfg.links.iter() {
                if self.links[usize::from(d.index())].up {
                    self.out.push_back((d, f.clone()));
                }
            }
        }
        self.recompute(now, take_over);
    }

    /// Notes that the view must be recomputed (after the SPF delay).
    fn touch(&mut self) {
        self.dirty = true;
        self.dirty_since.get_or_insert(self.last_now);
    }

    /// `t` as wall-clock nanoseconds since the Unix epoch (never 0, which means "active").
    fn wall(&self, t: Time) -> u64 {
        self.cfg.epoch_unix_ns.saturating_add(t.0).max(1)
    }

    /// The links this server advertises: those up, while its dataplane runs. (Its own view
    /// keeps its real links: that view is for its dataplane, which is back when it reads it.)
    fn advertised(&self) -> DirSet {
        if self.dataplane_up {
            self.live()
        } else {
            DirSet::EMPTY
        }
    }

    fn live(&self) -> DirSet {
        self.cfg
            .links
            .iter()
            .filter(|d| self.links[usize::from(d.index())].up)
            .collect()
    }

    /// Tells the control plane whether this server's dataplane runs. A server whose
    /// dataplane is gone (killed, restarting) still speaks the control protocol (hellos,
    /// flooding, its coordinate) but advertises no live link, so the others route around it
    /// until it is back; both changes are flooded at once.
    pub fn set_dataplane(&mut self, up: bool) {
        if self.dataplane_up != up {
            self.dataplane_up = up;
            self.seq += 1;
            self.last_flood = None;
            self.touch();
        }
    }

    /// Tells the control plane whether this server's dataplane serves (not merely starts):
    /// a server takes its keys, a hold-down after it joins, only while it does. A dataplane
    /// that is still attaching its links cannot serve the messages for them, and its
    /// neighbours may briefly miss this server's hellos meanwhile and take the same keys.
    pub fn set_serving(&mut self, on: bool) {
        if self.serving != on {
            self.serving = on;
            if !on && self.active_at.take().is_some() {
                // Its record no longer names a take-over instant: flooded at once.
                self.seq += 1;
                self.last_flood = None;
            }
            self.touch();
        }
    }

    /// Whether this server's dataplane is known to run.
    pub fn dataplane_up(&self) -> bool {
        self.dataplane_up
    }

    /// Rebuilds the view from the database when something changed.
    fn recompute(&mut self, now: Time, at_once: bool) {
        let due = self
            .dirty_since
            .is_none_or(|d| now >= d + self.cfg.spf_delay);
        if !self.dirty || !(due || at_once) {
            return;
        }
        self.dirty = false;
        self.dirty_since = None;
        let Some(me) = self.coord else { return };
        let dims = self.cfg.dims;
        if self.base.is_none() {
            self.base = LinkView::all_up(dims).ok();
        }
        let Some(base) = &self.base else { return };
        // Indexed by server: the database is keyed by node id, but the view is built per
        // coordinate, and a map lookup per link cost most of a recomputation at scale.
        let mut live: Vec<Option<DirSet>> = vec![None; dims.count() as usize];
        let now_wall = self.wall(now);
        let mut next: Option<u64> = None;
        let mut joining = Vec::new();
        for r in self.lsdb.values() {
            if let Some(c) = r.coord {
                live[dims.index(c)] = Some(r.live);
                if r.active_unix_ns > now_wall && !r.live.is_empty() {
                    joining.push(c);
                    next = Some(next.map_or(r.active_unix_ns, |n| n.min(r.active_unix_ns)));
                }
            }
        }
        live[dims.index(me)] = Some(self.live());
        match self.active_at {
            Some(a) if a > now => {
                joining.push(me);
                let a = self.wall(a);
                next = Some(next.map_or(a, |n| n.min(a)));
            }
            // Cut off (or not yet adjacent): this server would be the root of every key in
            // its own view while the others have given its keys away.
            None if !self.cfg.links.is_empty() => joining.push(me),
            _ => {}
        }
        self.next_activation = next.map(|w| Time(w.saturating_sub(self.cfg.epoch_unix_ns)));
        let mut view = base.from_advertised(&live);
        for c in joining {
            let _ = view.set_joining(c, true);
        }
        if self.view.as_ref() != Some(&view) {
            self.view = Some(view);
            self.version += 1;
            self.events
                .push_back(ControlEvent::ViewChanged(self.version));
        }
    }

    // ---- frames out ----

    fn header(&self, ty: u8, len: usize) -> Vec<u8> {
        let auth = self.cfg.key.is_some();
        let mut f = vec![0u8; len + if auth { MAC_LEN } else { 0 }];
        f[0..6].copy_from_slice(&[0xff; 6]);
        f[12..14].copy_from_slice(&ETHERTYPE_CONTROL.to_be_bytes());
        f[14] = b'T';
        f[15] = b'C';
        f[16] = 1;
        f[17] = ty;
        f[18] = if auth { FLAG_AUTH } else { 0 };
        f
    }

    fn seal(&self, mut f: Vec<u8>, len: usize) -> Vec<u8> {
        if let Some(key) = &self.cfg.key {
            if let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) {
                m.update(&f[ETH_LEN..len]);
                let tag = m.finalize().into_bytes();
                f[len..len + MAC_LEN].copy_from_slice(&tag[..MAC_LEN]);
            }
        }
        f
    }

    fn hello_frame(&self, dir: Dir) -> Vec<u8> {
        let mut f = self.header(HELLO, HELLO_LEN);
        let b = ETH_LEN + HDR;
        put64(&mut f, b, self.cfg.node_id);
        f[b + 8] = u8::from(self.coord.is_some());
        f[b + 9] = dir.index();
        let c = self.coord.unwrap_or_default();
        put16(&mut f, b + 10, c.x);
        put16(&mut f, b + 12, c.y);
        put16(&mut f, b + 14, c.z);
        let heard = self.links[usize::from(dir.index())]
            .neighbor
            .map_or(0, |n| n.node_id);
        put64(&mut f, b + 16, heard);
        let d = self.cfg.dims;
        put16(&mut f, b + 24, d.x());
        put16(&mut f, b + 26, d.y());
        put16(&mut f, b + 28, d.z());
        self.seal(f, HELLO_LEN)
    }

    fn lsa_frame(
        &self,
        origin: u64,
        coord: Option<Coord>,
        live: DirSet,
        seq: u64,
        active_unix_ns: u64,
    ) -> Vec<u8> {
        let mut f = self.header(LSA, LSA_LEN);
        let b = ETH_LEN + HDR;
        put64(&mut f, b, origin);
        f[b + 8] = u8::from(coord.is_some());
        f[b + 9] = live.bits();
        let c = coord.unwrap_or_default();
        put16(&mut f, b + 10, c.x);
        put16(&mut f, b + 12, c.y);
        put16(&mut f, b + 14, c.z);
        put64(&mut f, b + 16, seq);
        put64(&mut f, b + 24, active_unix_ns);
        self.seal(f, LSA_LEN)
    }

    /// The next frame to send: its link and bytes (the driver sets the source MAC).
    pub fn poll_transmit(&mut self) -> Option<(Dir, Vec<u8>)> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ControlEvent> {
        self.events.pop_front()
    }
}

/// The fuzz body of the control plane's decoder (`fuzz/`'s `control`, and a short run in
/// the tests): a frame of any bytes arriving on any link of an origin server is taken or
/// dropped without a panic, and the server then runs its timers and sends as usual.
pub fn check_untrusted(data: &[u8]) {
    let dims = Dims::new(3, 3, 3).expect("3x3x3");
    let mut cfg = ControlConfig::new(1, dims, DirSet::ALL);
    cfg.origin = true;
    let mut n = ControlNode::new(cfg);
    let dir = Dir::ALL[usize::from(data.first().copied().unwrap_or(0)) % 6];
    n.handle_frame(Time::from_nanos(1_000_000), dir, data);
    n.handle_timeout(Time::from_nanos(200_000_000));
    for _ in 0..10_000 {
        if n.poll_transmit().is_none() {
            break;
        }
    }
    for _ in 0..10_000 {
        if n.poll_event().is_none() {
            break;
        }
    }
}
