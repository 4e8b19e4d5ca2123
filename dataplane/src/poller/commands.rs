//! Commands from other threads (sends, views, requests for hosted services, ...), run by
//! the poller at the start of each turn.

use std::sync::mpsc::Sender;

use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::routing::LinkView;
use torusnet_proto::transport::{FailReason, SendError};

use super::services::{send_straight, Routed};
use super::Poller;
use crate::shared::Command;

/// Most commands run per turn, so that a flood of them does not starve the links.
const COMMANDS_PER_TURN: usize = 256;

/// What running a command left to do.
enum Ran {
    /// Done (or reported failed to its sender).
    Done,
    /// It could not be taken now and is held; take no more this turn.
    Held,
}

impl Poller {
    /// Runs the commands waiting for this poller, the held one first. How many ran.
    pub(super) fn take_commands(&mut self) -> usize {
        let mut n = 0;
        for _ in 0..COMMANDS_PER_TURN {
            let cmd = match self.pending.take() {
                Some(c) => c,
                None => match self.me().commands.pop() {
                    Some(c) => c,
                    None => break,
                },
            };
            match self.run_command(cmd) {
                Ran::Done => n += 1,
                Ran::Held => break,
            }
        }
        n
    }

    fn run_command(&mut self, cmd: Command) -> Ran {
        match cmd {
            Command::Send {
                target,
                service,
                data,
                opts,
            } => return self.send_command(target, service, data, opts),
            Command::SetFault { dir, fault } => {
                // Only the poller owning the link gets the command (`Shared::route`); the
                // management request is answered when it is queued, so a failure is logged.
                if let Err(e) = self.links.set_fault(dir, &fault) {
                    tracing::warn!(link = %dir, "fault injection: {e}");
                }
            }
            Command::Request { service, request } => {
                let now = self.now();
                if let Some(i) = self.services.owner(service) {
                    // A request the service does not understand is dropped; its sender's
                    // wait has a deadline.
                    let mut engine = Routed::new(&mut self.node, &self.shared, self.shard);
                    let _ = self.services.list[i].on_request(now, request, &mut engine);
                }
            }
            Command::NotifyAcks(service, on) => self.node.notify_acks(service, on),
            Command::SetWeight(service, weight) => self.node.set_service_weight(service, weight),
            Command::Intercept(service, on) => {
                if on {
                    self.node.intercept(service, Box::new(HoldForApp));
                } else {
                    self.node.stop_intercepting(service);
                }
            }
            Command::SetCongestion(on) => self.node.set_congestion(on),
            Command::Deliver(service, e) => {
                let _ = self.dispatch(service, e);
            }
            Command::Broadcast(e) => self.broadcast(e),
            Command::LinkCarrier(dir, up) => {
                self.node.set_link_up(dir, up);
                self.carrier_down = if up {
                    self.carrier_down.without(dir)
                } else {
                    self.carrier_down.with(dir)
                };
            }
            Command::SetRouting(on, services, reply) => {
                let ok = self.node.set_source_routing(on);
                if ok {
                    self.node.set_source_services(services);
                }
                if let Some(r) = reply {
                    let _ = r.send(ok);
                }
            }
            Command::SetView(view, macs, ack) => self.set_view(*view, &macs, ack),
        }
        Ran::Done
    }

    /// Sends a message for another thread (an embedded service, another poller).
    fn send_command(
        &mut self,
        target: Target,
        service: u16,
        data: Vec<u8>,
        opts: MsgOptions,
    ) -> Ran {
        let now = self.now();
        // A reliable message to a key goes to the key's root: the poller that owns the
        // connection with the root sends it, still to the key (its engine follows the root).
        if let (Target::Key(k), true) = (target, opts.reliable) {
            if let Some(root) = self.node.key_root(k) {
                let owner = self.shared.shard_of(root);
                if owner != self.shard {
                    let c = Command::Send {
                        target,
                        service,
                        data,
                        opts,
                    };
                    if let Err(c) = self.shared.shards[owner].commands.push(c) {
                        self.pending = Some(c);
                        return Ran::Held;
                    }
                    self.shared.shards[owner].wake();
                    return Ran::Done;
                }
            }
        }
        // A message handed over by another poller (its peer's connection is this one's)
        // goes straight into its frame when it can go at once; else it is queued, so that
        // commands behind it never wait for a closed window.
        let mut sent = Err(SendError::WouldBlock);
        if self.node.frames_straight(data.len(), opts.reliable) {
            let reserved = self.transit.wanted();
            let (node, links) = (&mut self.node, &mut self.links);
            sent = send_straight(node, links, reserved, now, target, service, &data, opts);
        }
        if sent == Err(SendError::WouldBlock) {
            sent = self.node.send(now, target, service, &data, opts);
        }
        match sent {
            Ok(()) => Ran::Done,
            Err(SendError::WouldBlock) => {
                // The engine's queue is full: hold it, take no more for now.
                self.pending = Some(Command::Send {
                    target,
                    service,
                    data,
                    opts,
                });
                Ran::Held
            }
            // The application's send already returned: it learns of the failure from its
            // inbox, like any other.
            Err(e) => {
                let peer = match target {
                    Target::Server(c) => c,
                    Target::Key(_) => self.shared.coord,
                };
                let from = opts.from.unwrap_or(service);
                let ev = Event::Failed {
                    peer,
                    service: from,
                    tags: vec![opts.tag],
                    reason: FailReason::of_send(e),
                };
                let _ = self.dispatch(from, ev);
                Ran::Done
            }
        }
    }

    /// Adopts a new view and the neighbours' MACs, then tells whoever waits for it.
    fn set_view(&mut self, view: LinkView, macs: &[Option<[u8; 6]>; 6], ack: Option<Sender<()>>) {
        if self.node.set_view(view).is_ok() {
            self.publisher.view_adopted();
        }
        self.links.set_neighbor_macs(macs);
        if let Some(a) = ack {
            let _ = a.send(());
        }
    }
}

/// The on-path hook of an application's service: every frame of it passing through is held
/// (the application, in its own process, decides later; the applications' host puts it back
/// on its way or drops it).
struct HoldForApp;

impl torusnet_proto::node::Interceptor for HoldForApp {
    fn on_path(
        &mut self,
        _h: &torusnet_proto::wire::Header,
        _payload: &mut [u8],
    ) -> torusnet_proto::node::Verdict {
        torusnet_proto::node::Verdict::Hold
    }
}
