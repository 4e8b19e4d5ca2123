//! The application side: connections, sending, failures and events.

use super::*;

impl Transport {
    /// Lets `service` take its whole reliable messages straight from their frames.
    pub fn set_placer(&mut self, service: u16, placer: Box<dyn Placer>) {
        self.placers.0.retain(|(s, _)| *s != service);
        self.placers.0.push((service, placer));
    }

    /// Sets a service's fair-queuing weight (frames per turn) and queue limit in bytes.
    pub fn configure_service(&mut self, service: u16, weight: u32, queue_bytes: usize) {
        self.queues.configure(service, weight, queue_bytes);
    }

    /// Sets a service's fair-queuing weight, its queue limit as it was: its share of every
    /// link its frames leave by, here and (with congestion control) at the forwarders.
    pub fn set_service_weight(&mut self, service: u16, weight: u32) {
        self.queues.set_weight(service, weight);
    }

    /// Turns the congestion controller on or off, for every connection at once (the
    /// switch that lets one run measure both).
    pub fn set_congestion(&mut self, on: bool) {
        self.cfg.congestion.on = on;
        let cc = self.cfg.congestion;
        for c in self.conns.values_mut() {
            c.set_congestion(cc);
        }
    }

    /// Whether `service` gets an [`TransportEvent::Acked`] as its reliable messages are acknowledged
    /// (failures are always reported).
    pub fn notify_acks(&mut self, service: u16, on: bool) {
        if on {
            self.notify.insert(service);
        } else {
            self.notify.remove(&service);
        }
    }

    /// The driver can take `frames` more frames now (receiver pacing, [`pacing`]): shared
    /// among the peers sending to this server and granted to them in every acknowledgement.
    /// A driver that never calls this grants nothing, and senders' own windows apply.
    pub fn set_rx_room(&mut self, now: Time, frames: u32) {
        self.pacing.set_room(frames);
        if self.pacing.count_due(now) {
            let n = self
                .conns
                .values()
                .filter(|c| RxPacing::is_active(c.pace.last_data, now))
                .count();
            self.pacing.set_active(now, n as u32);
        }
        if !self.starved.is_empty() && self.pacing.room_returned() {
            for peer in std::mem::take(&mut self.starved) {
                if let Some(c) = self.conns.get_mut(&peer) {
                    c.pace.starved = false;
                    c.pace.window_update = true;
                }
                self.mark_urgent(peer);
            }
        }
    }

    /// The connection id of the current instance with `peer`, and the peer's as known.
    pub fn connection_ids(&self, peer: Coord) -> Option<(u32, Option<u32>)> {
        self.conns
            .get(&peer)
            .map(|c| (c.life.cid(), c.life.peer_cid()))
    }

    /// Peers with a connection (for reports).
    pub fn peers(&self) -> usize {
        self.conns.len()
    }

    /// Opens the connection with `peer` ahead of any message (the handshake takes a round
    /// trip; sends made meanwhile wait for it).
    pub fn connect(&mut self, now: Time, peer: Coord) -> Result<(), SendError> {
        if peer == self.local {
            return Err(SendError::ToSelf);
        }
        if !self.conns.contains_key(&peer) {
            if self.conns.len() >= self.cfg.max_peers {
                return Err(SendError::TooManyPeers);
            }
            let c = self.new_conn(peer);
            self.conns.insert(peer, c);
        }
        if let Some(c) = self.conns.get_mut(&peer) {
            if !c.life.established() {
                c.life.want_sync(now);
                c.life.set_waiting(now, true, false);
                self.mark_urgent(peer);
                self.note(peer);
            }
        }
        Ok(())
    }

    /// Whether the connection with `peer` is established (its SYNC was answered).
    pub fn is_established(&self, peer: Coord) -> bool {
        self.conns.get(&peer).is_some_and(|c| c.life.established())
    }

    /// Ends the connection with `peer` (the peer became unreachable): every message not
    /// acknowledged is reported failed, its memory is released, and a later send starts a
    /// new instance.
    pub fn abort(&mut self, peer: Coord, reason: FailReason) {
        let mut failed: Vec<(u16, u64)> = Vec::new();
        if let Some(mut c) = self.conns.remove(&peer) {
            failed.extend(c.sent.drain());
            c.send.release(&mut self.pool);
            self.stats.broken += 1;
        }
        // Short messages to it wait in the queues without a connection.
        failed.extend(self.queues.remove_dest(peer));
        self.report_failed(peer, failed, reason);
    }

