//! One torus server's protocol engine, sans-IO: routing view, multi-hop forwarding, key
//! routing, the reliable transport and delivery to services. The AF_XDP dataplane, the
//! tests and the simulator all drive this same code; they only move bytes.
//!
//! Link ids are the link directions (0:+x .. 5:-z): `LinkSet::from(dirs)` is a `DirSet` as links.
//!
//! This file holds the [`Node`] type, its construction, settings and events; `send.rs`,
//! `rx.rs` and `tx.rs` the three ways bytes move, `intercept.rs` on-path services,
//! `types.rs` the vocabulary shared with drivers, and `sim_hooks.rs` what only the
//! simulator asks of an engine.

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

mod intercept;
mod keyed;
mod paths;
mod rx;
mod send;
mod sim_hooks;
mod tx;
mod types;

pub use intercept::{Interceptor, Verdict};
pub use keyed::{KeyedHandoff, KeyedStats, KEYED_DEADLINE};
use paths::NodePaths;
pub use types::{
    DropReason, Event, EventRef, MsgOptions, NodeStats, Outbound, Received, RxAction, Target,
};

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
    /// Frames on-path hooks hold, for the driver ([`Node::take_held`]).
    held: Vec<Vec<u8>>,
    /// A held frame is being put back on its way: no hook sees it again here.
    resuming: bool,
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
    /// Reliable messages to keys, until they end ([`keyed`]).
    keyed: keyed::KeyedSends,
    /// The hosted set the driver gave, for the key messages' check on arrival.
    hosted: Option<std::sync::Arc<transport::HostedServices>>,
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
        let mut node = Node {
            local,
            dims: view.dims(),
            routes,
            view,
            transport: Transport::new(local, cfg),
            key_out: VecDeque::new(),
            events: VecDeque::new(),
            interceptors: Vec::new(),
            held: Vec::new(),
            resuming: false,
            stats: NodeStats::default(),
            mtu: cfg.mtu,
            source: SourceRouter::new(local),
            last_now: Time::ZERO,
            declared: None,
            source_used: false,
            transport_cfg: cfg,
            keyed: keyed::KeyedSends::default(),
            hosted: None,
        };
        node.install_key_gate();
        Ok(node)
    }

    /// Gives the transport the check key messages meet on arrival, for the current view
    /// and hosted set.
    fn install_key_gate(&mut self) {
        self.transport.set_key_gate(Some(Box::new(keyed::RootGate {
            local: self.local,
            routes: std::sync::Arc::new(self.routes.clone()),
            hosted: self.hosted.clone(),
        })));
    }

    /// What of this engine its key messages need, beside them.
    fn keyed_parts(&mut self) -> (&mut keyed::KeyedSends, keyed::Parts<'_>) {
        (
            &mut self.keyed,
            keyed::Parts {
                local: self.local,
                routes: &self.routes,
                transport: &mut self.transport,
                events: &mut self.events,
            },
        )
    }

    /// Counters of reliable messages to keys.
    pub fn keyed_stats(&self) -> KeyedStats {
        self.keyed.stats
    }

    /// Reliable messages to keys not yet delivered, acknowledged or reported failed.
    pub fn pending_key_messages(&self) -> usize {
        self.keyed.pending()
    }

    /// When this engine is one of several of a server, each owning the connections of some
    /// peers: `owns` says which are this one's. A reliable message to a key whose root is
    /// another engine's is then handed off ([`Node::take_keyed_handoffs`]).
    pub fn set_key_owner(&mut self, owns: Option<Box<dyn Fn(Coord) -> bool + Send>>) {
        self.keyed.owner = owns.map(keyed::Owner);
    }

    /// Reliable messages to keys for another engine of this server to send
    /// ([`Node::set_key_owner`]).
    pub fn take_keyed_handoffs(&mut self) -> Vec<KeyedHandoff> {
        std::mem::take(&mut self.keyed.handoffs)
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
        let before: Vec<(bool, bool)> = self
            .dims
            .coords()
            .map(|c| (self.routes.is_reachable(c), self.routes.takes_keys(c)))
            .collect();
        self.routes.absorb(&view);
        self.view = view;
        self.install_key_gate();
        self.source.on_view(self.last_now, &self.view);
        let mut roots_moved = false;
        for (i, (was, took)) in before.into_iter().enumerate() {
            let c = self.dims.coord(i);
            let now = self.routes.is_reachable(c);
            if was && now && took != self.routes.takes_keys(c) {
                roots_moved = true;
            }
            if was && !now {
                self.events.push_back(Event::Unreachable(c));
                // The control plane declared it gone: what was not acknowledged is reported
                // failed now rather than after the silent-peer deadline.
                self.transport.abort(c, FailReason::Unreachable);
            } else if !was && now {
                self.events.push_back(Event::Reachable(c));
            }
        }
        if roots_moved {
            self.events.push_back(Event::RootsMoved);
        }
        // Key messages waiting for a root look again.
        let now = self.last_now;
        let (k, mut p) = self.keyed_parts();
        k.on_view(&mut p, now);
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

    /// Sets a service's fair-queuing weight, its queue limit as it was.
    pub fn set_service_weight(&mut self, service: u16, weight: u32) {
        self.transport.set_service_weight(service, weight);
    }

    /// The next time `handle_timeout` must run.
    pub fn poll_timeout(&self) -> Option<Time> {
        let source = if self.source_used {
            self.source.poll_timeout()
        } else {
            None
        };
        [
            self.transport.poll_timeout(),
            source,
            self.keyed.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs the transport's timers and source routing's.
    pub fn handle_timeout(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
        self.transport.handle_timeout(now);
        if self.source_used {
            self.source.handle_timeout(now, &self.view);
        }
        let (k, mut p) = self.keyed_parts();
        k.on_timeout(&mut p, now);
    }

    /// The next event for the application: the engine's own, then the transport's.
    pub fn poll_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            let e = Event::from(self.transport.poll_event()?);
            if let Some(e) = self.keyed_event(e) {
                return Some(e);
            }
        }
    }

    /// What the transport's event `e` becomes: a key message's own (its arrival, its
    /// acknowledgement or failure at a server) is this engine's to turn into its sender's
    /// or its service's; `None` when nothing is left for the driver now.
    fn keyed_event(&mut self, e: Event) -> Option<Event> {
        let now = self.last_now;
        match e {
            Event::Message {
                src,
                service: transport::KEYED,
                data,
                reliable,
                ..
            } => {
                let (k, mut p) = self.keyed_parts();
                k.arrived(&mut p, now, src, &data, reliable)
            }
            // Key messages end on their roots' receipts, not on the transport's
            // acknowledgement (which a refusal can follow).
            Event::Acked {
                service: transport::KEYED,
                ..
            } => None,
            Event::Failed {
                peer,
                service: transport::KEYED,
                tags,
                reason,
            } => {
                let (k, mut p) = self.keyed_parts();
                k.on_failed(&mut p, now, peer, &tags, reason);
                None
            }
            e => Some(e),
        }
    }

    /// The next event, as [`Node::poll_event`], with the transport's messages borrowed
    /// rather than copied into a buffer of their own: a consumer that copies what it keeps
    /// receives without an allocation per message.
    pub fn poll_event_ref(&mut self) -> Option<EventRef<'_>> {
        // Key messages' events first, owned (they are few, and this engine's to turn into
        // what the driver sees); then the next event, lent.
        loop {
            if let Some(e) = self.events.pop_front() {
                return Some(EventRef::Other(e));
            }
            if !self.transport.next_event_is(transport::KEYED) {
                break;
            }
            let e = Event::from(self.transport.poll_event()?);
            if let Some(e) = self.keyed_event(e) {
                return Some(EventRef::Other(e));
            }
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

    /// Turns the congestion controller on or off for every connection.
    pub fn set_congestion(&mut self, on: bool) {
        self.transport.set_congestion(on);
    }

    /// Whether `service` gets [`Event::Acked`] reports.
    pub fn notify_acks(&mut self, service: u16, on: bool) {
        self.transport.notify_acks(service, on);
        self.keyed.notify_acks(service, on);
    }

    /// The services this server hosts: reliable messages for others are refused and their
    /// senders told (see [`crate::transport::notice`]). `None`: every service counts as
    /// hosted.
    pub fn set_hosted(&mut self, hosted: Option<std::sync::Arc<crate::transport::HostedServices>>) {
        if let Some(h) = &hosted {
            // Key messages are this engine's: always taken, then checked by its gate.
            h.host(transport::KEYED);
        }
        self.hosted = hosted.clone();
        self.transport.set_hosted(hosted);
        self.install_key_gate();
    }

    /// Key-routed messages waiting to be put on a link (they die with the server if it
    /// fails now).
    pub fn queued_key_messages(&self) -> usize {
        self.key_out.len()
    }

    /// Whether anything waits to be sent (so the driver should not sleep).
    pub fn has_pending(&self) -> bool {
        !self.key_out.is_empty()
            || !self.keyed.handoffs.is_empty()
            || self.transport.queued_messages() > 0
            || (self.source_used && self.source.has_pending())
    }

    /// The root of `key` in this server's view.
    pub fn key_root(&self, key: u64) -> Option<Coord> {
        self.routes.key_root(key)
    }
}
