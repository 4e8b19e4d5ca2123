//! Network in: frames addressed to this server, through the handshake, acknowledgements,
//! delivery gates and notices.

use super::*;

/// What the receiver learnt checking an aggregated frame's messages.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    /// How many messages the frame carries (0 when not aggregated).
    messages: u32,
    /// None of them is fenced or for a service with a placer: they may be released as a
    /// whole when they are next in order.
    plain: bool,
}

/// Where a connection's delivery gate releases messages: to the service's placer when it
/// has one (in delivery order, so a placer never sees a message before one a fence put ahead
/// of it), else into the inbox, copied once from the frame.
///
/// A message for a service this server does not host, or whose queue is full, is not
/// delivered: it is listed in `refused` for a notice to its sender. A notice from the peer
/// is listed in `notices`.
pub(super) struct Deliver<'a> {
    now: Time,
    src: Coord,
    placers: &'a mut Placers,
    inbox: &'a mut Inbox,
    delivered: &'a mut u64,
    hosted: Option<&'a HostedServices>,
    refused: &'a mut Vec<(u16, u64, FailReason)>,
    notices: &'a mut Vec<(u16, u64, FailReason)>,
    bad_notices: &'a mut u64,
    key_gate: Option<&'a mut (dyn KeyGate + 'static)>,
}

impl Release for Deliver<'_> {
    fn release(&mut self, msn: u64, service: u16, data: &[u8]) {
        if service == NOTICES {
            match notice::decode(data) {
                Some((reason, entries)) => self
                    .notices
                    .extend(entries.map(|(s, msn)| (s, msn, reason))),
                None => *self.bad_notices += 1,
            }
            return;
        }
        if service == KEYED {
            if let Some(Err(reason)) = self.key_gate.as_mut().map(|g| g.admit(self.src, data)) {
                self.refused.push((service, msn, reason));
                return;
            }
        }
        if let Some(reason) = self.hosted.and_then(|h| h.refusal(service)) {
            self.refused.push((service, msn, reason));
            return;
        }
        *self.delivered += 1;
        match self.placers.get(service) {
            Some(p) => {
                if let Some(data) = p.place(self.now, self.src, data) {
                    self.inbox.push(TransportEvent::Message {
                        src: self.src,
                        service,
                        data,
                        reliable: true,
                    });
                }
            }
            None => self.inbox.push_message(self.src, service, data, true),
        }
    }
}

impl Transport {
    /// Handles a frame addressed to this server (Ethernet header included).
    pub fn handle_frame(&mut self, now: Time, frame: &[u8]) -> Result<(), RecvError> {
        self.stats.frames_received += 1;
        let r = self.handle_frame_inner(now, frame);
        if r.is_err() {
            self.stats.dropped_frames += 1;
        }
        r
    }