    /// The peer's instance changed: both streams start over, and what was not acknowledged
    /// (framed or still queued) is reported failed.
    pub(super) fn reset_conn(&mut self, peer: Coord, reason: FailReason) {
        let Some(c) = self.conns.get_mut(&peer) else {
            return;
        };
        let mut failed: Vec<(u16, u64)> = c.sent.drain().collect();
        c.reset_streams(&mut self.pool);
        c.queued = 0;
        failed.extend(self.queues.remove_dest(peer));
        self.stats.resets += 1;
        self.report_failed(peer, failed, reason);
        self.events.push(TransportEvent::PeerReset { peer, reason });
    }

    /// One [`TransportEvent::Failed`] per service, tags in send order.
    pub(super) fn report_failed(
        &mut self,
        peer: Coord,
        failed: Vec<(u16, u64)>,
        reason: FailReason,
    ) {
        let mut by_service: Vec<(u16, Vec<u64>)> = Vec::new();
        // A notice that did not arrive concerns nobody here: the peer it was for is gone.
        for (service, tag) in failed.into_iter().filter(|(s, _)| *s != NOTICES) {
            match by_service.iter_mut().find(|(s, _)| *s == service) {
                Some((_, tags)) => tags.push(tag),
                None => by_service.push((service, vec![tag])),
            }
        }
        for (service, tags) in by_service {
            self.stats.failed_messages += tags.len() as u64;
            self.events.push(TransportEvent::Failed {
                peer,
                service,
                tags,
                reason,
            });
        }
    }

    /// Marks `peer` as having something urgent (SYNC, retransmission, ACK, NACK) to send.
    pub(super) fn mark_urgent(&mut self, peer: Coord) {
        if let Some(c) = self.conns.get_mut(&peer) {
            c.enlist(&mut self.urgent);
        }
    }

    /// Queues a message. Refused (nothing taken) when the service's queue is full.
    #[inline(always)]
    pub fn send(&mut self, now: Time, m: Outgoing<'_>) -> Result<(), SendError> {
        self.send_hinted(now, m, None)
    }

    /// Where the state a send reads lives: see [`crate::node::Node::send_lines`].
    pub(crate) fn send_lines(&self) -> [*const u8; 4] {
        [
            std::ptr::from_ref(&self.cfg).cast(),
            std::ptr::from_ref(&self.queues).cast(),
            std::ptr::from_ref(&self.stats).cast(),
            self.queues.first_queue(),
        ]
    }

    /// [`Transport::send`], with `run` the value every byte of the message has if the
    /// caller looked (once for many sends of the same bytes, as the simulator does): a
    /// compacting queue then does not look again.
    // Always inline: the join is a few dozen instructions, and the compiler, left to
    // choose, stopped inlining it once a second caller appeared in a crate (a call per
    // message, 342 -> 381 instructions in `bench/transport-cost.sh`).
    #[inline(always)]
    pub(crate) fn send_hinted(
        &mut self,
        now: Time,
        m: Outgoing<'_>,
        run: Option<u8>,
    ) -> Result<(), SendError> {
        debug_assert!(run.is_none_or(|v| m.data.iter().all(|b| *b == v)));
        // A small message joining the group behind it needs none of the checks of a new
        // entry: the group's first message passed them for the same peer, and the group fits
        // a frame. Kept apart from them, so that it is a few dozen instructions inline.
        let unfenced = !(m.reliable && (m.fences.backward || m.fences.forward));
        if unfenced
            && self.queues.try_join(
                m.from,
                &Joining {
                    dest: m.dest,
                    service: m.service,
                    reliable: m.reliable,
                    tag: m.tag,
                    data: m.data,
                },
            )
        {
            return Ok(());
        }
        self.send_new_entry(now, m, run)
    }

