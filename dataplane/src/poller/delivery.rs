//! Handing events to the inboxes of embedded services and attached applications: events
//! for a full inbox wait here (and its service is marked full, so transports refuse its
//! reliable messages until it catches up), and commands for the first poller that found its
//! queue full wait here too, retried in order every turn.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use torusnet_proto::node::Event;

use crate::shared::{Command, ServiceInbox, Shared};

/// Most events (and commands for the first poller) that wait here before the next ones
/// are dropped, counted.
const WAITING_MAX: usize = 1 << 20;

/// The delivery part of one poller.
#[derive(Debug)]
pub(crate) struct Delivery {
    inboxes: HashMap<u16, Arc<ServiceInbox>>,
    inbox_version: u64,
    /// Events for services whose inbox was full.
    overflow: VecDeque<(u16, Event)>,
    /// Events dropped: nobody to take them, or too many waiting.
    pub(crate) overflow_drops: u64,
    /// Commands for the first poller (events for the services and applications it hosts)
    /// that found its queue full: retried in order every turn rather than dropped.
    to_first: VecDeque<Command>,
    /// Embedded services whose inbox this poller found full, with how many of their events
    /// wait in `overflow`: marked full in the hosted set, so transports refuse their
    /// reliable messages (senders told) until they catch up.
    full_inboxes: Vec<(u16, usize)>,
    /// Messages for a service nobody on this server hosts or attached as.
    pub(crate) no_service: u64,
    /// The buffer a message for a hosted service is copied into (services read events by
    /// reference, so it comes back and is reused: no allocation per message).
    pub(crate) msg_buf: Vec<u8>,
}

impl Default for Delivery {
    fn default() -> Delivery {
        Delivery {
            inboxes: HashMap::new(),
            inbox_version: u64::MAX,
            overflow: VecDeque::new(),
            overflow_drops: 0,
            to_first: VecDeque::new(),
            full_inboxes: Vec::new(),
            no_service: 0,
            msg_buf: Vec::new(),
        }
    }
}

impl Delivery {
    /// Whether a message the engine lends may go to its consumer at once: nothing waits
    /// here to be handed on before it (events held for a full inbox, commands for the first
    /// poller), so lending keeps every service's order.
    pub(crate) fn may_lend(&self) -> bool {
        self.overflow.is_empty() && self.to_first.is_empty()
    }

    /// Whether no command waits here for the first poller's queue.
    pub(crate) fn nothing_for_first(&self) -> bool {
        self.to_first.is_empty()
    }

    /// Whether an embedded service or application has inbox `id` here.
    pub(crate) fn has_inbox(&self, id: u16) -> bool {
        self.inboxes.contains_key(&id)
    }

    /// The ids of every inbox.
    pub(crate) fn inbox_ids(&self) -> Vec<u16> {
        self.inboxes.keys().copied().collect()
    }

    /// Takes a fresh copy of the inboxes when they changed.
    pub(crate) fn refresh_inboxes(&mut self, shared: &Shared) {
        let v = shared.services_version.load(Ordering::Acquire);
        if v != self.inbox_version {
            self.inboxes = shared.services.lock().clone();
            self.inbox_version = v;
        }
    }

    /// Pushes again what waits (commands for the first poller, then events for full
    /// inboxes), and lifts the full mark of services that caught up. How many commands
    /// went.
    pub(crate) fn retry_waiting(&mut self, shared: &Shared) -> usize {
        let mut n = 0;
        if !self.to_first.is_empty() {
            n += self.retry_to_first(shared);
        }
        // Every waiting event is pushed again: those that find no room count anew.
        for f in &mut self.full_inboxes {
            f.1 = 0;
        }
        for _ in 0..self.overflow.len() {
            let Some((s, e)) = self.overflow.pop_front() else {
                break;
            };
            self.push_event(shared, s, e);
        }
        if !self.full_inboxes.is_empty() {
            self.unmark_caught_up(shared);
        }
        n
    }

    /// Hands a command to the first poller, behind any that wait for room in its queue.
    pub(crate) fn send_to_first(&mut self, shared: &Shared, c: Command) {
        if self.to_first.is_empty() {
            match shared.shards[0].commands.push(c) {
                Ok(()) => shared.shards[0].wake(),
                Err(c) => self.to_first.push_back(c),
            }
        } else if self.to_first.len() < WAITING_MAX {
            self.to_first.push_back(c);
        } else {
            self.overflow_drops += 1;
        }
    }

    /// Retries the commands waiting for room in the first poller's queue, in order.
    fn retry_to_first(&mut self, shared: &Shared) -> usize {
        let mut n = 0;
        while let Some(c) = self.to_first.pop_front() {
            if let Err(c) = shared.shards[0].commands.push(c) {
                self.to_first.push_front(c);
                break;
            }
            n += 1;
        }
        if n > 0 {
            shared.shards[0].wake();
        }
        n
    }

    /// Pushes event `e` into service `service`'s inbox, or keeps it while the inbox is full.
    pub(crate) fn push_event(&mut self, shared: &Shared, service: u16, e: Event) {
        let Some(inbox) = self.inboxes.get(&service) else {
            // No such service here: nobody to deliver to. Counted apart from overflow, so an
            // application that sends to a name not (or no longer) attached can be told why.
            if matches!(e, Event::Message { .. }) {
                self.no_service += 1;
            } else {
                self.overflow_drops += 1;
            }
            return;
        };
        match inbox.queue.push(e) {
            Ok(()) => inbox.notify(),
            Err(e) => {
                // The service has fallen behind: what it has not been sent yet is refused
                // from now on (its senders told); what was accepted waits here.
                let k = match self.full_inboxes.iter().position(|f| f.0 == service) {
                    Some(k) => k,
                    None => {
                        self.full_inboxes.push((service, 0));
                        shared.hosted.set_full(service, true);
                        self.full_inboxes.len() - 1
                    }
                };
                if self.overflow.len() < WAITING_MAX {
                    self.full_inboxes[k].1 += 1;
                    self.overflow.push_back((service, e));
                } else {
                    self.overflow_drops += 1;
                }
            }
        }
    }

    /// Lifts the full mark of the embedded services that have read half their inbox and have
    /// nothing left waiting here.
    #[cold]
    fn unmark_caught_up(&mut self, shared: &Shared) {
        let (inboxes, hosted) = (&self.inboxes, &shared.hosted);
        self.full_inboxes.retain(|&(s, waiting)| {
            let behind = waiting > 0
                || inboxes
                    .get(&s)
                    .is_some_and(|i| i.queue.len() > i.queue.capacity() / 2);
            if !behind {
                hosted.set_full(s, false);
            }
            behind
        });
    }
}
