//! The services a poller hosts (the built-in ones, the applications' host, the key-value
//! store, ... all in the first poller), and the engine as they see it ([`Routed`]): sends
//! to peers whose connections another poller owns become commands for that poller, and a
//! message that fits a frame may go straight into one on this poller's links.

use std::collections::HashMap;

use torusnet_proto::node::{Event, MsgOptions, Node, Target};
use torusnet_proto::service::{Engine, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims, DirSet};
use torusnet_proto::transport::{Lent, SendError};

use crate::shared::{Command, Shared};
use crate::transmit::Links;

/// The services hosted in one poller, and which owns each service id.
#[derive(Default)]
pub(crate) struct Services {
    pub(crate) list: Vec<Box<dyn Service>>,
    service_of: HashMap<u16, usize>,
}

impl Services {
    /// Hosts `list`; their ids are marked hosted in `shared` (transports take reliable
    /// messages for them).
    pub(crate) fn new(list: Vec<Box<dyn Service>>, shared: &Shared) -> Services {
        let mut service_of = HashMap::new();
        for (i, svc) in list.iter().enumerate() {
            for id in svc.ids() {
                service_of.insert(*id, i);
                shared.hosted.host(*id);
            }
        }
        Services { list, service_of }
    }

    /// The hosted service that owns service id `id`, if any.
    pub(crate) fn owner(&self, id: u16) -> Option<usize> {
        self.service_of
            .get(&id)
            .copied()
            .or_else(|| self.list.iter().position(|s| s.owns(id)))
    }

    /// Offers lent message `m` to the hosted service that owns its id, to read where it
    /// lies (`Service::on_message_ref`); when no hosted service takes it so, copies it
    /// ([`owned_message`]: its one copy on the way in, straight from the frame into the
    /// buffer its consumer reads) and returns that as the event to hand on, with its
    /// service. `m` borrows the poller's UMEM or scratch buffer while the services and the
    /// engine are used.
    pub(crate) fn take_lent(
        &mut self,
        engine: &mut Routed<'_>,
        now: Time,
        m: &Lent<'_>,
        buf: &mut Vec<u8>,
    ) -> Option<(u16, Event)> {
        let owner = self.owner(m.service);
        if let Some(i) = owner {
            if self.list[i].on_message_ref(now, m, engine) {
                return None;
            }
        }
        let e = owned_message(buf, owner.is_some(), m.src, m.service, m.data, m.reliable);
        Some((m.service, e))
    }
}

/// A received message as the owned event the poller hands on: copied into `buf` when a
/// hosted service will read it (it comes back after, and the buffer is reused), else into
/// a buffer of its own (an application's inbox keeps it).
pub(crate) fn owned_message(
    buf: &mut Vec<u8>,
    hosted: bool,
    src: Coord,
    service: u16,
    data: &[u8],
    reliable: bool,
) -> Event {
    let data = if hosted {
        let mut b = std::mem::take(buf);
        b.clear();
        b.extend_from_slice(data);
        b
    } else {
        data.to_vec()
    };
    Event::Message {
        src,
        service,
        data,
        reliable,
        key: None,
    }
}

/// The engine as a hosted service sees it: sends to peers whose connections another poller
/// owns become commands for that poller (hosted services live with the first poller; every
/// connection must stay with its owner).
pub(crate) struct Routed<'a> {
    node: &'a mut Node,
    shared: &'a Shared,
    shard: usize,
    /// The poller's links, for messages sent straight into their frames
    /// ([`Engine::send_framing`]; `None`: they are queued), with the links frames in
    /// transit wait for.
    tx: Option<(&'a mut Links, DirSet)>,
}

impl<'a> Routed<'a> {
    /// The engine of poller `shard`, whose services' messages are queued.
    pub(crate) fn new(node: &'a mut Node, shared: &'a Shared, shard: usize) -> Routed<'a> {
        Routed {
            node,
            shared,
            shard,
            tx: None,
        }
    }

    /// The engine of poller `shard`, whose services may send straight into frames on
    /// `links` (but not on the `reserved` ones).
    pub(crate) fn sending(
        node: &'a mut Node,
        shared: &'a Shared,
        shard: usize,
        links: &'a mut Links,
        reserved: DirSet,
    ) -> Routed<'a> {
        Routed {
            node,
            shared,
            shard,
            tx: Some((links, reserved)),
        }
    }

    /// Sends through the engine of poller `owner` (the one [`Routed::owner`] names): this
    /// one's directly, another's as a command.
    fn send_via(
        &mut self,
        owner: usize,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        if owner == self.shard {
            return self.node.send(now, target, service, data, opts);
        }
        let c = Command::Send {
            target,
            service,
            data: data.to_vec(),
            opts,
        };
        self.shared
            .push_to(owner, c)
            .map_err(|_| SendError::WouldBlock)
    }

    /// The poller whose engine holds the connection a message to `target` travels on.
    fn owner(&self, target: Target, reliable: bool) -> usize {
        match target {
            Target::Server(c) => self.shared.shard_of(c),
            Target::Key(k) if reliable => self
                .node
                .key_root(k)
                .map_or(self.shard, |r| self.shared.shard_of(r)),
            Target::Key(_) => self.shard,
        }
    }
}