    /// [`Transport::send_hinted`] for a message that opens a queue entry of its own.
    #[inline(never)]
    pub(super) fn send_new_entry(
        &mut self,
        now: Time,
        m: Outgoing<'_>,
        run: Option<u8>,
    ) -> Result<(), SendError> {
        if m.dest == self.local {
            return Err(SendError::ToSelf);
        }
        let max = if m.reliable {
            self.cfg.max_message
        } else {
            self.cfg.max_payload().saturating_sub(MSG_HEADER_LEN)
        };
        if m.data.len() > max || m.data.len() > u32::MAX as usize {
            return Err(SendError::TooLarge {
                len: m.data.len(),
                max,
            });
        }
        let q = Queued {
            tags: TagRun::one(m.tag),
            service: m.service,
            dest: m.dest,
            len: m.data.len() as u32,
            reliable: m.reliable,
            fences: if m.reliable {
                m.fences
            } else {
                Fences::default()
            },
            enqueued: now,
            run,
            groupable: false,
        };
        // The connection is looked up only for a message that opens a queue entry: one that
        // joins the group behind it (most small messages, aggregating) goes to the same
        // peer, whose connection that group's first message found or opened.
        let (conns, urgent, deadlines) = (&mut self.conns, &mut self.urgent, &mut self.deadlines);
        let (rng, cfg) = (&mut self.rng, &self.cfg);
        let admit = || -> Result<(), SendError> {
            // Short messages need no connection: nothing about them is acknowledged.
            if !m.reliable {
                return Ok(());
            }
            let peers = conns.len();
            let c = match conns.get_mut(&m.dest) {
                Some(c) => c,
                None => {
                    if peers >= cfg.max_peers {
                        return Err(SendError::TooManyPeers);
                    }
                    conns
                        .entry(m.dest)
                        .or_insert_with(|| make_conn(rng, cfg, m.dest))
                }
            };
            c.queued += 1;
            if !c.life.established() {
                // Nothing goes before the handshake: ask for it, and start the deadline.
                c.life.want_sync(now);
                c.life.set_waiting(now, true, false);
                c.enlist(urgent);
                schedule(deadlines, c);
            }
            Ok(())
        };
        match self.queues.push_admitting(m.from, q, m.data, admit) {
            Ok(()) => Ok(()),
            Err(Refused::Full) => Err(SendError::WouldBlock),
            Err(Refused::Admit(e)) => Err(e),
        }
    }

    pub(super) fn new_conn(&mut self, peer: Coord) -> Box<Connection> {
        make_conn(&mut self.rng, &self.cfg, peer)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<TransportEvent> {
        self.events.pop()
    }

    /// Whether the next event concerns service `service` (its message, acknowledgement or
    /// failure), without taking it.
    pub fn next_event_is(&self, service: u16) -> bool {
        self.events.next_service() == Some(service)
    }

    /// The next event, a message's bytes borrowed from the transport (no allocation): for
    /// consumers that copy what they keep.
    #[inline]
    pub fn poll_event_ref(&mut self) -> Option<EventRef<'_>> {
        self.events.pop_ref()
    }
}

/// A fresh connection with `peer`, its instance id drawn from `rng`.
pub(super) fn make_conn(rng: &mut SplitMix64, cfg: &Config, peer: Coord) -> Box<Connection> {
    let cid = loop {
        let v = rng.next_u64() as u32;
        if v != 0 {
            break v;
        }
    };
    let conn_cfg = ConnConfig {
        send: SendConfig {
            window: cfg.window,
            min_rto: cfg.min_rto,
            max_rto: cfg.max_rto,
            initial_rto: cfg.initial_rto,
        },
        recv: RecvConfig {
            window: cfg.window,
            // At most a quarter window between ACKs, so the sender never stalls on a
            // full window waiting for the delayed-ACK timer.
            ack_every: cfg.ack_every.min((cfg.window / 4).max(1)),
            ack_delay: cfg.ack_delay,
            nack_threshold: cfg.nack_threshold,
            nack_retry: cfg.nack_retry,
            nack_retry_min: cfg.nack_retry_min,
        },
        life: LifecycleConfig {
            broken_after: cfg.broken_after,
            sync_retry: cfg.sync_retry,
        },
        max_message: cfg.max_message,
        congestion: cfg.congestion,
    };
    Box::new(Connection::new(peer, cid, conn_cfg))
}
