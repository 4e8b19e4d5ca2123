//! One torus server's protocol engine, sans-IO: routing view, multi-hop forwarding, key
//! routing, the reliable transport and delivery to services. The AF_XDP dataplane, the
//! tests and the simulator all drive this same code; they only move bytes.
//!
//! Link ids are the link directions (0:+x .. 5:-z), so a `LinkSet` is a `DirSet`'s bits.

use std::collections::VecDeque;

use crate::routing::bsr::BsrConfig;
use crate::routing::load::LinkLoad;
use crate::routing::source_router::{Fate, SourceRouter, SourceStats};
use crate::routing::{LinkView, RouteTable, RoutingError};
use crate::time::Time;
use crate::topology::{Coord, Dims, Dir, DirSet};
use crate::transport::{
    self, Config as TransportConfig, FailReason, Fences, LinkSet, Outgoing, RecvError, SendError,
    Transport,
};
use crate::wire::{self, flags, Dest, FrameView, Header, Kind, HEADERS_LEN};

/// What the driver must do with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxAction {
    /// Handled here (delivered, or protocol state updated): the buffer is free again.
    Consumed,
    /// Not for this server: send the (already updated) frame on one of these links, the
    /// first that has room; drop it if none has.
    Forward(DirSet),
    /// Dropped, for this reason.
    Drop(DropReason),
}

/// What a frame handed to [`Node::handle_rx_lending`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<'f> {
    /// A message for a local service, borrowed from the frame (the engine queued no copy
    /// of it): the next event, as [`Event::Message`] with the lent `reliable` and no key.
    /// A reliable one is lent only when it is whole in its frame, the next of its
    /// connection, unfenced or its fence passed, and for no placer. The frame is consumed
    /// once the caller is done with it.
    Message(transport::Lent<'f>),
    /// Anything else: what [`Node::handle_rx`] would have returned.
    Action(RxAction),
}

/// Why a frame was dropped (the per-link drop counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Not a well-formed torus frame.
    Malformed,
    /// A source coordinate outside the torus, or this server's own.
    BadSource,
    /// No live path towards its destination.
    Unreachable,
    /// Its hop budget ran out (a loop, or a path longer than the TTL).
    TtlExpired,
    /// The transport refused it (out of window, bad fragment, too many peers...).
    Transport,
    /// A frame of a connection instance that is gone (sent before a restart or a reset).
    Stale,
    /// A service on the path consumed it.
    Intercepted,
    /// A malformed source route, or one that does not end at the frame's destination.
    BadRoute,
    /// The next hop its source route names is down here (the source was told).
    PathFailed,
}

impl DropReason {
    /// Every reason, for tables.
    pub const ALL: [DropReason; 9] = [
        DropReason::Malformed,
        DropReason::BadSource,
        DropReason::Unreachable,
        DropReason::TtlExpired,
        DropReason::Transport,
        DropReason::Stale,
        DropReason::Intercepted,
        DropReason::BadRoute,
        DropReason::PathFailed,
    ];

    /// Short name for counters.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::BadSource => "bad_source",
            DropReason::Unreachable => "unreachable",
            DropReason::TtlExpired => "ttl_expired",
            DropReason::Transport => "transport",
            DropReason::Stale => "stale",
            DropReason::Intercepted => "intercepted",
            DropReason::BadRoute => "bad_route",
            DropReason::PathFailed => "path_failed",
        }
    }
}

/// The links the transport may use: a source-routed flow's first hop, else the next hops.
struct NodePaths<'a> {
    routes: &'a RouteTable,
    /// `None` while source routing has never been used here.
    source: Option<&'a SourceRouter>,
}

impl NodePaths<'_> {
    fn links(&self, peer: Coord, service: Option<u16>) -> LinkSet {
        match self.source.and_then(|s| s.route_for(peer, service)) {
            Some(r) => LinkSet(DirSet::EMPTY.with(r.first()).bits()),
            None => LinkSet(self.routes.next_hops(peer).bits()),
        }
    }
}

impl transport::Paths for NodePaths<'_> {
    fn links_to(&self, peer: Coord) -> LinkSet {
        self.links(peer, None)
    }

    fn links_for(&self, peer: Coord, service: u16) -> LinkSet {
        self.links(peer, Some(service))
    }
}

/// Why a frame that failed the wire checks is dropped: its source route, or the rest.
fn refusal(e: wire::WireError) -> DropReason {
    match e {
        wire::WireError::Route(_) => DropReason::BadRoute,
        _ => DropReason::Malformed,
    }
}

/// What a service sees and may do with a frame passing through this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let it go on.
    Forward,
    /// Take it: it goes no further.
    Consume,
}