    /// Handles a frame addressed to this server that the caller has checked and parsed
    /// already (the engine does, to route it): the same as [`Transport::handle_frame`]
    /// without parsing the header a second time.
    ///
    /// With `lend` set, a message that nothing is queued ahead of is not copied into the
    /// inbox: it is returned, borrowed from the frame, for the caller to hand on in its
    /// place (as the next event it would have polled). A short message is lent as the only
    /// one of its frame; a reliable one when it is whole in a plain frame, the next of its
    /// connection with no fence to wait for, and no placer, notice or refusal would take it
    /// (it counts as delivered, and its frame's acknowledgement may leave). Receiving a
    /// jumbo frame's message then costs no copy inside the engine. Without `lend`, the
    /// result is always `Ok(None)` or an error.
    pub fn handle_parsed<'f>(
        &mut self,
        now: Time,
        h: &Header,
        view: FrameView<'f>,
        lend: bool,
    ) -> Result<Option<Lent<'f>>, RecvError> {
        self.stats.frames_received += 1;
        let r = self.handle_view(now, *h, view, lend);
        if r.is_err() {
            self.stats.dropped_frames += 1;
        }
        r
    }

    pub(super) fn handle_frame_inner(&mut self, now: Time, frame: &[u8]) -> Result<(), RecvError> {
        let view = FrameView::new_checked(frame)?;
        let h = Header::parse(&view)?;
        self.handle_view(now, h, view, false).map(|_| ())
    }

    pub(super) fn handle_view<'f>(
        &mut self,
        now: Time,
        h: Header,
        view: FrameView<'f>,
        lend: bool,
    ) -> Result<Option<Lent<'f>>, RecvError> {
        self.check_addressed(&h)?;
        let batch = self.check_batch(&h, &view)?;
        if h.kind == Kind::Data && !h.has(flags::RELIABLE) {
            return Ok(self.receive_short(&h, view, batch, lend));
        }
        if h.kind == Kind::Sync && sync_payload(&view).is_some_and(|(_, f)| f & SYNC_ANNOUNCE != 0)
        {
            return self.handle_announce(&h, &view).map(|()| None);
        }
        // One lookup of the connection per frame: it is held to the end. (Not through
        // `entry`, which prepares an insertion every time and cost three lookups' worth.)
        let peers = self.conns.len();
        let conn = match self.conns.get_mut(&h.src) {
            Some(c) => c,
            None => {
                if peers >= self.cfg.max_peers {
                    return Err(RecvError::TooManyPeers);
                }
                self.conns
                    .entry(h.src)
                    .or_insert_with(|| make_conn(&mut self.rng, &self.cfg, h.src))
            }
        };
        if h.kind == Kind::Sync {
            return self.handle_sync(now, &h, &view).map(|()| None);
        }
        if !conn.life.accepts(h.conn, h.peer_conn) {
            // Sent to, or by, an instance that is gone: tell the peer who we are now.
            self.stats.stale_frames += 1;
            conn.life.want_sync(now);
            conn.enlist(&mut self.urgent);
            schedule(&mut self.deadlines, conn);
            return Err(RecvError::Stale);
        }
        if h.has(flags::ACK_VALID) {
            let reports = AckReports {
                notify: &self.notify,
                acked: &mut self.acked,
                events: &mut self.events,
            };
            take_ack(now, &h, conn, &mut self.pool, reports);
        }
        let mut result = Ok(());
        let mut lent = None;
        if h.kind == Kind::Data {
            conn.pace.last_data = Some(now);
            conn.tele.on_frame(h.cong);
            if h.has(flags::ACK_NOW) {
                conn.recv.ack_at_once();
            }
            let before = conn.recv.cum_ack();
            match conn.recv.on_frame(now, h.seq, h.has(flags::RETRANSMIT)) {
                Arrival::New => {
                    if conn.recv.cum_ack() == before {
                        self.stats.out_of_order_frames += 1;
                    }
                    // Lent when nothing is queued ahead of it and nothing would take it
                    // apart from an application's inbox (a placer, a notice, a refusal);
                    // `lone_in_order` goes last, for it marks the message delivered.
                    let lends =
                        lend && nothing_takes_apart(
                            &self.events,
                            &self.placers,
                            self.hosted.as_deref(),
                            &h,
                        ) && lone_in_order(conn, &h);
                    if lends {
                        self.stats.messages_delivered += 1;
                        lent = Some(Lent {
                            src: h.src,
                            service: h.service,
                            data: view.payload(),
                            reliable: true,
                        });
                    } else {
                        let mut sink = Deliver {
                            now,
                            src: h.src,
                            placers: &mut self.placers,
                            inbox: &mut self.events,
                            delivered: &mut self.stats.messages_delivered,
                            hosted: self.hosted.as_deref(),
                            refused: &mut self.refused,
                            notices: &mut self.notices,
                            bad_notices: &mut self.stats.notices_unmatched,
                            key_gate: self.key_gate.as_deref_mut(),
                        };
                        result = Self::deliver_reliable(conn, &h, &view, batch, &mut sink);
                    }
                }
                Arrival::Duplicate => self.stats.duplicate_frames += 1,
                Arrival::OutOfWindow => result = Err(RecvError::OutOfWindow),
            }
        }
        // The peer refused messages of ours: the services that sent them learn which, below.
        // (A notice names the service a message was for; the number alone finds it.)
        if !self.notices.is_empty() {
            match_notices(
                conn,
                &mut self.notices,
                &mut self.refused_by_peer,
                &mut self.stats,
            );
        }
        if conn.send.has_retransmit() || conn.recv.ack_due(now) || conn.recv.nack_due(now) {
            conn.enlist(&mut self.urgent);
        }
        schedule(&mut self.deadlines, conn);
        if !(self.refused.is_empty() && self.refused_by_peer.is_empty()) {
            self.settle_refusals(now, h.src);
        }
        result.map(|()| lent)
    }

    /// Checks that the frame is for this server, from another one, and of a transport's
    /// kind (control frames are the control process's).
    #[inline(always)]
    fn check_addressed(&self, h: &Header) -> Result<(), RecvError> {
        if h.dst != Dest::Server(self.local) {
            return Err(RecvError::NotForUs);
        }
        if h.src == self.local {
            return Err(RecvError::FromSelf);
        }
        if h.kind == Kind::Control {
            return Err(RecvError::UnexpectedKind);
        }
        Ok(())
    }

    /// Checks an aggregated frame's messages before anything is taken from it (a frame is
    /// accepted, and acknowledged, whole or not at all, so a bad message is never
    /// half-delivered), and says how many it carries and whether they are plain.
    #[inline(always)]
    fn check_batch(&mut self, h: &Header, view: &FrameView<'_>) -> Result<Batch, RecvError> {
        let aggregated = h.has(flags::AGGREGATED);
        let mut batch = Batch {
            messages: 0,
            plain: true,
        };
        if aggregated {
            if self.placers.0.is_empty() && self.hosted.is_none() {
                // Messages to the reserved ids (notices, key messages) are taken one at a time.
                let (count, union, notices) = wire::check_messages(view.payload(), KEYED)?;
                batch.messages = count;
                batch.plain =
                    union & (msg_flags::BWD_FENCE | msg_flags::FWD_FENCE) == 0 && !notices;
            } else {
                // A message with a placer, for a service not hosted, or a notice is taken
                // one at a time.
                let hosted = self.hosted.as_deref();
                for m in view.messages() {
                    let m = m?;
                    batch.messages += 1;
                    if m.flags & (msg_flags::BWD_FENCE | msg_flags::FWD_FENCE) != 0
                        || m.service >= KEYED
                        || hosted.is_some_and(|h| !h.takes(m.service))
                        || self.placers.get(m.service).is_some()
                    {
                        batch.plain = false;
                    }
                }
            }
            if batch.messages == 0 {
                return Err(RecvError::Wire(WireError::MessageOverrun { at: 0, len: 0 }));
            }
        }
        Ok(batch)
    }

    /// A short (unreliable) frame: its one message lent when asked and nothing is queued
    /// ahead of it, else its messages queued for the application.
    #[inline(always)]
    fn receive_short<'f>(
        &mut self,
        h: &Header,
        view: FrameView<'f>,
        batch: Batch,
        lend: bool,
    ) -> Option<Lent<'f>> {
        if lend && self.events.is_empty() {
            // One message (alone, or the only one of an aggregated frame) is lent.
            let one = if h.has(flags::AGGREGATED) {
                (batch.messages == 1)
                    .then(|| view.messages().next())
                    .flatten()
                    .and_then(Result::ok)
                    .map(|m| (m.service, m.data))
            } else {
                Some((h.service, view.payload()))
            };
            if let Some((service, data)) = one {
                self.stats.messages_delivered += 1;
                return Some(Lent {
                    src: h.src,
                    service,
                    data,
                    reliable: false,
                });
            }
        }
        self.deliver_short(h, &view, batch);
        None
    }

    /// After a frame from `peer`: reports the messages of ours its notices named, and tells
    /// it which of its messages this server refused (no service takes them, or its queue is
    /// full), one notice per reason. A notice that cannot be queued (the queue is full, the
    /// peer unreachable) is counted in `notices_unmatched`: the peer's messages were refused
    /// all the same.
    #[cold]
    pub(super) fn settle_refusals(&mut self, now: Time, peer: Coord) {
        if !self.refused_by_peer.is_empty() {
            let failed = std::mem::take(&mut self.refused_by_peer);
            for reason in notice::REASONS {
                let these = notice::of_reason(&failed, reason);
                if !these.is_empty() {
                    self.report_failed(peer, these, reason);
                }
            }
        }
        let refused = std::mem::take(&mut self.refused);
        let mut buf = std::mem::take(&mut self.notice_buf);
        for reason in notice::REASONS {
            let these = notice::of_reason(&refused, reason);
            match reason {
                FailReason::ReceiverFull => self.stats.refused_full += these.len() as u64,
                _ => self.stats.refused_no_service += these.len() as u64,
            }
            self.send_notices(now, peer, reason, &these, &mut buf);
        }
        self.notice_buf = buf;
        self.refused = refused;
        self.refused.clear();
    }

    /// Queues notices naming `refused` (all for `reason`) to `peer`.
    pub(super) fn send_notices(
        &mut self,
        now: Time,
        peer: Coord,
        reason: FailReason,
        refused: &[(u16, u64)],
        buf: &mut Vec<u8>,
    ) {
        for chunk in refused.chunks(notice::MAX_ENTRIES) {
            notice::encode(reason, chunk, buf);
            let m = Outgoing {
                dest: peer,
                service: NOTICES,
                from: NOTICES,
                data: buf,
                reliable: true,
                fences: Fences::default(),
                tag: 0,
            };
            if self.send_hinted(now, m, None).is_err() {
                self.stats.notices_unmatched += chunk.len() as u64;
            }
        }
    }

    /// A SYNC from the peer: learn its instance, reset when it changed, answer when it does
    /// not know ours.
    pub(super) fn handle_sync(
        &mut self,
        now: Time,
        h: &Header,
        view: &FrameView<'_>,
    ) -> Result<(), RecvError> {
        let Some((inc, _)) = sync_payload(view) else {
            return Err(RecvError::BadSync);
        };
        let Some(conn) = self.conns.get_mut(&h.src) else {
            return Err(RecvError::TooManyPeers);
        };
        match conn.life.on_sync(now, h.conn, h.peer_conn, inc) {
            SyncOutcome::Stale => {
                self.stats.stale_frames += 1;
                return Err(RecvError::Stale);
            }
            SyncOutcome::Reset(reason) => self.reset_conn(h.src, reason),
            SyncOutcome::Known | SyncOutcome::Adopted => {}
        }
        if let Some(conn) = self.conns.get_mut(&h.src) {
            conn.send.on_sync_window(h.rwnd);
            let waiting = waits(conn);
            conn.life.set_waiting(now, waiting, true);
            if conn.life.sync_due(now) {
                self.mark_urgent(h.src);
            }
        }
        self.note(h.src);
        Ok(())
    }

    /// A peer announced its (re)start: a connection with an older incarnation of it is reset
    /// at once (its messages reported failed) instead of when it next talks to the new one.
    /// Peers without a connection keep no state for it.
    pub(super) fn handle_announce(
        &mut self,
        h: &Header,
        view: &FrameView<'_>,
    ) -> Result<(), RecvError> {
        let Some((inc, _)) = sync_payload(view) else {
            return Err(RecvError::BadSync);
        };
        let Some(conn) = self.conns.get_mut(&h.src) else {
            return Ok(());
        };
        if let Some(reason) = conn.life.on_announce(inc) {
            self.reset_conn(h.src, reason);
        }
        Ok(())
    }

    /// Announces this (re)started dataplane to `peers` (one SYNC frame each, best effort),
    /// so that peers holding a connection with an earlier incarnation reset it now: the
    /// first messages they send after the restart then reach the new instance instead of
    /// failing against the old one.
    pub fn announce(&mut self, peers: impl IntoIterator<Item = Coord>) {
        let local = self.local;
        self.announce
            .extend(peers.into_iter().filter(|p| *p != local));
    }

    pub(super) fn poll_announce(
        &mut self,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        for _ in 0..self.announce.len() {
            let peer = self.announce.pop_front()?;
            let usable = paths.links_to(peer);
            if usable.is_empty() {
                // Unreachable now: it will learn of the restart from the handshake.
                continue;
            }
            let Some(link) = usable.and(room).iter().next() else {
                self.announce.push_back(peer);
                continue;
            };
            let mut h = Header::new(Kind::Sync, self.local, Dest::Server(peer));
            h.payload_len = SYNC_PAYLOAD as u16;
            h.emit(buf).ok()?;
            buf[HEADERS_LEN..HEADERS_LEN + 8].copy_from_slice(&self.cfg.incarnation.to_be_bytes());
            buf[HEADERS_LEN + 8] = SYNC_ANNOUNCE;
            self.stats.sync_frames += 1;
            return Some(Transmit {
                kept: false,
                link,
                len: HEADERS_LEN + SYNC_PAYLOAD,
                kind: TxKind::Sync,
                messages: 0,
                service: None,
            });
        }
        None
    }

    pub(super) fn deliver_short(&mut self, h: &Header, view: &FrameView<'_>, batch: Batch) {
        if h.has(flags::AGGREGATED) {
            self.stats.messages_delivered += u64::from(batch.messages);
            self.events.push_batch(h.src, view.payload(), false);
        } else {
            self.stats.messages_delivered += 1;
            self.events
                .push_message(h.src, h.service, view.payload(), false);
        }
    }

    /// Offers a reliable data frame's messages to the connection's delivery gate, which
    /// releases into `sink` what its fences allow.
    pub(super) fn deliver_reliable(
        conn: &mut Connection,
        h: &Header,
        view: &FrameView<'_>,
        batch: Batch,
        sink: &mut Deliver<'_>,
    ) -> Result<(), RecvError> {
        let base = seqnum::expand(h.msn, conn.delivery.base());
        let frame_wait =
            (h.fence != 0 && u64::from(h.fence) <= base).then(|| base - u64::from(h.fence));
        if h.has(flags::AGGREGATED)
            && batch.plain
            && frame_wait.is_none_or(|j| j < base)
            && conn.delivery.can_release_run(base)
        {
            // The next messages in order, none fenced or placed: released together, the
            // payload copied once (the common case of a stream of small messages).
            conn.delivery.release_run(base, u64::from(batch.messages));
            *sink.delivered += u64::from(batch.messages);
            sink.inbox.push_batch(sink.src, view.payload(), true);
            return Ok(());
        }
        if h.has(flags::AGGREGATED) {
            let mut wait_for = frame_wait;
            for (k, m) in view.messages().flatten().enumerate() {
                let msn = base + k as u64;
                let fences = Fences {
                    backward: m.flags & msg_flags::BWD_FENCE != 0,
                    forward: m.flags & msg_flags::FWD_FENCE != 0,
                };
                conn.delivery
                    .offer(msn, m.service, m.data, fences, wait_for, sink);
                if fences.forward {
                    wait_for = Some(msn);
                }
            }
            return Ok(());
        }
        let fences = Fences {
            backward: h.has(flags::BWD_FENCE),
            forward: h.has(flags::FWD_FENCE),
        };
        let (first, last) = (h.has(flags::FRAG_FIRST), h.has(flags::FRAG_LAST));
        if first && last && h.frag == 0 {
            conn.delivery
                .offer(base, h.service, view.payload(), fences, frame_wait, sink);
            Ok(())
        } else {
            conn.delivery
                .offer_fragment(
                    base,
                    h.frag,
                    last,
                    h.service,
                    view.payload(),
                    fences,
                    frame_wait,
                    sink,
                )
                .map_err(RecvError::from)
        }
    }
}

