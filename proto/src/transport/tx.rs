//! Network out: the next frame for a link with room (urgent frames first, then data in
//! fair-queuing order).

use super::*;

impl Transport {
    /// Writes the next frame to send into `buf` (which must hold `mtu + 14` bytes), on one
    /// of the links in `room` (those with space in their TX ring). Retransmissions, NACKs
    /// and due ACKs go first, then data in fair-queuing order.
    ///
    /// `keep` is for a driver that can keep the buffer (`None`: every frame is copied out as
    /// usual): a new reliable frame built in `buf` is kept there (`Transmit::kept`) instead
    /// of copied, when `keep` offers a handle; retransmissions of kept frames are read back
    /// through `keep`. A driver that passes `keep` once must pass it on every call while it
    /// has kept frames.
    pub fn poll_transmit(
        &mut self,
        now: Time,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Option<Transmit> {
        self.last_now = self.last_now.max(now);
        self.declared = None;
        if room.is_empty() || buf.len() < ETH_LEN + self.cfg.mtu.max(TORUS_LEN) {
            return None;
        }
        if let Some(t) = self.poll_announce(room, paths, buf) {
            return Some(t);
        }
        if let Some(t) = self.poll_urgent(now, room, paths, buf, keep) {
            return Some(t);
        }
        self.poll_data(now, room, paths, buf, keep)
    }

    /// Whether [`Transport::poll_transmit`] might have a frame: a restart to announce, a
    /// peer with an ACK, NACK, handshake or retransmission to send, or a message queued.
    /// `false` means it has none, so a driver need not find it a buffer and a link to ask;
    /// `true` may still come to nothing (no room, a closed window). A round trip's answer
    /// leaves without that last fruitless call before its kick.
    #[inline]
    pub fn may_transmit(&self) -> bool {
        !(self.announce.is_empty() && self.urgent.is_empty() && self.queues.is_empty())
    }

    /// Where the frame built by the last `poll_transmit` call stops being written, and the
    /// value its bytes from there to its end have ([`Config::declare_tails`]; `None`: every
    /// byte written).
    pub fn take_declared_tail(&mut self) -> Option<(usize, u8)> {
        self.declared.take()
    }

    /// Moves the handles of the driver's buffers the transport no longer keeps (their frames
    /// were acknowledged, or their connection reset) into `out`: the driver may reuse them.
    pub fn take_released(&mut self, out: &mut Vec<u32>) {
        self.pool.take_released(out);
    }

    pub(super) fn poll_urgent(
        &mut self,
        now: Time,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Option<Transmit> {
        for _ in 0..self.urgent.len() {
            let peer = self.urgent.pop_front()?;
            let Some(c) = self.conns.get_mut(&peer) else {
                continue;
            };
            let usable = paths.links_to(peer).and(room);
            let established = c.life.established();
            let piggyback_soon = c.queued > 0 && c.send.can_send(false) && !c.recv.ack_overdue(now);
            let sync = c.life.sync_due(now);
            let nack = established && c.recv.nack_due(now);
            let ack =
                established && (c.recv.ack_due(now) || c.pace.window_update) && !piggyback_soon;
            if !c.send.has_retransmit() && !nack && !ack && !sync {
                c.urgent = false;
                continue;
            }
            let Some(link) = c.next_link(usable) else {
                self.urgent.push_back(peer);
                continue;
            };
            let local = self.local;
            grant(&self.pacing, &mut self.starved, c);
            let t = if sync {
                let len = frame::build_sync_frame(local, peer, c, self.cfg.incarnation, buf)?;
                c.life.on_sync_sent(now);
                self.stats.sync_frames += 1;
                Transmit {
                    kept: false,
                    link,
                    len,
                    kind: TxKind::Sync,
                    messages: 0,
                    service: None,
                }
            } else if let Some(n) = frame::copy_retransmit(now, c, keep, buf) {
                let len = frame::mark_retransmit(c, n, buf);
                self.stats.retransmitted_frames += 1;
                Transmit {
                    kept: false,
                    link,
                    len,
                    kind: TxKind::Retransmit,
                    messages: 0,
                    service: None,
                }
            } else {
                let len = frame::build_ack_frame(local, peer, c, nack, buf)?;
                // It told the peer the load its frames met.
                c.tele.take_echo();
                if nack {
                    c.recv.on_nack_sent(now);
                    self.stats.nack_frames += 1;
                } else {
                    c.recv.on_ack_sent();
                    self.stats.ack_frames += 1;
                }
                Transmit {
                    kept: false,
                    link,
                    len,
                    kind: if nack { TxKind::Nack } else { TxKind::Ack },
                    messages: 0,
                    service: None,
                }
            };
            let still = c.send.has_retransmit()
                || c.life.sync_due(now)
                || (c.life.established()
                    && (c.recv.nack_due(now) || c.recv.ack_due(now) || c.pace.window_update));
            if still {
                self.urgent.push_back(peer);
            } else {
                c.urgent = false;
            }
            schedule(&mut self.deadlines, c);
            return Some(t);
        }
        None
    }

    pub(super) fn poll_data(
        &mut self,
        now: Time,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Option<Transmit> {
        let n = self.queues.services();
        let start = self.queues.order().next().unwrap_or(0);
        for k in 0..n {
            let qi = (start + k) % n.max(1);
            let Some(head) = self.queues.queue(qi).head().copied() else {
                continue;
            };
            let from = self.queues.queue(qi).service;
            let usable = paths.links_for(head.dest, from).and(room);
            if usable.is_empty() {
                continue;
            }
            if !self.cfg.agg_delay.is_zero()
                && self.cfg.aggregate
                && now < head.enqueued + self.cfg.agg_delay
                && !frame_would_fill(self.queues.queue(qi), &self.cfg)
            {
                continue;
            }
            let t = if head.reliable {
                let Some(conn) = self.conns.get_mut(&head.dest) else {
                    continue;
                };
                let small = MSG_HEADER_LEN + head.len as usize <= SMALL_FRAME;
                if !(conn.life.established() && conn.send.can_send(small)) {
                    continue;
                }
                let link = conn.next_link(usable)?;
                grant(&self.pacing, &mut self.starved, conn);
                conn.cc.set_weight(self.queues.queue(qi).weight());
                let t = build_data_frame(
                    self.local,
                    &self.cfg,
                    now,
                    conn,
                    self.queues.queue_mut(qi),
                    link,
                    buf,
                    &mut self.stats,
                    &mut self.pool,
                    keep.and_then(|k| k.handle),
                );
                schedule(&mut self.deadlines, conn);
                t
            } else {
                let link = self.short_stripe.next(usable)?;
                build_short_frame(
                    self.local,
                    &self.cfg,
                    self.queues.queue_mut(qi),
                    link,
                    buf,
                    &mut self.stats,
                    &mut self.declared,
                )
            };
            self.queues.used_turn(qi);
            return Some(t);
        }
        None
    }
}

/// Whether the run of messages at the queue's head that could share one frame fills it.
pub(super) fn frame_would_fill(q: &fair_queue::ServiceQueue, cfg: &Config) -> bool {
    let Some(h) = q.head() else {
        return false;
    };
    if q.head_progress().sent != 0 {
        // A message going out in fragments: never aggregated.
        return false;
    }
    let room = cfg.max_payload();
    let mut used = 0usize;
    for m in q.iter() {
        if m.dest != h.dest || m.reliable != h.reliable {
            break;
        }
        used += MSG_HEADER_LEN + m.len as usize;
        if used >= room {
            return true;
        }
    }
    false
}

/// Writes the piggybacked acknowledgement of `c` into a frame in `buf` and notes it sent.
pub(super) fn refresh_ack(buf: &mut [u8], c: &mut Connection) {
    let mut fl = u16::from_be_bytes([buf[wire::offset::FLAGS], buf[wire::offset::FLAGS + 1]]);
    fl |= flags::ACK_VALID | flags::SACK_VALID;
    buf[wire::offset::FLAGS..wire::offset::FLAGS + 2].copy_from_slice(&fl.to_be_bytes());
    let ack = seqnum::truncate(c.recv.cum_ack());
    buf[wire::offset::ACK..wire::offset::ACK + 4].copy_from_slice(&ack.to_be_bytes());
    buf[wire::offset::SACK..wire::offset::SACK + 8]
        .copy_from_slice(&c.recv.sack_bits().to_be_bytes());
    buf[wire::offset::RWND..wire::offset::RWND + 2].copy_from_slice(&c.pace.granted.to_be_bytes());
    buf[wire::offset::CONG_ECHO] = c.tele.take_echo();
    c.recv.on_ack_sent();
}

/// Sets the receive window `c` is granted in the next frame to it (receiver pacing); a
/// small grant puts the peer on the list of those told at once when room returns.
pub(super) fn grant(p: &RxPacing, starved: &mut Vec<Coord>, c: &mut Connection) {
    let g = p.grant();
    c.pace.granted = g;
    c.pace.window_update = false;
    if p.is_small(g) && !c.pace.starved {
        c.pace.starved = true;
        starved.push(c.peer);
    }
}