/// A service's hook on frames that pass through this server (CamCube lets services see and
/// change packets on path). Called for frames flagged `INTERCEPT` of that service.
pub trait Interceptor: Send {
    /// Sees the header and may change the payload in place.
    fn on_path(&mut self, header: &Header, payload: &mut [u8]) -> Verdict;
}

/// Something the application learns from the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message for a local service.
    Message {
        /// Who sent it.
        src: Coord,
        /// The service it is for.
        service: u16,
        /// Its bytes.
        data: Vec<u8>,
        /// Reliable, or short.
        reliable: bool,
        /// The routing key it was sent to, for key-routed messages.
        key: Option<u64>,
    },
    /// A server became unreachable in this server's view (CamCube's failure notification).
    Unreachable(Coord),
    /// A server became reachable again.
    Reachable(Coord),
    /// Reliable messages of `service` to `peer` were acknowledged, in send order (`count`
    /// since the last report, the last tagged `last_tag`); for services that asked.
    Acked {
        /// The server they went to.
        peer: Coord,
        /// The service that sent them.
        service: u16,
        /// How many.
        count: u32,
        /// The tag of the last one.
        last_tag: u64,
    },
    /// Messages of `service` to `peer` that will never be delivered (tags in send order).
    Failed {
        /// The server they were for.
        peer: Coord,
        /// The service that sent them.
        service: u16,
        /// Their tags.
        tags: Vec<u64>,
        /// Why.
        reason: FailReason,
    },
    /// The peer restarted or reset its connection with this server.
    PeerReset {
        /// The peer.
        peer: Coord,
        /// Restarted, or reset.
        reason: FailReason,
    },
}

impl From<transport::Event> for Event {
    fn from(e: transport::Event) -> Event {
        match e {
            transport::Event::Message {
                src,
                service,
                data,
                reliable,
            } => Event::Message {
                src,
                service,
                data,
                reliable,
                key: None,
            },
            transport::Event::Acked {
                peer,
                service,
                count,
                last_tag,
            } => Event::Acked {
                peer,
                service,
                count,
                last_tag,
            },
            transport::Event::Failed {
                peer,
                service,
                tags,
                reason,
            } => Event::Failed {
                peer,
                service,
                tags,
                reason,
            },
            transport::Event::PeerReset { peer, reason } => Event::PeerReset { peer, reason },
        }
    }
}

/// An event borrowed from the engine ([`Node::poll_event_ref`]): a message the transport
/// delivered is a slice of its inbox, valid until the next call on the engine; any other
/// event, messages the engine delivered itself included, is owned.
pub type EventRef<'a> = transport::EventRef<'a, Event>;

/// Where a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A server.
    Server(Coord),
    /// The server that roots a key (re-evaluated at every hop for short messages; resolved
    /// once, at the sender, for reliable ones, which then travel to that server).
    Key(u64),
}

/// How a message is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsgOptions {
    /// Reliable (exactly once, any size, fences honoured) or short (one frame, best effort).
    pub reliable: bool,
    /// Ordering constraints (reliable messages).
    pub fences: Fences,
    /// Let services on the path see it (key-routed short messages).
    pub intercept: bool,
    /// The sender's name for the message, returned in its acknowledgement or failure report.
    pub tag: u64,
    /// The local service that sends it, when not the destination service itself (an
    /// application talking to another service): its acknowledgement or failure is reported
    /// to this one.
    pub from: Option<u16>,
}

/// Counters of the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Frames forwarded towards another server.
    pub forwarded: u64,
    /// Key-routed messages delivered here (this server is the key's root in its view).
    pub key_delivered: u64,
    /// Frames seen by an interceptor.
    pub intercepted: u64,
    /// Key-routed messages dropped here because no server took keys in this server's
    /// view (it was cut off, or had just restarted and knew nobody yet).
    pub key_no_root: u64,
}

/// A queued key-routed short message.
#[derive(Debug)]
struct KeyMsg {
    key: u64,
    service: u16,
    data: Vec<u8>,
    intercept: bool,
}

