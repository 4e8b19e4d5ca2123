//! Services hosted beside the engine: sans-IO state machines that own some service ids, see
//! the events for them, and send through the engine. torusd hosts them in its pollers, tests
//! drive them over in-memory engines, and the simulator can host the same code at scale.
//!
//! The host's contract, per turn of its loop: hand every engine event to the service that
//! owns its id ([`Service::on_event`]; broadcast events such as a server becoming
//! unreachable go to every service), then [`Service::poll`] each service, then let the engine
//! transmit. Events are handed over before anything is transmitted, so a service has seen a
//! message before the acknowledgement of its frame can leave this server.

use std::any::Any;

use crate::keyspace;
use crate::node::{Event, MsgOptions, Node, Target};
use crate::time::Time;
use crate::topology::{Coord, Dims};
use crate::transport::{Lent, SendError};

/// What a service may ask of the engine that hosts it: where it is, who is reachable, and to
/// send. The node implements it directly; a host with several engines (torusd's pollers,
/// which own disjoint peers) hands services one that routes each send to its owner.
pub trait Engine {
    /// This server.
    fn local(&self) -> Coord;
    /// The torus.
    fn dims(&self) -> Dims;
    /// This start of the dataplane.
    fn incarnation(&self) -> u64;
    /// Whether `c` is reachable in the current view.
    fn is_reachable(&self, c: Coord) -> bool;
    /// Hops to `c` in the current view (`None`: unreachable).
    fn distance(&self, c: Coord) -> Option<u32>;
    /// Whether `c` may hold keys in the current view: reachable and not still joining.
    fn takes_keys(&self, c: Coord) -> bool {
        self.is_reachable(c)
    }
    /// The root of a routing key in the current view.
    fn key_root(&self, key: u64) -> Option<Coord> {
        keyspace::root(self.dims(), key, |c| self.takes_keys(c))
    }
    /// `GetServersForKey(key, r)` in the current view.
    fn servers_for_key(&self, key: u64, r: usize) -> Vec<Coord> {
        keyspace::get_servers_for_key(self.dims(), key, r, |c| self.takes_keys(c))
    }
    /// Sends a message to `service` at `target` (see [`Node::send`]).
    fn send(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError>;
    /// As [`Engine::send`], for a sender that keeps up with its links: a reliable message
    /// too large to share a frame is written straight into the frame that carries it (one
    /// copy where `send` makes two: into a queue, then into the frame) when nothing else
    /// waits to be sent, and refused with [`SendError::WouldBlock`] when it cannot go at once
    /// (window closed, links full): nothing was taken, try again on a later poll. Other
    /// messages are taken as `send` takes them. Engines that frame nothing themselves queue
    /// (the default).
    fn send_framing(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        self.send(now, target, service, data, opts)
    }
    /// Whether `service` gets acknowledgement reports.
    fn notify_acks(&mut self, service: u16, on: bool);
    /// Puts a frame an on-path hook held back on its way ([`Node::resume_on_path`]): whether
    /// it went (false: no link takes it, or this engine's driver cannot put frames back;
    /// the caller counts it dropped).
    fn resume_on_path(&mut self, _now: Time, _frame: Vec<u8>) -> bool {
        false
    }
}

impl Engine for Node {
    fn local(&self) -> Coord {
        Node::local(self)
    }
    fn dims(&self) -> Dims {
        Node::dims(self)
    }
    fn incarnation(&self) -> u64 {
        self.transport().config().incarnation
    }
    fn is_reachable(&self, c: Coord) -> bool {
        self.routes().is_reachable(c)
    }
    fn takes_keys(&self, c: Coord) -> bool {
        self.routes().takes_keys(c)
    }
    fn distance(&self, c: Coord) -> Option<u32> {
        self.routes().distance(c)
    }
    fn key_root(&self, key: u64) -> Option<Coord> {
        Node::key_root(self, key)
    }
    fn send(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        Node::send(self, now, target, service, data, opts)
    }
    fn notify_acks(&mut self, service: u16, on: bool) {
        Node::notify_acks(self, service, on)
    }
}

/// A request for a service from outside the engine (a management command), typed by the
/// service that understands it.
pub type Request = Box<dyn Any + Send>;

/// A service hosted beside an engine.
pub trait Service: Send {
    /// A short name, for status and logs.
    fn name(&self) -> &'static str;

    /// The service ids it owns: messages, acknowledgements and failures for these come to it.
    fn ids(&self) -> &[u16];

    /// An event for one of its ids, or a broadcast one (`Unreachable`, `Reachable`,
    /// `PeerReset`).
    fn on_event(&mut self, now: Time, event: &Event, node: &mut dyn Engine);

    /// A message for one of its ids, read where it arrived (the frame the engine lent it
    /// from, `Node::handle_rx_lending`), as the event `on_event` would have had: `true`
    /// when the service took it so. By default `false`, and the host copies the message
    /// into an [`Event::Message`] for `on_event`; a service that reads a message without
    /// keeping it, or copies only what it keeps, takes it here and saves that copy.
    fn on_message_ref(&mut self, _now: Time, _m: &Lent<'_>, _node: &mut dyn Engine) -> bool {
        false
    }

    /// A request from outside; handed back when the service does not understand it (the
    /// default: a service that takes no requests).
    fn on_request(
        &mut self,
        _now: Time,
        request: Request,
        _node: &mut dyn Engine,
    ) -> Result<(), Request> {
        Err(request)
    }

    /// Sends what is due now; returns how much work it did (0: idle).
    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize;

    /// The latest time `poll` must run again (a deadline, a pacing timer); `None`: only when
    /// an event comes.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    /// Whether it owns service id `id` (for services whose ids change while they run, such
    /// as the host of attached applications); by default, the ids of [`Service::ids`].
    fn owns(&self, id: u16) -> bool {
        self.ids().contains(&id)
    }

    /// The host is about to sleep until something wakes it: arm whatever wakes it for this
    /// service, and say whether sleeping is still right (false: work arrived meanwhile).
    fn may_sleep(&mut self) -> bool {
        true
    }

    /// The host woke up (undo what `may_sleep` armed).
    fn woke(&mut self) {}

    /// File descriptors whose readability should wake a sleeping host for this service (a
    /// device it reads, such as a TUN interface); none by default.
    fn wake_fds(&self) -> Vec<i32> {
        Vec::new()
    }
}