impl Routed<'_> {
    /// Puts a held frame back on its way from this poller's engine: on a link of the poller
    /// that has it (its hand-off queue, which this poller also reads each turn).
    fn resume(&mut self, now: Time, mut frame: Vec<u8>) -> bool {
        let hops = match self.node.resume_on_path(now, &mut frame) {
            torusnet_proto::node::RxAction::Forward(h) => h,
            // Delivered here (the key's root moved here meanwhile), or dropped: counted.
            _ => return true,
        };
        for d in hops.iter() {
            if let Some(owner) = self.shared.link_shard[usize::from(d.index())] {
                let mut counts = crate::shared::HandoffCounts::default();
                let ok = self.shared.shards[owner]
                    .hand_off(crate::shared::Handoff::Send(d, frame), &mut counts);
                self.shared.shards[owner].wake();
                return ok;
            }
        }
        false
    }
}

impl Engine for Routed<'_> {
    fn resume_on_path(&mut self, now: Time, frame: Vec<u8>) -> bool {
        self.resume(now, frame)
    }

    fn local(&self) -> Coord {
        self.node.local()
    }
    fn dims(&self) -> Dims {
        self.node.dims()
    }
    fn incarnation(&self) -> u64 {
        Engine::incarnation(&*self.node)
    }
    fn is_reachable(&self, c: Coord) -> bool {
        self.node.routes().is_reachable(c)
    }
    fn takes_keys(&self, c: Coord) -> bool {
        self.node.routes().takes_keys(c)
    }
    fn distance(&self, c: Coord) -> Option<u32> {
        self.node.routes().distance(c)
    }
    fn key_root(&self, key: u64) -> Option<Coord> {
        self.node.key_root(key)
    }
    #[inline]
    fn send(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        let owner = self.owner(target, opts.reliable);
        self.send_via(owner, now, target, service, data, opts)
    }
    fn send_framing(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        // Most small messages (a stream's, with frames in flight) are queued: they are sent
        // without working out the links' room or taking a buffer.
        let straight = self.node.frames_straight(data.len(), opts.reliable);
        let owner = self.owner(target, opts.reliable);
        let (node, tx) = (&mut *self.node, self.tx.as_mut());
        match tx {
            Some((links, reserved)) if straight && owner == self.shard => {
                send_straight(node, links, *reserved, now, target, service, data, opts)
            }
            // Another poller's peer: it frames the message when it takes it over.
            _ => self.send_via(owner, now, target, service, data, opts),
        }
    }
    fn notify_acks(&mut self, service: u16, on: bool) {
        // Reports come from every poller's engine. Nothing waits for an answer here (the
        // service asked from inside a poller): a full queue is counted.
        if self.shared.push(Command::NotifyAcks(service, on)).is_err() {
            self.shared.count_dropped_command();
        }
    }
}

/// [`Node::send_framing`] with a buffer from `links` (not on the `reserved` ones): a
/// message that goes straight is written into a frame on one of the links, other messages
/// are taken as `send` takes them; `Err(WouldBlock)` also when it would go straight but
/// cannot go at once.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_straight(
    node: &mut Node,
    links: &mut Links,
    reserved: DirSet,
    now: Time,
    target: Target,
    service: u16,
    data: &[u8],
    opts: MsgOptions,
) -> Result<(), SendError> {
    let room = links.room(reserved);
    if !links.ready(room) {
        // No buffer or link now: the engine still takes what it would queue.
        return node
            .send_framing(now, target, service, data, opts, room, &mut [], None)
            .map(|_| ());
    }
    let mut taken = Ok(());
    links.send_one(room, |room, buf, keep| {
        match node.send_framing(now, target, service, data, opts, room, buf, keep) {
            Ok(frame) => frame,
            Err(e) => {
                taken = Err(e);
                None
            }
        }
    });
    taken
}