/// Where the reports of acknowledged messages go: the services that asked for them
/// (`notify`), through a reused list of acknowledged runs, into the inbox.
pub(super) struct AckReports<'a> {
    pub notify: &'a rustc_hash::FxHashSet<u16>,
    pub acked: &'a mut Vec<AckedRun>,
    pub events: &'a mut Inbox,
}

/// Takes the cumulative and selective ACK (or NACK) and the window a frame from the peer
/// of `conn` carries: frames acknowledged are retired (their buffers back to `pool`), and
/// the services that asked learn which of their messages were acknowledged.
#[inline(always)]
pub(super) fn take_ack(
    now: Time,
    h: &Header,
    conn: &mut Connection,
    pool: &mut pool::BufferPool,
    reports: AckReports<'_>,
) {
    let sack = h.has(flags::SACK_VALID).then_some(h.sack);
    let retired = conn
        .send
        .on_ack(now, h.ack, sack, h.kind == Kind::Nack, pool)
        .unwrap_or(0);
    conn.send.on_window(h.ack, h.rwnd);
    if retired > 0 {
        let (una, next) = (conn.send.una(), conn.send.next_seq());
        let srtt = conn.send.srtt().map(|d| d.as_nanos() as u64);
        let w = conn.cc.on_ack(now, h.cong_echo, una, next, srtt);
        conn.send.set_cwnd(w);
        conn.life.set_waiting(now, waits(conn), true);
        let mut acked = std::mem::take(reports.acked);
        acked.clear();
        conn.sent.on_acked(conn.send.una(), &mut acked);
        for r in &acked {
            if reports.notify.contains(&r.service) {
                reports.events.push(TransportEvent::Acked {
                    peer: h.src,
                    service: r.service,
                    count: r.count,
                    last_tag: r.last_tag,
                });
            }
        }
        *reports.acked = acked;
    }
}