/// The protocol engine of one server.
pub struct Node {
    local: Coord,
    dims: Dims,
    routes: RouteTable,
    view: LinkView,
    transport: Transport,
    key_out: VecDeque<KeyMsg>,
    events: VecDeque<Event>,
    interceptors: Vec<(u16, Box<dyn Interceptor>)>,
    stats: NodeStats,
    mtu: usize,
    source: SourceRouter,
    /// The latest time a caller gave: view changes arrive without one.
    last_now: Time,
    /// The unwritten tail of the frame built last ([`Node::take_declared_tail`]).
    declared: Option<(usize, u8)>,
    /// Source routing was enabled, or a source-routed frame or probe arrived: until then
    /// the source router has nothing to do and is not looked at (its state is cache lines
    /// of its own, read on every send and every transmit otherwise; a simulator's
    /// thousands of engines missed them each time).
    source_used: bool,
    transport_cfg: TransportConfig,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("local", &self.local)
            .field("dims", &self.dims)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Node {
    /// The engine of server `local` under `view`.
    pub fn new(local: Coord, view: LinkView, cfg: TransportConfig) -> Result<Node, RoutingError> {
        let routes = RouteTable::new(&view, local)?;
        Ok(Node {
            local,
            dims: view.dims(),
            routes,
            view,
            transport: Transport::new(local, cfg),
            key_out: VecDeque::new(),
            events: VecDeque::new(),
            interceptors: Vec::new(),
            stats: NodeStats::default(),
            mtu: cfg.mtu,
            source: SourceRouter::new(local),
            last_now: Time::ZERO,
            declared: None,
            source_used: false,
            transport_cfg: cfg,
        })
    }

    /// Makes this server source-route its own traffic (BCube's BSR: probe the parallel
    /// paths, use the one with the most available bandwidth per peer). Call before sending
    /// anything: frames keep room for the route, so the transport starts afresh with an MTU
    /// smaller by [`wire::MAX_ROUTE_HOPS`] bytes (what was configured on it, such as placers,
    /// service queues and hosted services, stays).
    pub fn enable_source_routing(&mut self, cfg: BsrConfig) {
        let mut t = self.transport_cfg;
        t.mtu = self.mtu.saturating_sub(wire::MAX_ROUTE_HOPS);
        self.transport.reconfigure(t);
        self.source.enable(cfg);
        self.source_used = true;
    }

    /// Turns source routing of this server's own traffic on or off after
    /// [`Node::enable_source_routing`]; false (and nothing changes) without it.
    pub fn set_source_routing(&mut self, on: bool) -> bool {
        self.source.set_active(on)
    }

    /// Source-routes only what these services send (`None`: everything this server sends).
    pub fn set_source_services(&mut self, services: Option<Vec<u16>>) {
        self.source.set_services(services);
    }

    /// Source routing at this server (forwarding, probes, path selection), for reports.
    pub fn source_routing(&self) -> &SourceRouter {
        &self.source
    }

    /// Counters of source routing.
    pub fn source_stats(&self) -> SourceStats {
        self.source.stats()
    }

    /// The driver can take `frames` more frames now: receiver pacing grants this room to
    /// the peers sending here ([`transport::Transport::set_rx_room`]).
    pub fn set_rx_room(&mut self, now: Time, frames: u32) {
        self.transport.set_rx_room(now, frames);
    }

    /// The driver's measurement of link `dir`'s load (what path probes collect).
    pub fn set_link_load(&mut self, dir: Dir, load: LinkLoad) {
        self.source.set_load(dir, load);
    }

    /// The driver saw link `dir` lose (or regain) its carrier: source-routed frames stop
    /// taking it at once, and their sources are told, before the view changes.
    pub fn set_link_up(&mut self, dir: Dir, up: bool) {
        self.source.set_link_up(self.last_now, &self.view, dir, up);
    }

    /// This server.
    pub fn local(&self) -> Coord {
        self.local
    }

    /// The torus.
    pub fn dims(&self) -> Dims {
        self.dims
    }

    /// The current view.
    pub fn view(&self) -> &LinkView {
        &self.view
    }

    /// The routing table under the current view.
    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    /// Counters of the engine.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// Counters of the transport.
    pub fn transport_stats(&self) -> transport::Stats {
        self.transport.stats()
    }

    /// The transport (read-only), for reports.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Adopts a new link-state view: routes follow, and services are told which servers
    /// became unreachable or reachable.
    pub fn set_view(&mut self, view: LinkView) -> Result<(), RoutingError> {
        if view.dims() != self.dims {
            return Err(RoutingError::TooLarge(view.dims()));
        }
        let before: Vec<bool> = self
            .dims
            .coords()
            .map(|c| self.routes.is_reachable(c))
            .collect();
        self.routes.absorb(&view);
        self.view = view;
        self.source.on_view(self.last_now, &self.view);
        for (i, was) in before.into_iter().enumerate() {
            let c = self.dims.coord(i);
            let now = self.routes.is_reachable(c);
            if was && !now {
                self.events.push_back(Event::Unreachable(c));
                // The control plane declared it gone: what was not acknowledged is reported
                // failed now rather than after the silent-peer deadline.
                self.transport.abort(c, FailReason::Unreachable);
            } else if !was && now {
                self.events.push_back(Event::Reachable(c));
            }
        }
        Ok(())
    }

    /// Registers a service's on-path hook.
    pub fn intercept(&mut self, service: u16, hook: Box<dyn Interceptor>) {
        self.interceptors.retain(|(s, _)| *s != service);
        self.interceptors.push((service, hook));
    }

    /// Lets `service` take its whole reliable messages straight from their frames (see
    /// [`crate::transport::Placer`]).
    pub fn set_placer(&mut self, service: u16, placer: Box<dyn crate::transport::Placer>) {
        self.transport.set_placer(service, placer);
    }

    /// Sets a service's fair-queuing weight and queue limit.
    pub fn configure_service(&mut self, service: u16, weight: u32, queue_bytes: usize) {
        self.transport
            .configure_service(service, weight, queue_bytes);
    }

    /// Sends a message. Short messages to a key are routed by key at every hop; reliable
    /// ones go to the key's root in this server's view.
    pub fn send(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        self.send_hinted(now, target, service, data, opts, None)
    }

    /// [`Node::send`], with `run` the value every byte of `data` has if the caller looked
    /// (once for many sends of the same bytes: the simulator's `send_many`): a compacting
    /// send queue ([`transport::Config::compact_runs`]) then does not look again.
    pub(crate) fn send_hinted(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
        run: Option<u8>,
    ) -> Result<(), SendError> {
        let MsgOptions {
            reliable,
            intercept,
            ..
        } = opts;
        let dest = match target {
            Target::Server(c) => c,
            Target::Key(k) if reliable => self.routes.key_root(k).unwrap_or(self.local),
            Target::Key(k) => {
                let max = self.mtu.saturating_sub(wire::TORUS_LEN);
                if data.len() > max {
                    return Err(SendError::TooLarge {
                        len: data.len(),
                        max,
                    });
                }
                if self.key_out.len() >= 4096 {
                    return Err(SendError::WouldBlock);
                }
                self.key_out.push_back(KeyMsg {
                    key: k,
                    service,
                    data: data.to_vec(),
                    intercept,
                });
                return Ok(());
            }
        };
        if dest == self.local {
            // No transport sees a message to this server, so none would refuse it and tell
            // its sender: the send does.
            if let Some(why) = reliable.then(|| self.transport.refusal(service)).flatten() {
                return Err(SendError::NotTaken(why));
            }
            self.events.push_back(Event::Message {
                src: self.local,
                service,
                data: data.to_vec(),
                reliable,
                key: match target {
                    Target::Key(k) => Some(k),
                    Target::Server(_) => None,
                },
            });
            return Ok(());
        }
        if !self.routes.is_reachable(dest) {
            return Err(SendError::Unreachable);
        }
        let m = self.outgoing(now, dest, service, data, opts);
        self.transport.send_hinted(now, m, run)
    }

    /// The transport's form of a message to `dest`, noted as sent now (the source router
    /// learns of traffic to `dest` from it).
    #[inline]
    fn outgoing<'a>(
        &mut self,
        now: Time,
        dest: Coord,
        service: u16,
        data: &'a [u8],
        opts: MsgOptions,
    ) -> Outgoing<'a> {
        self.last_now = self.last_now.max(now);
        let from = opts.from.unwrap_or(service);
        if self.source_used {
            self.source.touch(now, &self.view, dest, from);
        }
        Outgoing {
            dest,
            service,
            data,
            reliable: opts.reliable,
            fences: opts.fences,
            tag: opts.tag,
            from,
        }
    }

    /// Whether [`Node::send_framing`] may write a message of `len` bytes straight into a
    /// frame (see [`transport::Transport::may_frame_straight`]: a large message, or a small
    /// one when nothing waits); for any other message it is [`Node::send`], and a driver
    /// need not find it a buffer first.
    #[inline]
    pub fn frames_straight(&self, len: usize, reliable: bool) -> bool {
        self.transport.may_frame_straight(len, reliable)
    }

    /// As [`Node::send`], but a reliable message to a server that goes straight into its
    /// frame ([`Node::frames_straight`]) is written into `buf` (`mtu + 14` bytes, or empty
    /// when the driver has no buffer free) when nothing else waits to be sent, on a link in
    /// `room`: the transport's [`send_framing`](transport::Transport::send_framing), with
    /// the frame's link, length and whether the transport kept `buf` (as
    /// [`Node::poll_transmit_keeping`] returns them). `Ok(None)`: taken as `send` takes it.
    /// `Err(WouldBlock)` also when such a message cannot go at once: nothing was taken, try
    /// again after the next transmit. While source routes are being written into frames, or
    /// probes or keyed messages wait, it is `send`.
    #[allow(clippy::too_many_arguments)]
    pub fn send_framing(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
        room: DirSet,
        buf: &mut [u8],
        keep: Option<transport::Keep<'_>>,
    ) -> Result<Option<(Dir, usize, bool)>, SendError> {
        let dest = match target {
            Target::Server(c) => Some(c),
            Target::Key(k) if opts.reliable => self.routes.key_root(k),
            Target::Key(_) => None,
        };
        // Source routes are written into frames after the transport built them, and the
        // source router's probes go before anything else: neither may be bypassed.
        let stamped = self.source_used && self.source.is_enabled();
        let probes = self.source_used && self.source.has_pending();
        let Some(dest) = dest.filter(|&d| {
            d != self.local
                && !stamped
                && !probes
                && self.key_out.is_empty()
                && self.routes.is_reachable(d)
        }) else {
            return self.send(now, target, service, data, opts).map(|()| None);
        };
        self.declared = None;
        let m = self.outgoing(now, dest, service, data, opts);
        let paths = NodePaths {
            routes: &self.routes,
            source: self.source_used.then_some(&self.source),
        };
        let Some(t) =
            self.transport
                .send_framing(now, m, LinkSet(room.bits()), &paths, buf, keep)?
        else {
            return Ok(None);
        };
        // The transport's links are the node's directions (`room` came from a DirSet).
        let dir = Dir::from_index(t.link).unwrap_or(Dir::ALL[0]);
        Ok(Some((dir, t.len, t.kept)))
    }

    /// Handles a frame received on link `link` (Ethernet header included). The frame may be
    /// changed in place (TTL, interceptors) before it is forwarded.
    pub fn handle_rx(&mut self, now: Time, link: Dir, frame: &mut [u8]) -> RxAction {
        match self.rx(now, link, frame, false) {
            Received::Action(a) => a,
            // Nothing is lent unless asked for.
            Received::Message(_) => RxAction::Consumed,
        }
    }

    /// As [`Node::handle_rx`], but a message for this server that no event is queued
    /// ahead of comes back borrowed from `frame` ([`Received::Message`]) instead of being
    /// copied into the engine's inbox: the caller hands it on as the next event it would
    /// have polled, then frees the frame. (A simulator of thousands of servers, or a driver
    /// delivering from its receive buffers, saves a copy per message.)
    pub fn handle_rx_lending<'f>(
        &mut self,
        now: Time,
        link: Dir,
        frame: &'f mut [u8],
    ) -> Received<'f> {
        let lend = self.events.is_empty();
        self.rx(now, link, frame, lend)
    }

    fn rx<'f>(&mut self, now: Time, link: Dir, frame: &'f mut [u8], lend: bool) -> Received<'f> {
        self.last_now = self.last_now.max(now);
        let mut h = match FrameView::new_checked(frame).and_then(|v| Header::parse(&v)) {
            Ok(h) => h,
            Err(e) => return Received::Action(RxAction::Drop(refusal(e))),
        };
        let dest = match self.judge(h.src, h.dst, h.kind) {
            Ok(d) => d,
            Err(why) => return Received::Action(RxAction::Drop(why)),
        };
        let mut frame = frame;
        self.source_used |= h.route_len > 0 || h.kind == Kind::Probe;
        if h.route_len > 0 {
            let len = frame.len();
            match self
                .source
                .on_frame(now, &self.view, Some(link), &h, frame, len)
            {
                Fate::Arrived(at) => {
                    frame = &mut frame[at..];
                    // The header moved over the route: read it again as it now is.
                    h = match FrameView::new_checked(frame).and_then(|v| Header::parse(&v)) {
                        Ok(h) => h,
                        Err(e) => return Received::Action(RxAction::Drop(refusal(e))),
                    };
                }
                fate => return Received::Action(self.routed_on(fate, frame)),
            }
        }
        if h.kind == Kind::Probe {
            if dest == self.local {
                let payload = FrameView::new_checked(frame)
                    .map(|v| v.payload())
                    .unwrap_or(&[]);
                self.source
                    .on_probe_here(now, &self.view, Some(link), &h, payload);
                return Received::Action(RxAction::Consumed);
            }
            return Received::Action(self.pass_on(dest, frame));
        }
        if dest == self.local {
            return self.deliver(now, &h, frame, lend);
        }
        if h.has(flags::INTERCEPT) {
            if let Some(v) = self.run_interceptor(&h, frame) {
                if v == Verdict::Consume {
                    return Received::Action(RxAction::Drop(DropReason::Intercepted));
                }
            }
        }
        Received::Action(self.pass_on(dest, frame))
    }

    /// Where the state [`Node::handle_rx_head`] reads lives: a simulator running thousands
    /// of engines loads these cache lines one event ahead, since by the time the next frame
    /// passes through a server its engine has left the cache. Addresses only, never read.
    pub fn rx_head_lines(&self) -> [*const u8; 3] {
        [
            std::ptr::from_ref(&self.local).cast(),
            std::ptr::from_ref(&self.routes).cast(),
            std::ptr::from_ref(&self.stats).cast(),
        ]
    }

    /// Where the state a send and the frame it makes read lives ([`Node::rx_head_lines`]
    /// for the send path): a simulator sending from thousands of engines in turn loads
    /// them a few sends ahead. Addresses only, never read.
    pub fn send_lines(&self) -> [*const u8; 6] {
        let t = self.transport.send_lines();
        [
            std::ptr::from_ref(&self.local).cast(),
            std::ptr::from_ref(&self.routes).cast(),
            t[0],
            t[1],
            t[2],
            t[3],
        ]
    }

    /// Whether receiving a frame that begins with `head` ([`Node::handle_rx`] and its
    /// variants) may write past its torus header: a source-routed frame's header moves over
    /// its route when it arrives, and an interceptor may rewrite the payload on its way.
    /// Any other frame has at most its TTL and hop count changed, so a driver that keeps
    /// the rest of a frame's bytes elsewhere (the simulator, runs of one value) may rely on
    /// them being as they were. `true` when `head` is too short to tell.
    pub fn rx_may_write_past_header(head: &[u8]) -> bool {
        let (Some(fl), Some(route)) = (
            head.get(wire::offset::FLAGS..wire::offset::FLAGS + 2),
            head.get(wire::offset::ROUTE_LEN),
        ) else {
            return true;
        };
        let fl = u16::from_be_bytes([fl[0], fl[1]]);
        head.len() < HEADERS_LEN
            || *route != 0
            || fl & (flags::SOURCE_ROUTED | flags::INTERCEPT) != 0
    }

    /// [`Node::handle_rx`] for a holder of only the first bytes of a frame of `frame_len`
    /// bytes, `head` (at least the headers): the simulator keeps the payloads of frames in
    /// flight out of memory. `Some(action)` is what `handle_rx` decides from the headers
    /// alone (passed on, with TTL and hop count updated in `head`, or dropped); `None`
    /// when the payload is needed here (the frame is for this server, or an interceptor
    /// reads it): then call `handle_rx` with the whole frame.
    pub fn handle_rx_head(&mut self, head: &mut [u8], frame_len: usize) -> Option<RxAction> {
        // The route is part of the headers: a holder of fewer bytes cannot judge it.
        let route = usize::from(head.get(wire::offset::ROUTE_LEN).copied().unwrap_or(0));
        if head.len() < frame_len && head.len() < HEADERS_LEN + route {
            return None;
        }
        let p = match wire::Passing::parse_head(head, frame_len) {
            Ok(p) => p,
            Err(e) => return Some(RxAction::Drop(refusal(e))),
        };
        let dest = match self.judge(p.src, p.dst, p.kind) {
            Ok(d) => d,
            Err(why) => return Some(RxAction::Drop(why)),
        };
        if p.route_len > 0 {
            self.source_used = true;
            // The source router reads the whole header (checked already).
            let Ok(h) = Header::parse_head(head, frame_len) else {
                return Some(RxAction::Drop(DropReason::Malformed));
            };
            // A probe needs its link's figures, and an arriving frame its whole bytes.
            if h.kind == Kind::Probe || usize::from(h.route_next) == usize::from(h.route_len) {
                return None;
            }
            let now = self.last_now;
            let fate = self
                .source
                .on_frame(now, &self.view, None, &h, head, frame_len);
            return Some(self.routed_on(fate, head));
        }
        let intercepted =
            p.has(flags::INTERCEPT) && self.interceptors.iter().any(|(s, _)| *s == p.service);
        if dest == self.local || intercepted {
            return None;
        }
        Some(self.pass_on(dest, head))
    }

    /// Where a received frame goes by its header: the server it is for (this one or one
    /// further on), or why it is dropped.
    #[inline]
    fn judge(&self, src: Coord, dst: Dest, kind: Kind) -> Result<Coord, DropReason> {
        // Our own key-routed frame may come back when a key's root moved while it travelled;
        // a server-addressed frame from ourselves is bogus.
        let from_self = src == self.local && matches!(dst, Dest::Server(_));
        if !self.dims.contains(src) || from_self {
            return Err(DropReason::BadSource);
        }
        if kind == Kind::Control {
            return Err(DropReason::Malformed);
        }
        match dst {
            Dest::Server(d) if self.dims.contains(d) => Ok(d),
            Dest::Server(_) => Err(DropReason::Malformed),
            Dest::Key(k) => self.routes.key_root(k).ok_or(DropReason::Unreachable),
        }
    }

    /// What a source-routed frame that is not for this server becomes.
    fn routed_on(&mut self, fate: Fate, frame: &mut [u8]) -> RxAction {
        match fate {
            Fate::Next(dir) => {
                if !wire::forward_hop(frame) {
                    return RxAction::Drop(DropReason::TtlExpired);
                }
                self.stats.forwarded += 1;
                RxAction::Forward(DirSet::EMPTY.with(dir))
            }
            Fate::BadRoute | Fate::Arrived(_) => RxAction::Drop(DropReason::BadRoute),
            Fate::PathFailed => RxAction::Drop(DropReason::PathFailed),
        }
    }

    /// Passes a frame for `dest` on: its next hops, TTL and hop count updated in `frame`.
    #[inline]
    fn pass_on(&mut self, dest: Coord, frame: &mut [u8]) -> RxAction {
        let hops = self.routes.next_hops(dest);
        if hops.is_empty() {
            return RxAction::Drop(DropReason::Unreachable);
        }
        if !wire::forward_hop(frame) {
            return RxAction::Drop(DropReason::TtlExpired);
        }
        self.stats.forwarded += 1;
        RxAction::Forward(hops)
    }

    fn run_interceptor(&mut self, h: &Header, frame: &mut [u8]) -> Option<Verdict> {
        let hook = self
            .interceptors
            .iter_mut()
            .find(|(s, _)| *s == h.service)?;
        self.stats.intercepted += 1;
        let end = HEADERS_LEN + usize::from(h.payload_len);
        let payload = frame.get_mut(HEADERS_LEN..end)?;
        Some(hook.1.on_path(h, payload))
    }

    fn deliver<'f>(
        &mut self,
        now: Time,
        h: &Header,
        frame: &'f mut [u8],
        lend: bool,
    ) -> Received<'f> {
        if let Dest::Key(k) = h.dst {
            // Key-routed frames carry short messages, delivered to the key's root.
            if h.has(flags::INTERCEPT) {
                let _ = self.run_interceptor(h, frame);
            }
            let Ok(v) = FrameView::new_checked(frame) else {
                return Received::Action(RxAction::Drop(DropReason::Malformed));
            };
            self.stats.key_delivered += 1;
            self.events.push_back(Event::Message {
                src: h.src,
                service: h.service,
                data: v.payload().to_vec(),
                reliable: false,
                key: Some(k),
            });
            return Received::Action(RxAction::Consumed);
        }
        let frame: &'f [u8] = frame;
        let Ok(view) = FrameView::new_checked(frame) else {
            return Received::Action(RxAction::Drop(DropReason::Malformed));
        };
        // Parsed once, here: the transport takes the header as it is.
        Received::Action(
            match self.transport.handle_parsed_lending(now, h, view, lend) {
                Ok(Some(m)) => return Received::Message(m),
                Ok(None) => RxAction::Consumed,
                Err(RecvError::Wire(_)) => RxAction::Drop(DropReason::Malformed),
                Err(RecvError::FromSelf) => RxAction::Drop(DropReason::BadSource),
                Err(RecvError::Stale) => RxAction::Drop(DropReason::Stale),
                Err(_) => RxAction::Drop(DropReason::Transport),
            },
        )
    }

    /// The next frame to send, written into `buf` (which holds `mtu + 14` bytes), on one of
    /// the links in `room`.
    pub fn poll_transmit(
        &mut self,
        now: Time,
        room: DirSet,
        buf: &mut [u8],
    ) -> Option<(Dir, usize)> {
        self.poll_transmit_keeping(now, room, buf, None)
            .map(|(d, n, _)| (d, n))
    }

    /// As [`Node::poll_transmit`], for a driver that can keep `buf` (AF_XDP's UMEM): the
    /// third value says the transport kept the buffer for retransmission, to be held until
    /// [`Node::take_released`] names it. Frames are not kept while source routing is on (the
    /// route is written into the frame after the transport built it).
    pub fn poll_transmit_keeping(
        &mut self,
        now: Time,
        room: DirSet,
        buf: &mut [u8],
        keep: Option<transport::Keep<'_>>,
    ) -> Option<(Dir, usize, bool)> {
        self.last_now = self.last_now.max(now);
        self.declared = None;
        let room_links = LinkSet(room.bits());
        if self.source_used {
            if let Some(t) = self
                .source
                .poll_transmit(&self.view, &self.routes, room, buf)
            {
                return Some((t.0, t.1, false));
            }
        }
        if let Some((d, n)) = self.poll_key(room, buf) {
            return Some((d, n, false));
        }
        let paths = NodePaths {
            routes: &self.routes,
            source: self.source_used.then_some(&self.source),
        };
        let stamped = self.source_used && self.source.is_enabled();
        let keep = keep.map(|k| transport::Keep {
            handle: k.handle.filter(|_| !stamped),
            ..k
        });
        let t = self
            .transport
            .poll_transmit_keeping(now, room_links, &paths, buf, keep)?;
        let dir = Dir::from_index(t.link)?;
        let tail = self.transport.take_declared_tail();
        let len = if stamped {
            // Stamping moves the payload: the tail is written first.
            if let Some((at, v)) = tail {
                buf[at..t.len].fill(v);
            }
            self.source.stamp(buf, t.len, dir, t.service)
        } else {
            self.declared = tail;
            t.len
        };
        Some((dir, len, t.kept))
    }

    /// Whether [`Node::poll_transmit`] might have a frame (see
    /// [`Transport::may_transmit`](transport::Transport::may_transmit)): `false` means none,
    /// and the driver may skip the call.
    #[inline]
    pub fn may_transmit(&self) -> bool {
        self.source_used || !self.key_out.is_empty() || self.transport.may_transmit()
    }

    /// Where the frame the last `poll_transmit` call built stops being written, and the
    /// value its bytes from there to its end have
    /// ([`transport::Config::declare_tails`]; `None`: every byte written).
    pub fn take_declared_tail(&mut self) -> Option<(usize, u8)> {
        self.declared.take()
    }

    /// Moves the handles of the driver's buffers the transport no longer keeps into `out`
    /// ([`Node::poll_transmit_keeping`]).
    pub fn take_released(&mut self, out: &mut Vec<u32>) {
        self.transport.take_released(out);
    }

    fn poll_key(&mut self, room: DirSet, buf: &mut [u8]) -> Option<(Dir, usize)> {
        for _ in 0..self.key_out.len() {
            let m = self.key_out.pop_front()?;
            let Some((root, hops)) = self.routes.route_key(m.key) else {
                // No server takes keys in this view: the message cannot go anywhere.
                self.stats.key_no_root += 1;
                continue;
            };
            if root == self.local {
                self.stats.key_delivered += 1;
                self.events.push_back(Event::Message {
                    src: self.local,
                    service: m.service,
                    data: m.data,
                    reliable: false,
                    key: Some(m.key),
                });
                continue;
            }
            let Some(dir) = hops.iter().find(|d| room.contains(*d)) else {
                self.key_out.push_back(m);
                continue;
            };
            let len = HEADERS_LEN + m.data.len();
            if buf.len() < len {
                continue;
            }
            let mut h = Header::new(Kind::Data, self.local, Dest::Key(m.key));
            h.service = m.service;
            h.payload_len = m.data.len() as u16;
            if m.intercept {
                h.flags |= flags::INTERCEPT;
            }
            if h.emit(buf).is_err() {
                continue;
            }
            buf[HEADERS_LEN..len].copy_from_slice(&m.data);
            return Some((dir, len));
        }
        None
    }

    /// The next time `handle_timeout` must run.
    pub fn poll_timeout(&self) -> Option<Time> {
        let source = if self.source_used {
            self.source.poll_timeout()
        } else {
            None
        };
        match (self.transport.poll_timeout(), source) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the transport's timers and source routing's.
    pub fn handle_timeout(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
        self.transport.handle_timeout(now);
        if self.source_used {
            self.source.handle_timeout(now, &self.view);
        }
    }

    /// The next event for the application: the engine's own, then the transport's.
    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(e) = self.events.pop_front() {
            return Some(e);
        }
        self.transport.poll_event().map(Event::from)
    }

    /// The next event, as [`Node::poll_event`], with the transport's messages borrowed
    /// rather than copied into a buffer of their own: a consumer that copies what it keeps
    /// receives without an allocation per message.
    pub fn poll_event_ref(&mut self) -> Option<EventRef<'_>> {
        if let Some(e) = self.events.pop_front() {
            return Some(EventRef::Other(e));
        }
        Some(match self.transport.poll_event_ref()? {
            transport::EventRef::Message {
                src,
                service,
                data,
                reliable,
            } => EventRef::Message {
                src,
                service,
                data,
                reliable,
            },
            transport::EventRef::Other(e) => EventRef::Other(e.into()),
        })
    }

    /// Tells every server reachable in the current view that this engine (re)started, so
    /// that connections with an earlier incarnation of it are reset at once (see
    /// [`Transport::announce`]).
    pub fn announce(&mut self) {
        let routes = &self.routes;
        let peers: Vec<Coord> = self
            .dims
            .coords()
            .filter(|c| *c != self.local && routes.is_reachable(*c))
            .collect();
        self.transport.announce(peers);
    }

    /// Whether `service` gets [`Event::Acked`] reports.
    pub fn notify_acks(&mut self, service: u16, on: bool) {
        self.transport.notify_acks(service, on);
    }

    /// The services this server hosts: reliable messages for others are refused and their
    /// senders told (see [`crate::transport::notice`]). `None`: every service counts as
    /// hosted.
    pub fn set_hosted(&mut self, hosted: Option<std::sync::Arc<crate::transport::HostedServices>>) {
        self.transport.set_hosted(hosted);
    }

    /// Key-routed messages waiting to be put on a link (they die with the server if it
    /// fails now).
    pub fn queued_key_messages(&self) -> usize {
        self.key_out.len()
    }

    /// Whether anything waits to be sent (so the driver should not sleep).
    pub fn has_pending(&self) -> bool {
        !self.key_out.is_empty()
            || self.transport.queued_messages() > 0
            || (self.source_used && self.source.has_pending())
    }

    /// The root of `key` in this server's view.
    pub fn key_root(&self, key: u64) -> Option<Coord> {
        self.routes.key_root(key)
    }
}