/// Whether a connection waits for its peer: frames unacknowledged, or messages held for the
/// handshake.
pub(super) fn waits(c: &Connection) -> bool {
    c.send.in_flight() > 0 || (c.queued > 0 && !c.life.established())
}

/// Whether the reliable frame `h` holds one whole message that is the next of its
/// connection, with no fence to wait for and nothing held or delivered out of order: then
/// it is marked delivered here, and the caller hands it out as it is (lent from the frame).
/// Whether a message of `h`'s service may skip the inbox: nothing is queued ahead of it,
/// and no placer, notice or refusal would take it apart from its frame.
#[inline(always)]
fn nothing_takes_apart(
    events: &Inbox,
    placers: &Placers,
    hosted: Option<&HostedServices>,
    h: &Header,
) -> bool {
    events.is_empty()
        && h.service < KEYED
        && !placers.has(h.service)
        && hosted.and_then(|x| x.refusal(h.service)).is_none()
}

/// Finds the messages of ours that the peer's notices name (by message number) and lists
/// them, with their service and tag, in `refused_by_peer` for their senders' reports.
fn match_notices(
    conn: &Connection,
    notices: &mut Vec<(u16, u64, FailReason)>,
    refused_by_peer: &mut Vec<(u16, u64, FailReason)>,
    stats: &mut Stats,
) {
    for (_, msn, why) in notices.drain(..) {
        stats.refused_by_peers += 1;
        match conn.sent.tag_of(msn) {
            Some((service, tag)) => refused_by_peer.push((service, tag, why)),
            None => stats.notices_unmatched += 1,
        }
    }
}

pub(super) fn lone_in_order(conn: &mut Connection, h: &Header) -> bool {
    if h.has(flags::AGGREGATED)
        || !h.has(flags::FRAG_FIRST)
        || !h.has(flags::FRAG_LAST)
        || h.frag != 0
    {
        return false;
    }
    let base = seqnum::expand(h.msn, conn.delivery.base());
    let frame_wait =
        (h.fence != 0 && u64::from(h.fence) <= base).then(|| base - u64::from(h.fence));
    if frame_wait.is_none_or(|j| j < base) && conn.delivery.can_release_run(base) {
        conn.delivery.release_run(base, 1);
        return true;
    }
    false
}
